"""ONNX import: a model file in, a Graph with every shape concrete and every constant folded out.

The steps, each with its own clear failure:
  read      file / bytes / ModelProto -> ModelProto (missing, not ONNX, truncated -> ModelError)
  check     default-domain opset 9..24; every op known to the executor (else UnsupportedOpError)
  bind      dynamic input dims from `shapes`; a dim_param bound once is bound everywhere it appears
            (so `--shape input_ids=32x128` also binds attention_mask's batch x sequence)
  infer     onnx.shape_inference (strict off, data propagation on) for the shapes it can give
  fold      one walk in topological order: a node whose inputs are all constants runs through
            the executor and becomes a constant; so does Shape/Size of a value whose shape is
            known. That removes the ConstantOfShape weights of the zoo models and the
            Shape->Gather->Unsqueeze->Concat->Reshape chains of exported transformers.
  shapes    a remaining node's output spec comes from ONNX inference when that is concrete, else
            from running the node once in the executor on zero inputs of the known shapes
            (constants with their real values), so every value ends up with a concrete spec.
            This is exact for every op whose output shape depends on shapes and constants only
            (all ops here except NonZero, whose count would be that of the zeros).
  copies    a node that hands its one input on unchanged (Identity, a Concat of one input, a Cast
            to the dtype it has) is dropped and its readers read the input (a graph output keeps
            its node): exporters leave them (GPT-NeoX concatenates its keys and values with an
            empty cache, which folding reduces to a Concat of one), and each would be a copy on
            the device.
Initializers that are also listed as graph inputs (old exporters do this) are treated as constants.
"""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from dataclasses import replace
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from .errors import ModelError, PortkernError, UnsupportedOpError
from .executor import SUPPORTED_OPS, run_nodes
from .ir import Graph, Node, TensorSpec

MIN_OPSET, MAX_OPSET = 9, 24
DEFAULT_DOMAINS = ("", "ai.onnx")
# ops whose output shape is a function of their inputs' shapes only: folded when those are known
SHAPE_ONLY_OPS = frozenset({"Shape", "Size"})
# ops whose output shape depends on input *values*: those inputs must be constants after folding
# (a Reshape target computed from data would leave the graph without concrete shapes)
VALUE_SHAPED_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "OneHot": (1,), "TopK": (1,), "Split": (1,),
    "Squeeze": (1,), "Unsqueeze": (1,), "Resize": (1, 2, 3), "Upsample": (1,),
    "CenterCropPad": (1,), "MaxUnpool": (2,), "Col2Im": (1, 2), "HannWindow": (0,),
    "HammingWindow": (0,), "BlackmanWindow": (0,), "ReduceSum": (1,), "ReduceMean": (1,),
    "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,),
    "ReduceLogSum": (1,), "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,),
    "NonZero": (0,), "Unique": (0,), "Compress": (1,),
}


def parse_shape_args(args: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`--shape name=1x128` arguments -> {name: (1, 128)}."""
    shapes: dict[str, tuple[int, ...]] = {}
    for arg in args:
        name, sep, dims = arg.rpartition("=")
        if not sep or not name or not re.fullmatch(r"[1-9][0-9]*(x[1-9][0-9]*)*", dims):
            raise PortkernError(
                f"bad --shape '{arg}': expected NAME=DIMS with positive dims joined by 'x', "
                "e.g. input_ids=1x128")
        if name in shapes:
            raise PortkernError(f"--shape given twice for input '{name}'")
        shapes[name] = tuple(int(d) for d in dims.split("x"))
    return shapes


def read_model(model: str | Path | bytes | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The parsed model and the sha256 of its bytes; every failure is one clear line."""
    if isinstance(model, onnx.ModelProto):
        return model, hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    source = "model bytes"
    base_dir: Path | None = None
    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise ModelError(f"model file not found: {path}")
        data, source, base_dir = path.read_bytes(), str(path), path.parent
    else:
        data = bytes(model)
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        reason = (str(exc).splitlines() or ["parse error"])[0]
        raise ModelError(f"{source} is not a readable ONNX model (corrupt or truncated: {reason})"
                         ) from exc
    if not proto.HasField("graph") or not proto.opset_import or not proto.graph.node:
        raise ModelError(f"{source} is not an ONNX model (no graph, nodes or opset)")
    if base_dir is not None and any(
            t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer):
        onnx.external_data_helper.load_external_data_for_model(proto, str(base_dir))
    return proto, hashlib.sha256(data).hexdigest()


def _opset(proto: onnx.ModelProto) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in DEFAULT_DOMAINS]
    if not versions:
        raise ModelError("the model imports no default-domain (ai.onnx) opset")
    opset = versions[0]
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ModelError(f"opset {opset} is not supported (portkern reads opsets "
                         f"{MIN_OPSET}..{MAX_OPSET}; convert with onnx.version_converter)")
    return opset


def _attr_value(attr: onnx.AttributeProto, node: onnx.NodeProto) -> Any:
    if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOpError(node.op_type, node.name, "subgraph attributes are not supported")
    if attr.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(attr.t)
    value = helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    return value


def node_from_proto(node: onnx.NodeProto, name: str | None = None) -> Node:
    """An ONNX NodeProto as an IR Node (tensor attributes as numpy, strings as str)."""
    return Node(
        name=name if name is not None else node.name,
        op_type=node.op_type,
        inputs=list(node.input),
        outputs=list(node.output),
        attrs={a.name: _attr_value(a, node) for a in node.attribute},
        domain=node.domain,
    )


def node_names(proto: onnx.ModelProto) -> list[str]:
    """The IR's name of each node of the model file, in file order: its own where it has one and
    it is unique, else made from its op type and place (runtime overrides are keyed by name)."""
    names: list[str] = []
    seen: set[str] = set()
    for index, proto_node in enumerate(proto.graph.node):
        name = proto_node.name or f"{proto_node.op_type}_{index}"
        if name in seen:
            name = f"{name}_{index}"
        seen.add(name)
        names.append(name)
    return names


def _unique_nodes(proto: onnx.ModelProto) -> list[Node]:
    """IR nodes with unique names."""
    nodes: list[Node] = []
    for name, proto_node in zip(node_names(proto), proto.graph.node, strict=True):
        if proto_node.domain not in DEFAULT_DOMAINS or proto_node.op_type not in SUPPORTED_OPS:
            raise UnsupportedOpError(
                f"{proto_node.domain}.{proto_node.op_type}" if proto_node.domain
                not in DEFAULT_DOMAINS else proto_node.op_type, name)
        nodes.append(node_from_proto(proto_node, name))
    return nodes


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str | None]:
    """Concrete dims as int, named dynamic dims as str, anonymous ones as None."""
    if not value_info.type.tensor_type.HasField("shape"):
        return []
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value_info.type.tensor_type.shape.dim]


def _bind_inputs(runtime_inputs: list[onnx.ValueInfoProto],
                 shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Concrete shape of every runtime input."""
    names = [vi.name for vi in runtime_inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise ModelError(f"--shape for unknown input(s) {', '.join(unknown)}; "
                         f"the model's inputs are: {', '.join(names)}")
    named: dict[str, int] = {}
    for vi in runtime_inputs:  # dim_params fixed by a given shape bind the same name elsewhere
        if vi.name in shapes:
            for dim, size in zip(_dims(vi), shapes[vi.name]):
                if isinstance(dim, str):
                    named.setdefault(dim, int(size))
    bound: dict[str, tuple[int, ...]] = {}
    for vi in runtime_inputs:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.elem_type:
            raise ModelError(f"input '{vi.name}' is not a tensor (sequence/map/optional inputs "
                             "are not supported)")
        dims = _dims(vi)
        given = shapes.get(vi.name)
        if given is not None:
            if len(given) != len(dims):
                raise ModelError(f"--shape {vi.name}: rank {len(given)} given, the input has "
                                 f"rank {len(dims)} ({_show_dims(dims)})")
            for index, (dim, size) in enumerate(zip(dims, given)):
                if isinstance(dim, int) and dim != size:
                    raise ModelError(f"--shape {vi.name}: dim {index} is fixed to {dim} in the "
                                     f"model, {size} given")
            bound[vi.name] = tuple(int(s) for s in given)
            continue
        concrete = []
        for index, dim in enumerate(dims):
            if isinstance(dim, int):
                concrete.append(dim)
            elif isinstance(dim, str) and dim in named:
                concrete.append(named[dim])
            else:
                label = f" ('{dim}')" if dim else ""
                template = "x".join(str(d) if isinstance(d, int) else "ABCDEFGH"[i % 8]
                                    for i, d in enumerate(dims))
                raise ModelError(
                    f"input '{vi.name}' has a dynamic dim {index}{label} in its shape "
                    f"{_show_dims(dims)}; bind it with --shape {vi.name}={template}")
        bound[vi.name] = tuple(concrete)
    return bound


def _show_dims(dims: Sequence[int | str | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def _np_dtype(elem_type: int) -> str:
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name


# constants up to this size travel as data into shape inference (shape arguments, axes, pads);
# larger ones (weights) only as typed inputs: inference never needs their values
INFERENCE_DATA_LIMIT = 4096


def _inference_proto(proto: onnx.ModelProto, specs: Mapping[str, TensorSpec],
                     constants: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The model with bound input shapes and without its weights' bytes, for shape inference."""
    small = {name: value for name, value in constants.items()
             if value.size <= INFERENCE_DATA_LIMIT and value.dtype.kind in "iub"}
    typed_inputs = [
        helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(spec.dtype)),
                                      list(spec.shape))
        for name, spec in specs.items() if name not in small]
    graph = helper.make_graph(
        list(proto.graph.node), proto.graph.name, typed_inputs, list(proto.graph.output),
        initializer=[numpy_helper.from_array(value, name) for name, value in small.items()])
    return helper.make_model(graph, opset_imports=list(proto.opset_import),
                             ir_version=proto.ir_version)


def _inferred_specs(proto: onnx.ModelProto) -> dict[str, TensorSpec]:
    """The concrete specs ONNX shape inference gives (values it cannot pin down are left out)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # inference is a shortcut only: the executor fills in whatever it lacks
        return {}
    specs: dict[str, TensorSpec] = {}
    graph = inferred.graph
    for vi in list(graph.value_info) + list(graph.output) + list(graph.input):
        tensor = vi.type.tensor_type
        dims = _dims(vi)
        concrete = tuple(d for d in dims if isinstance(d, int))
        if (not vi.type.HasField("tensor_type") or not tensor.HasField("shape")
                or not tensor.elem_type or len(concrete) != len(dims)):
            continue
        specs[vi.name] = TensorSpec(concrete, _np_dtype(tensor.elem_type))
    return specs


def _spec(array: np.ndarray) -> TensorSpec:
    return TensorSpec(tuple(int(d) for d in array.shape), array.dtype.name)


def _zeros(spec: TensorSpec) -> np.ndarray:
    """A read-only zero tensor of the spec that costs no memory (a broadcast view)."""
    return np.broadcast_to(np.zeros((), dtype=spec.dtype), spec.shape)


def _fold_and_specify(nodes: list[Node], constants: dict[str, np.ndarray],
                      specs: dict[str, TensorSpec], inferred: Mapping[str, TensorSpec],
                      opset: int) -> list[Node]:
    """Fold constant nodes away and give every remaining value a spec; returns the kept nodes."""
    kept: list[Node] = []
    for node in nodes:
        present = [name for name in node.inputs if name]
        foldable = all(name in constants for name in present) or (
            node.op_type in SHAPE_ONLY_OPS and present[0] in specs)
        if foldable:
            env = {name: constants.get(name, _zeros(specs[name])) for name in present}
            run_nodes([node], env, opset)
            for out in node.outputs:
                if out:
                    constants[out] = np.asarray(env[out])
                    specs[out] = _spec(constants[out])
            continue
        kept.append(node)
        _check_static(node, constants)
        outputs = [out for out in node.outputs if out]
        if all(out in inferred for out in outputs):
            specs.update({out: inferred[out] for out in outputs})
            continue
        env = {name: constants[name] if name in constants else _zeros(specs[name])
               for name in present}
        run_nodes([node], env, opset)
        specs.update({out: _spec(np.asarray(env[out])) for out in outputs})
    return kept


def _copies_its_input(node: Node, specs: Mapping[str, TensorSpec]) -> bool:
    present = [name for name in node.inputs if name]
    if node.domain not in ("", "ai.onnx") or len(present) != 1 or len(node.outputs) != 1:
        return False
    return node.op_type in ("Identity", "Concat") or (
        node.op_type == "Cast" and specs[node.outputs[0]].dtype == specs[present[0]].dtype)


def _elide_copies(nodes: list[Node], specs: Mapping[str, TensorSpec], outputs: set[str]) -> list[Node]:
    """The nodes without those that copy their input unchanged (see the module docstring), each
    reader renamed to read the copied value."""
    source: dict[str, str] = {}
    kept: list[Node] = []
    for node in nodes:
        inputs = [source.get(name, name) for name in node.inputs]
        if _copies_its_input(node, specs) and node.outputs[0] not in outputs:
            source[node.outputs[0]] = next(name for name in inputs if name)
            continue
        kept.append(node if inputs == node.inputs else replace(node, inputs=inputs))
    return kept


def _check_static(node: Node, constants: Mapping[str, np.ndarray]) -> None:
    """A node left after folding must not take its output shape from runtime values."""
    for index in VALUE_SHAPED_INPUTS.get(node.op_type, ()):
        if index < len(node.inputs) and node.inputs[index] and node.inputs[index] not in constants:
            raise ModelError(
                f"node '{node.name}' ({node.op_type}) gets its output shape from the runtime "
                f"value '{node.inputs[index]}': portkern needs shapes fixed at import")


def load_model(model: str | Path | bytes | onnx.ModelProto,
               shapes: Mapping[str, Sequence[int]] | None = None) -> Graph:
    """Read, bind, infer and fold an ONNX model into a Graph with every shape concrete."""
    proto, model_hash = read_model(model)
    opset = _opset(proto)
    nodes = _unique_nodes(proto)
    graph_proto = proto.graph
    constants = {t.name: numpy_helper.to_array(t) for t in graph_proto.initializer}
    runtime_inputs = [vi for vi in graph_proto.input if vi.name not in constants]
    bound = _bind_inputs(runtime_inputs, shapes or {})
    _check_defined(graph_proto, nodes, set(constants) | set(bound))

    specs = {name: _spec(value) for name, value in constants.items()}
    for vi in runtime_inputs:
        specs[vi.name] = TensorSpec(bound[vi.name], _np_dtype(vi.type.tensor_type.elem_type))
    inferred = _inferred_specs(_inference_proto(proto, specs, constants))
    outputs = [vi.name for vi in graph_proto.output]
    kept = _elide_copies(_fold_and_specify(nodes, constants, specs, inferred, opset), specs, set(outputs))

    used = {name for node in kept for name in node.inputs if name} | set(outputs)
    live_constants = {name: value for name, value in constants.items() if name in used}
    live = set(bound) | set(live_constants) | {o for node in kept for o in node.outputs if o}
    return Graph(
        name=graph_proto.name or "model",
        nodes=kept,
        inputs=[vi.name for vi in runtime_inputs],
        outputs=outputs,
        values={name: spec for name, spec in specs.items() if name in live},
        constants=live_constants,
        opset=opset,
        model_hash=model_hash,
        shapes=dict(bound),
    )


def _check_defined(graph_proto: onnx.GraphProto, nodes: list[Node], available: set[str]) -> None:
    """Every value read is defined earlier: catches truncated files that still parse."""
    defined = set(available)
    for node in nodes:
        for name in node.inputs:
            if name and name not in defined:
                raise ModelError(f"node '{node.name}' reads '{name}', which nothing defines "
                                 "(truncated or corrupt model, or nodes not in topological order)")
        defined.update(out for out in node.outputs if out)
    for vi in graph_proto.output:
        if vi.name not in defined:
            raise ModelError(f"graph output '{vi.name}' is never computed (truncated model?)")

