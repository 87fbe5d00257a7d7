"""Channels-last (NHWC) form of a graph, for backends whose convolutions want the channels innermost
(Backend.conv_layout).

ONNX convolutions and pools are NCHW. Tensor cores want NHWC: an implicit GEMM then reads BLOCK_K
contiguous channels of each pixel, and cuDNN runs its NHWC kernels without transposing around each
conv (0.45 ms of ResNet-50's 5.15 ms on the H200 in the 2026-12-03 profile). `channels_last`
rewrites each connected stretch of layout-sensitive ops (Conv, pools, BatchNormalization, GroupNormalization,
Resize) and the
elementwise ops and channel Concats between them into NHWC, with one Transpose where the stretch
meets the rest:

  x -> Conv -> BN -> Relu -> MaxPool -> ... -> GlobalAveragePool -> Flatten
  x -> Transpose -> NhwcConv -> NhwcBatchNormalization -> Relu -> NhwcMaxPool -> ...
    -> NhwcGlobalAveragePool -> Transpose -> Flatten

The NHWC ops live in LAYOUT_DOMAIN with their ONNX op's attributes. Their data input and output
are NHWC and a conv weight is OHWI (a constant weight is transposed here once). The executor and
the GPU glue run each as its ONNX op on transposed views (`nchw_node`, PERMUTED_INPUTS), so the
reference semantics stay ONNX's own. Only stretches with a Conv are rewritten: for pools or
elementwise ops alone the boundary Transposes would cost more than the layout gains.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .ir import Graph, Node, TensorSpec, connected_groups
from .tasks import FLOAT_DTYPES

LAYOUT_DOMAIN = "ai.portkern"
TO_NHWC = (0, 2, 3, 1)  # NCHW -> NHWC, and OIHW -> OHWI
TO_NCHW = (0, 3, 1, 2)  # NHWC -> NCHW, and OHWI -> OIHW

NHWC_OPS = {"Conv": "NhwcConv", "MaxPool": "NhwcMaxPool", "AveragePool": "NhwcAveragePool",
            "GlobalAveragePool": "NhwcGlobalAveragePool", "GlobalMaxPool": "NhwcGlobalMaxPool",
            "BatchNormalization": "NhwcBatchNormalization", "GroupNormalization": "NhwcGroupNormalization",
            "Resize": "NhwcResize"}
ONNX_OF = {nhwc: onnx for onnx, nhwc in NHWC_OPS.items()}
# the inputs of each layout op that are in NHWC (OHWI for the weight); the others (bias, BN's
# per-channel parameters) are laid out as in ONNX
PERMUTED_INPUTS = {"NhwcConv": (0, 1)} | {op: (0,) for op in ONNX_OF if op != "NhwcConv"}

# ops that compute each element from the same element of every operand, so they commute with
# transposing all of their operands (a constant operand is transposed along with them)
ELEMENTWISE = frozenset({
    "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Sin", "Cos", "Tanh", "Erf", "Relu", "Sigmoid",
    "Floor", "Ceil", "Sign", "Round", "Identity", "Cast", "LeakyRelu", "Elu", "Selu", "Celu",
    "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Gelu", "Mish", "ThresholdedRelu", "Clip",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "PRelu", "Where",
})


def is_channels_last(node: Node) -> bool:
    return node.domain == LAYOUT_DOMAIN and node.op_type in ONNX_OF


def nchw_node(node: Node) -> Node:
    """The ONNX op an NHWC op is, for inputs permuted by TO_NCHW at PERMUTED_INPUTS[node.op_type]."""
    return Node(node.name, ONNX_OF[node.op_type], node.inputs, node.outputs, node.attrs, "")


def run_as_nchw(node: Node, inputs: Sequence[Any], run_onnx: Callable[[Node, list[Any]], Sequence[Any]],
                permute: Callable[[Any, tuple[int, ...]], Any]) -> list[Any]:
    """An NHWC op run as its ONNX op: the executor (numpy) and the GPU glue (torch) both run it so,
    each with its own `run_onnx(onnx_node, inputs)` and `permute(array, perm)` (views in both)."""
    permuted = PERMUTED_INPUTS[node.op_type]
    args = [permute(x, TO_NCHW) if index in permuted and x is not None else x for index, x in enumerate(inputs)]
    return [permute(run_onnx(nchw_node(node), args)[0], TO_NHWC)]


def channels_last(graph: Graph) -> Graph:
    """The graph with every stretch that holds a convolution in NHWC (module docstring); the graph
    itself where there is none. Inputs, outputs and every value outside the stretches keep their
    names and layouts, so a runtime and the whole-model check see the same model."""
    chosen = _stretches_with_a_conv(graph)
    return _rewrite(graph, chosen) if chosen else graph


def conv1d_as_2d(graph: Graph) -> Graph:
    """Every 1-D Conv as a 2-D one over a unit-height view, the same arithmetic: x (N, C, L) is
    unsqueezed to (N, C, 1, L), the weight to (O, C/g, 1, K) (a constant reshaped once), the
    kernel, strides, dilations and pads gain a unit (or zero) height. The elementwise ops that read
    only the conv's output and scalars (the GELU after each of Whisper's convs) follow it in 4-D, so a
    conv task can fuse them, and a value is squeezed back under its own name only where something
    other than another such conv reads it. Every backend's conv2d kernels then serve the 1-D
    convolutions of audio models (Whisper's, wav2vec2's and HuBERT's feature extractors). The graph
    itself where there is no 1-D Conv."""
    convs = {id(node) for node in graph.nodes if _is_conv1d(graph, node)}
    if not convs:
        return graph
    consumers = graph.consumers()
    position = {id(node): index for index, node in enumerate(graph.nodes)}
    nodes: list[Node] = []
    values = dict(graph.values)
    constants = dict(graph.constants)
    axes_attrs: dict[str, Any] = {"axes": [2]} if graph.opset < 13 else {}  # an input from opset 13
    axes = [] if axes_attrs else ["::unit_height_axis"]
    if axes:
        constants[axes[0]] = np.array([2], np.int64)
        values[axes[0]] = TensorSpec((1,), "int64")
    as_2d: dict[str, str] = {}  # a 3-D value -> its unit-height view
    moved: set[int] = set()  # elementwise nodes already emitted in 4-D after their conv

    def view(name: str) -> str:
        """The name of the (A, B, 1, L) view of a 3-D value, declared with its spec."""
        spec = graph.values[name]
        new = as_2d[name] = f"{name}::2d"
        values[new] = TensorSpec((*spec.shape[:2], 1, spec.shape[2]), spec.dtype)
        return new

    def unit_height(name: str) -> str:
        """The (A, B, 1, L) view of a 3-D value: a constant reshaped, else one Unsqueeze where
        it is first read."""
        if name not in as_2d:
            new = view(name)
            if name in graph.constants:
                constants[new] = graph.constants[name][:, :, None, :]
            else:
                nodes.append(Node(f"{name}::unsqueeze", "Unsqueeze", [name, *axes], [new], dict(axes_attrs)))
        return as_2d[name]

    def is_scalar(name: str) -> bool:
        return name in graph.constants and graph.constants[name].size == 1

    for node in graph.nodes:
        if id(node) in moved:
            continue
        if id(node) not in convs:
            nodes.append(node)
            continue
        x, w, *rest = node.inputs
        lifted = [unit_height(x), unit_height(w)]
        out = node.outputs[0]
        attrs = dict(node.attrs)
        for key in ("kernel_shape", "strides", "dilations"):
            if key in attrs:
                attrs[key] = [1, *attrs[key]]
        if "pads" in attrs:
            begin, end = attrs["pads"]
            attrs["pads"] = [0, begin, 0, end]
        nodes.append(replace(node, inputs=[*lifted, *rest], outputs=[view(out)], attrs=attrs))
        made = [out]
        for user in _unit_height_region(out, consumers, position, is_scalar, moved):
            moved.add(id(user))
            nodes.append(replace(user, inputs=[as_2d.get(name, name) for name in user.inputs],
                                 outputs=[view(user.outputs[0])]))
            made.append(user.outputs[0])
        for name in made:  # back to 3-D where a reader outside needs it
            readers = [user for user in consumers.get(name, []) if id(user) not in moved
                       and not (id(user) in convs and name in user.inputs[:2])]
            if readers or name in graph.outputs:
                nodes.append(Node(f"{name}::squeeze", "Squeeze", [as_2d[name], *axes], [name], dict(axes_attrs)))
    return with_nodes(graph, nodes, values, constants)


def _unit_height_region(value: str, consumers: Mapping[str, list[Node]], position: Mapping[int, int],
                        is_scalar: Callable[[str], bool], taken: set[int]) -> list[Node]:
    """The elementwise nodes, in graph order, that read only `value`, each other's outputs and
    scalars: they compute the same on its unit-height view."""
    region: list[Node] = []
    available = {value}
    while True:
        inside = taken | {id(node) for node in region}
        candidates = [user for name in available for user in consumers.get(name, [])
                      if user.op_type in ELEMENTWISE and user.domain in ("", "ai.onnx") and len(user.outputs) == 1
                      and id(user) not in inside
                      and all(name in available or is_scalar(name) for name in user.inputs if name)]
        if not candidates:
            return region
        step = min(candidates, key=lambda node: position[id(node)])
        region.append(step)
        available.add(step.outputs[0])


def _is_conv1d(graph: Graph, node: Node) -> bool:
    return node.op_type == "Conv" and node.domain in ("", "ai.onnx") and all(
        len(graph.values[name].shape) == 3 for name in node.inputs[:2])


def _is_float4d(graph: Graph, name: str) -> bool:
    spec = graph.values.get(name)
    return spec is not None and len(spec.shape) == 4 and spec.dtype in FLOAT_DTYPES


def _layout_inputs(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """Which inputs change layout when the node runs in NHWC, or None where it cannot."""
    if node.domain not in ("", "ai.onnx") or len([o for o in node.outputs if o]) != 1:
        return None
    out = node.outputs[0]
    if node.op_type in NHWC_OPS:
        x = node.inputs[0]
        if not (_is_float4d(graph, x) and _is_float4d(graph, out)):
            return None
        if node.op_type == "Conv":
            return (0, 1) if len(graph.values[node.inputs[1]].shape) == 4 else None
        if node.op_type == "BatchNormalization" and node.attrs.get("training_mode", 0):
            return None
        return (0,)
    if len(graph.values.get(out, TensorSpec((), "")).shape) != 4:
        return None
    if node.op_type == "Concat":  # the axis moves with the layout (SqueezeNet's fire modules)
        if not all(len(graph.values[name].shape) == 4 for name in node.inputs):
            return None
        return tuple(range(len(node.inputs)))
    if node.op_type not in ELEMENTWISE:
        return None
    for name in node.inputs:
        if not name:
            continue
        spec = graph.values[name]
        if name in graph.constants:
            if len(spec.shape) > 4:
                return None
        elif len(spec.shape) != 4:  # a 4-D operand broadcasts the same once both are permuted (squeeze-excite's
            return None            # (N, C, 1, 1) scale); one of lower rank would broadcast over other axes
    return tuple(index for index, name in enumerate(node.inputs) if name)


def _stretches_with_a_conv(graph: Graph) -> dict[int, tuple[int, ...]]:
    """The convertible nodes in connected stretches that hold a Conv, by id, with the inputs that
    change layout (union-find over runtime values that one convertible node makes and another
    reads)."""
    nodes = {id(node): node for node in graph.nodes}
    convertible = {key: permuted for key, node in nodes.items()
                   if (permuted := _layout_inputs(graph, node)) is not None}
    producer = graph.producer()
    group = connected_groups(convertible, [
        (id(source), key) for key, permuted in convertible.items() for index in permuted
        if (source := producer.get(nodes[key].inputs[index])) is not None and id(source) in convertible])
    with_conv = {group[key] for key in convertible if nodes[key].op_type == "Conv"}
    return {key: permuted for key, permuted in convertible.items() if group[key] in with_conv}


def _nhwc_constant(array: np.ndarray) -> np.ndarray | None:
    """A constant operand as broadcasting against NHWC; None where its layout does not matter."""
    padded = array.reshape((1,) * (4 - array.ndim) + array.shape)
    if all(size == 1 for size in padded.shape[1:]):
        return None
    return np.ascontiguousarray(padded.transpose(TO_NHWC))


def _rewrite(graph: Graph, chosen: dict[int, tuple[int, ...]]) -> Graph:
    """`chosen`: the nodes to convert, by id, with the inputs that change layout."""
    consumers = graph.consumers()
    nodes: list[Node] = []
    values = dict(graph.values)
    constants = dict(graph.constants)
    as_nhwc: dict[str, str] = {}  # NCHW name -> NHWC name, for runtime values and constants

    def nhwc_spec(name: str) -> TensorSpec:
        spec = graph.values[name]
        return TensorSpec(tuple(spec.shape[axis] for axis in TO_NHWC), spec.dtype)

    def operand(name: str) -> str:
        if name in as_nhwc:
            return as_nhwc[name]
        if name in graph.constants:
            array = _nhwc_constant(graph.constants[name])
            if array is None:
                return name
            new = f"{name}::nhwc"
            constants[new] = array
            values[new] = TensorSpec(tuple(array.shape), array.dtype.name)
        else:  # made outside the stretch: transposed once, where the stretch first reads it
            new = f"{name}::nhwc"
            nodes.append(Node(f"{name}::to_nhwc", "Transpose", [name], [new], {"perm": list(TO_NHWC)}))
            values[new] = nhwc_spec(name)
        as_nhwc[name] = new
        return new

    for node in graph.nodes:
        if id(node) not in chosen:
            nodes.append(node)
            continue
        inputs = [operand(name) if index in chosen[id(node)] else name for index, name in enumerate(node.inputs)]
        out = node.outputs[0]
        new_out = f"{out}::nhwc"
        values[new_out] = nhwc_spec(out)
        as_nhwc[out] = new_out
        if node.op_type in NHWC_OPS:
            nodes.append(replace(node, op_type=NHWC_OPS[node.op_type], inputs=inputs, outputs=[new_out],
                                 domain=LAYOUT_DOMAIN))
        elif node.op_type == "Concat":
            axis = TO_NHWC.index(int(node.attrs.get("axis", 0)) % 4)
            nodes.append(replace(node, inputs=inputs, outputs=[new_out], attrs={**node.attrs, "axis": axis}))
        else:
            nodes.append(replace(node, inputs=inputs, outputs=[new_out]))
        readers = [user for user in consumers.get(out, []) if id(user) not in chosen]
        if readers or out in graph.outputs:
            nodes.append(Node(f"{out}::to_nchw", "Transpose", [new_out], [out], {"perm": list(TO_NCHW)}))
    return with_nodes(graph, nodes, values, constants)


def with_nodes(graph: Graph, nodes: list[Node], values: Mapping[str, TensorSpec],
               constants: Mapping[str, np.ndarray]) -> Graph:
    """The graph rewritten to `nodes`, keeping the values and constants that they, its inputs or its
    outputs name (a rewrite's new values and constants among them, the ones it replaced dropped)."""
    used = {*graph.inputs, *graph.outputs, *(name for node in nodes for name in (*node.inputs, *node.outputs) if name)}
    return replace(graph, nodes=nodes, values={k: v for k, v in values.items() if k in used},
                   constants={k: v for k, v in constants.items() if k in used})
