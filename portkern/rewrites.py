"""Graph rewrites that make a model's tasks cheaper to run, the same arithmetic.

split_projections: a projection (MatMul or Gemm by a constant weight, a constant bias) whose
output is cut into parts becomes one projection per part. GPT-2 computes q, k and v as one
768 x 2304 GEMM and Splits the result along its last axis: on a device every part is a strided view
that the glue copies to a dense buffer before attention reads it (36 copies a run, 293 us of GPT-2
small's 2.1 ms on an H100). One GEMM per part writes each part dense where attention reads it:
three 768-wide GEMMs (12.2 us each, one wave of 192 x 128 tiles at M = 4096) against one 2304-wide
GEMM and three copies (29.8 + 3 x 8.1 us); the model's device time fell from 2123 to 1916 us a run
(results/h100-gpu-models-gpt2-2026-12-07-split-projections.json).

The cut may come after a Reshape that lays the projection's columns out as a grid (heads x ...)
and a Transpose of it: GPT-NeoX views its fused q/k/v as (B, S, H, 3D), moves the heads before the
positions and Slices q, k and v off the last axis; BLOOM views it as (B, S, H, 3, D) and Gathers
index 0, 1 and 2. A part is then the grid's columns whose index along the cut axis is in the part's
range (every head's q columns): its weight and bias are those columns, gathered once here, and its
product goes through the same view and Transpose, so attention reads it as before (with the
Transpose folded in).

reassociate_residuals: a parallel block's (GPT-NeoX, Phi, Falcon, GPT-J) (mlp + attn) + x, where
mlp and attn are both projections that nothing else reads, becomes mlp + (attn + x): each add is
then one projection's residual epilogue, and no elementwise task is left between the layers. The
same sum in exact arithmetic; in floating point the two roundings come in another order.

fold_column_affines: a projection whose output goes through an affine map per column, x * s + t
with constant s and t, is the projection by W s with the bias b s + t. Such maps: a layer scale
(ConvNeXt's, DINOv2's, BEiT's, CaiT's gamma * (x W + b)), a BatchNormalization of the projection's
rows (LeViT's Linear -> flatten(0, 1) -> BatchNorm1d -> view back, 58 of them), a second constant
Add or a Sub or Div by a constant per column. Views that keep the last axis (Reshape, Flatten) may
stand between the projection and the map: a row stays a row. The map was an elementwise task of its
own, and it hid the residual add or activation after it from the GEMM's epilogue (ConvNeXt: one in
each block; LeViT: a HardSwish after most of them). The same arithmetic up to the rounding of the
scaled weights, as folding a BatchNorm into a conv.

einsums_as_matmuls: a two-operand Einsum without ellipses, repeated or summed-out letters is a
MatMul between views: each operand transposed to (batch..., free..., contracted...) (the second to
(batch..., contracted..., free...)) and viewed as (batch..., rows, K), the product viewed back to its
letters and transposed to the output's order. Funnel computes its attention scores and probabilities
times values with Einsum, as do hand-written attention blocks ('bhid,bhjd->bhij'): as Einsum they were
glue run by the framework, as MatMuls they are bmm, gemm and attention tasks. A constant operand (a
weight) is laid out here once. Transposes and Reshapes that change nothing are left out.

fold_pads_into_convs: a Pad of zeros on the spatial axes in front of a Conv is the Conv's own
padding. transformers' MobileNetV2 and EfficientNet pad ahead of their strided convs as TensorFlow
does (more at the end than at the start): as a node of its own the Pad is a copy of the activation,
and, on a channels-last backend, it cuts the NHWC stretch, costing two Transposes around every conv
(MobileNetV2: 52 Pads and 104 Transposes between its tasks on h200). Every conv kernel takes uneven
pads: they read the input at top/left offsets and treat rows and columns past its end as zeros.

drop_identity_arithmetic: x * 1, x / 1, x + 0 and x - 0 (exactly, by a scalar constant, the
output x's own shape and dtype) are no nodes: their readers read x (diffusers divides each ResNet
block's output by output_scale_factor = 1.0, an elementwise task that also hid the residual add
before it from the conv's epilogue).

spatial_means_as_pools: a ReduceMean over the two spatial axes of a 4-D value is the
GlobalAveragePool it is (torch's dynamo exporter writes adaptive_avg_pool2d(x, 1) so): a pool
task, and on a channels-last backend part of the NHWC stretch instead of its end.

query_scales: a scale on attention scores that is one constant per query row (Swin V2 multiplies
its cosine scores by exp(logit_scale), one per head) moves onto the queries, (q k^T) c = (q c) k^T:
the scores' product, its bias and softmax are then one attention task (a scalar scale is the
task's own), where they were a bmm, an elementwise and a softmax task with the score matrix through
memory twice. Only where the scores go on to a Softmax.

group_norms_as_ops (channels-last backends only): a group normalization as torch exports it
(group_norm_at) is one GroupNormalization op with its affine per channel, so the NHWC stretch
carries it instead of ending at its Reshape to groups.

collapse_layout_chains: a chain of Transposes and Reshapes whose result lays the elements out in
the order they already had is one Reshape, a view: ViT's patch embedding, run channels-last, goes
back to NCHW, flattens the positions and transposes them first, (B, H, W, C) -> (B, HW, C) in two
device copies where the NHWC buffer already is that; XGLM's probabilities go from (B*H, S, S) to
(B, H, S, S) and back before their product, which reads them as the view they are. Whether a chain
is such a view is checked by following the input's buffer through it as a strided view (no array is
made, whatever the size). A chain that gives its input's shape back is no node at all: its input's
producer makes the chain's output (LeViT's flatten(0, 1) and view back around the BatchNorm that
fold_column_affines folded, which would otherwise hide the HardSwish after it from the GEMM).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Collection

import numpy as np

from .executor import one_axis_slice
from .ir import Graph, Node, TensorSpec
from .layout import NHWC_OPS, with_nodes
from .tasks import FLOAT_DTYPES

MIN_PART = 128  # narrower parts make GEMMs whose tiles idle more than the copies they save


@dataclass(frozen=True)
class _Part:
    """One cut of the projection: the value it replaces and its [lo, hi) along the grid's cut axis;
    a Gather's part drops that axis (squeezed)."""

    output: str
    lo: int
    hi: int
    squeezed: bool


@dataclass
class _Projection:
    """rows view -> MatMul | Gemm -> [Add bias] -> [Reshape to a column grid] -> [Transpose] -> cuts."""

    merge: Node | None  # a Reshape feeding the product its rows (GPT-2's Conv1D), read by nothing else
    product: Node
    bias_add: Node | None
    view: Node | None
    transpose: Node | None
    cuts: list[Node]  # one Split, or the Slices / Gathers that read the value, all on one axis
    grid: tuple[int, ...]  # the product's columns as the view lays them out; (N,) without one
    axis: int  # the grid axis the cuts divide
    parts: list[_Part]


def _sole_consumer(graph: Graph, consumers: dict[str, list[Node]], value: str) -> Node | None:
    users = consumers.get(value, [])
    return users[0] if len(users) == 1 and value not in graph.outputs else None


def _is_projection(graph: Graph, node: Node) -> bool:
    """MatMul or Gemm (alpha = beta = 1, a not transposed) by a constant 2-D weight, a Gemm's bias
    a constant too."""
    if node.op_type not in ("MatMul", "Gemm") or node.domain not in ("", "ai.onnx") \
            or node.inputs[1] not in graph.constants or len(graph.values[node.inputs[1]].shape) != 2:
        return False
    if node.op_type == "MatMul":
        return True
    attrs = node.attrs
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    return attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0) \
        and (not bias or (bias in graph.constants and len(graph.values[bias].shape) == 1))


def _column_grid(rows: tuple[int, ...], viewed: tuple[int, ...], columns: int) -> tuple[int, ...] | None:
    """The trailing axes of a Reshape's output that hold the product's columns (their sizes
    multiply to `columns` and the leading ones to the rows), or None where the view mixes the two."""
    for count in range(1, len(viewed) + 1):
        if math.prod(viewed[-count:]) == columns:
            return viewed[-count:] if math.prod(viewed[:-count]) == math.prod(rows) else None
    return None


def _cut(graph: Graph, node: Node, rank: int) -> tuple[int, list[_Part]] | None:
    """(axis, parts) of a Split, a unit-step Slice of one axis or a Gather of one scalar index."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Split":
        if not all(node.outputs):
            return None
        axis = int(node.attrs.get("axis", 0)) % rank
        parts, lo = [], 0
        for out in node.outputs:
            hi = lo + graph.values[out].shape[axis]
            parts.append(_Part(out, lo, hi, False))
            lo = hi
        return axis, parts
    size = graph.values[node.inputs[0]].shape
    if node.op_type == "Slice":
        cut = one_axis_slice(node, graph.constants, size)
        if cut is None or cut[2] <= cut[1]:
            return None
        return cut[0], [_Part(node.outputs[0], cut[1], cut[2], False)]
    bounds = [graph.constants.get(name) if name else None for name in node.inputs[1:]]
    if node.op_type == "Gather" and bounds and bounds[0] is not None and np.ndim(bounds[0]) == 0:
        axis = int(node.attrs.get("axis", 0)) % rank
        index = int(bounds[0]) % size[axis]
        return axis, [_Part(node.outputs[0], index, index + 1, True)]
    return None


def _projected(graph: Graph, producer: dict[str, Node], value: str) -> bool:
    """A projection's output (MatMul or Gemm), or its bias Add by a constant."""
    node = producer.get(value)
    if node is not None and node.op_type == "Add" and any(name in graph.constants for name in node.inputs):
        node = producer.get(next(name for name in node.inputs if name not in graph.constants))
    return node is not None and node.op_type in ("MatMul", "Gemm") and node.domain in ("", "ai.onnx")


def fold_column_affines(graph: Graph) -> Graph:
    """Every per-column affine of a projection that nothing else reads (see the module docstring)
    folded into the projection's weight and bias, under the affine's output name; until none is
    left, so a scale and then a shift both fold. The graph itself where there is none."""
    folded = graph
    while True:
        consumers, producer = folded.consumers(), folded.producer()
        plans = {}  # id(affine node) -> (the chain from the projection to the affine's input, scale, shift)
        for node in folded.nodes:
            affine = _column_affine(folded, node)
            if affine is None:
                continue
            value, scale, shift = affine
            chain = _projection_chain(folded, consumers, producer, value, node)
            if chain is not None and (scale is not None or len(chain) > 1 or _gemm_bias(chain[0])):
                plans[id(node)] = (chain, scale, shift)  # (a shift alone on a projection without a bias is its bias)
        if not plans:
            return folded
        folded = _fold_affines(folded, plans)


def _column_affine(graph: Graph, node: Node) -> tuple[str, np.ndarray | None, np.ndarray | None] | None:
    """(the value, its scale per column or None, its shift per column or None) where `node` computes
    value * scale + shift with constants per column of the value's last axis: a Mul, Div, Add or
    Sub by such a constant, or an inference BatchNormalization of rows (its channels the columns)."""
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    if node.op_type == "BatchNormalization":
        x = node.inputs[0]
        params = [graph.constants.get(name) for name in node.inputs[1:5]]
        if node.attrs.get("training_mode", 0) or len(graph.values[x].shape) != 2 or any(p is None for p in params):
            return None
        gamma, beta, mean, var = (p.astype(np.float64) for p in params)
        scale = gamma / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        return x, scale, beta - mean * scale
    if node.op_type not in ("Mul", "Div", "Add", "Sub") or len(node.inputs) != 2:
        return None
    first_constant = node.inputs[0] in graph.constants
    if first_constant and node.op_type in ("Div", "Sub"):
        return None
    value, constant = node.inputs[::-1] if first_constant else node.inputs
    array, shape = graph.constants.get(constant), graph.values[value].shape
    if array is None or value in graph.constants or not shape or graph.values[node.outputs[0]].shape != shape \
            or array.ndim > len(shape) or any(size != 1 for size in array.shape[:-1]) \
            or array.shape[-1:] not in ((), (1,), (shape[-1],)) or array.dtype.name not in FLOAT_DTYPES:
        return None
    column = np.broadcast_to(array.astype(np.float64).reshape(-1), shape[-1:])
    if node.op_type == "Mul":
        return value, column, None
    if node.op_type == "Div":
        return (value, 1.0 / column, None) if np.all(column != 0.0) else None
    return value, None, column if node.op_type == "Add" else -column


def _projection_chain(graph: Graph, consumers: dict[str, list[Node]], producer: dict[str, Node], value: str,
                      reader: Node) -> list[Node] | None:
    """[the projection, its bias Add by a constant of its width if any, views that keep the last
    axis (Reshape, Flatten: a row stays a row) ...] making `value`, each node read only by the next
    and the last only by `reader`; None where `value` is not such a chain's."""
    chain: list[Node] = []
    while True:
        if _sole_consumer(graph, consumers, value) is not (chain[0] if chain else reader):
            return None
        node = producer.get(value)
        if node is None or node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type in ("Reshape", "Flatten") and not any(n.op_type == "Add" for n in chain) \
                and graph.values[node.inputs[0]].shape[-1:] == graph.values[value].shape[-1:]:
            chain.insert(0, node)
            value = node.inputs[0]
            continue
        if node.op_type == "Add" and len(node.inputs) == 2 and not any(n.op_type == "Add" for n in chain):
            constant = [name for name in node.inputs if name in graph.constants]
            if len(constant) != 1 or graph.values[constant[0]].shape != graph.values[value].shape[-1:]:
                return None
            chain.insert(0, node)
            value = next(name for name in node.inputs if name not in graph.constants)
            continue
        return [node, *chain] if _is_projection(graph, node) else None


def _gemm_bias(product: Node) -> str:
    """A Gemm's bias input, '' for none (or a MatMul)."""
    return product.inputs[2] if product.op_type == "Gemm" and len(product.inputs) > 2 else ""


def _fold_affines(graph: Graph, plans: dict[int, tuple[list[Node], np.ndarray | None, np.ndarray | None]]) -> Graph:
    """The graph with each planned affine's scale and shift carried by its projection's weight and
    bias (a bias Add made where a shift has none to join), the affine's readers reading the chain."""
    constants, values = dict(graph.constants), dict(graph.values)
    rewritten: dict[int, list[Node]] = {}  # id(chain node) -> what replaces it
    for affine in graph.nodes:
        if id(affine) not in plans:
            continue
        chain, scale, shift = plans[id(affine)]
        product, rest = chain[0], chain[1:]
        bias_add = rest[0] if rest and rest[0].op_type == "Add" else None
        views = rest[1:] if bias_add is not None else rest
        tag = affine.name or affine.outputs[0]

        def constant(array: np.ndarray, like: str, label: str) -> str:
            name = f"{tag}::{label}"
            constants[name] = array.astype(graph.constants[like].dtype)
            values[name] = TensorSpec(array.shape, graph.values[like].dtype)
            return name

        def affined(name: str, on_rows: bool = False, shifted: bool = False) -> str:
            """A weight's columns (rows where on_rows) or a bias scaled; shifted, the bias the shift
            joins. The constant itself where neither touches it: a shift alone leaves the weight as
            it is (no copy of it)."""
            moved = shifted and shift is not None
            if scale is None and not moved:
                return name
            array = graph.constants[name].astype(np.float64)
            if scale is not None:
                array = array * (scale[:, None] if on_rows else scale)
            return constant(array + shift if moved else array, name, f"affined_{name}")

        weight = product.inputs[1]
        transposed = product.op_type == "Gemm" and bool(product.attrs.get("transB", 0))  # (N, K): scale its rows
        gemm_bias = _gemm_bias(product)
        made = [replace(product, inputs=[product.inputs[0], affined(weight, on_rows=transposed),
                                         *([affined(gemm_bias, shifted=bias_add is None)] if gemm_bias else [])])]
        if bias_add is not None:
            made.append(replace(bias_add, inputs=[affined(name, shifted=True) if name in graph.constants else name
                                                  for name in bias_add.inputs]))
        elif shift is not None and not gemm_bias:  # the shift becomes the projection's bias
            out = f"{tag}::biased"
            values[out] = graph.values[product.outputs[0]]
            made.append(Node(f"{tag}::bias", "Add", [product.outputs[0], constant(shift, weight, "bias")], [out]))
        for view in views:
            made.append(replace(view, inputs=[made[-1].outputs[0], *view.inputs[1:]]))
        made[-1] = replace(made[-1], outputs=list(affine.outputs))  # the affine's readers read the chain
        rewritten[id(product)] = made[:len(made) - len(views)]
        for view, new in zip(views, made[len(made) - len(views):]):
            rewritten[id(view)] = [new]
        if bias_add is not None:
            rewritten[id(bias_add)] = []
    nodes = [new for node in graph.nodes if id(node) not in plans for new in rewritten.get(id(node), [node])]
    return with_nodes(graph, nodes, values, constants)


def reassociate_residuals(graph: Graph) -> Graph:
    """Every Add(Add(p, q), x) whose p and q are projections read only by the inner Add, with x of
    their shape and dtype, as Add(p, Add(q, x)) under the same output name (module docstring). The
    graph itself where there is none."""
    consumers, producer = graph.consumers(), graph.producer()
    regrouped: dict[int, list[Node]] = {}  # id(outer Add) -> its two new Adds
    dropped: set[int] = set()
    for outer in graph.nodes:
        if outer.op_type != "Add" or outer.domain not in ("", "ai.onnx") or len(outer.inputs) != 2:
            continue
        spec = graph.values[outer.outputs[0]]
        for side in (0, 1):
            inner, x = producer.get(outer.inputs[side]), outer.inputs[1 - side]
            if inner is None or inner.op_type != "Add" or id(inner) in dropped or len(inner.inputs) != 2 \
                    or _sole_consumer(graph, consumers, inner.outputs[0]) is not outer \
                    or graph.values[x] != spec or any(graph.values[name] != spec for name in inner.inputs) \
                    or not all(_projected(graph, producer, name) and _sole_consumer(graph, consumers, name) is inner
                               for name in inner.inputs):
                continue
            p, q = inner.inputs
            partial = f"{outer.outputs[0]}::{q}+{x}"
            regrouped[id(outer)] = [replace(inner, name=inner.name + "::regrouped", inputs=[q, x], outputs=[partial]),
                                    replace(outer, inputs=[p, partial])]
            dropped.add(id(inner))
            break
    if not regrouped:
        return graph
    nodes = [made for node in graph.nodes if id(node) not in dropped for made in regrouped.get(id(node), [node])]
    values = dict(graph.values)
    values.update({partial.outputs[0]: graph.values[partial.inputs[0]] for partial, _ in regrouped.values()})
    return with_nodes(graph, nodes, values, graph.constants)


def drop_identity_arithmetic(graph: Graph) -> Graph:
    """Every Mul or Div by exactly 1 and Add or Sub of exactly 0 (a scalar constant) that gives its
    input back unchanged in shape and dtype, gone: its readers read the input. Diffusers' ResNet
    blocks divide their output by output_scale_factor = 1.0; as a task that is a copy of the
    activation, and it hid the residual add before it from the conv's epilogue. The graph itself
    where there is none."""
    replaced: dict[str, str] = {}  # an identity's output -> its input (itself resolved)
    kept: list[Node] = []
    for node in graph.nodes:
        source = _identity_operand(graph, node)
        if source is None or node.outputs[0] in graph.outputs:
            kept.append(node)
        else:
            replaced[node.outputs[0]] = replaced.get(source, source)
    if not replaced:
        return graph
    nodes = [replace(node, inputs=[replaced.get(name, name) for name in node.inputs]) for node in kept]
    return with_nodes(graph, nodes, graph.values, graph.constants)


def _identity_operand(graph: Graph, node: Node) -> str | None:
    """The operand x where `node` computes x * 1, 1 * x, x / 1, x + 0, 0 + x or x - 0 exactly."""
    if node.op_type not in ("Mul", "Div", "Add", "Sub") or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    neutral = 1.0 if node.op_type in ("Mul", "Div") else 0.0
    sides = (0, 1) if node.op_type in ("Mul", "Add") else (0,)
    for side in sides:
        x, constant = node.inputs[side], graph.constants.get(node.inputs[1 - side])
        if constant is not None and constant.size == 1 and constant.dtype.kind == "f" \
                and float(constant.reshape(())) == neutral and x not in graph.constants \
                and graph.values[x] == graph.values[node.outputs[0]]:
            return x
    return None


def spatial_means_as_pools(graph: Graph) -> Graph:
    """Every ReduceMean over the two spatial axes of a 4-D float value (N, C, H, W) as the
    GlobalAveragePool it is (a Reshape after it where the reduction drops the axes): torch's dynamo
    exporter writes adaptive_avg_pool2d(x, 1) so (ResNet's head, squeeze-excite's squeeze), and as a
    ReduceMean it ended each channels-last stretch (EfficientNet: 33 Transposes). The graph itself
    where there is none."""
    nodes: list[Node] = []
    values = dict(graph.values)
    constants = dict(graph.constants)
    changed = False
    for node in graph.nodes:
        x = node.inputs[0] if node.inputs else ""
        spec = graph.values.get(x)
        if node.op_type != "ReduceMean" or node.domain not in ("", "ai.onnx") or spec is None \
                or len(spec.shape) != 4 or spec.dtype not in FLOAT_DTYPES or reduce_axes(graph, node) != (2, 3):
            nodes.append(node)
            continue
        changed = True
        if node.attrs.get("keepdims", 1):
            nodes.append(Node(node.name, "GlobalAveragePool", [x], list(node.outputs)))
            continue
        pooled, shape = f"{node.outputs[0]}::pooled", f"{node.outputs[0]}::shape"
        values[pooled] = TensorSpec(spec.shape[:2] + (1, 1), spec.dtype)
        constants[shape] = np.array(spec.shape[:2], np.int64)
        values[shape] = TensorSpec((2,), "int64")
        nodes += [Node(node.name, "GlobalAveragePool", [x], [pooled]),
                  Node(f"{node.name}::squeeze", "Reshape", [pooled, shape], list(node.outputs))]
    return with_nodes(graph, nodes, values, constants) if changed else graph


def reduce_axes(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """A reduction's axes (the attribute, or a constant input from opset 18), normalised; all of
    them where none are given; None where they are not static or the node is a no-op
    (noop_with_empty_axes)."""
    rank = len(graph.values[node.inputs[0]].shape)
    if "axes" in node.attrs:
        axes = list(node.attrs["axes"])
    elif len(node.inputs) > 1 and node.inputs[1]:
        if node.inputs[1] not in graph.constants:
            return None
        axes = [int(a) for a in graph.constants[node.inputs[1]].reshape(-1)]
    else:
        axes = []
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    return tuple(sorted({int(a) % rank for a in axes}))


def query_scales(graph: Graph) -> Graph:
    """Every attention score scale that is one per query row (Swin V2's exp(logit_scale), one per
    head, on its cosine scores) moved from the scores onto the queries: (q k^T) * c = (q * c) k^T
    where the constant c is one value per row (its last axis 1). The scores' product is then an
    attention task's (a scalar scale is the task's own), and the queries' Mul joins their
    elementwise task. Only where the scaled scores go on to a last-axis Softmax (through adds,
    views and casts): on a plain product the Mul is cheaper after it where N < K. The graph itself
    where there is none."""
    consumers, producer = graph.consumers(), graph.producer()
    moved: dict[int, Node] = {}  # id(scale node) -> the Mul or Div on the queries that replaces it
    products: dict[int, Node] = {}  # id(product) -> it, writing the scale's output
    for node in graph.nodes:
        product = producer.get(node.inputs[0]) if node.op_type in ("Mul", "Div") and len(node.inputs) == 2 else None
        if product is None or product.op_type != "MatMul" or product.domain not in ("", "ai.onnx") \
                or _sole_consumer(graph, consumers, product.outputs[0]) is not node:
            continue
        scale = graph.constants.get(node.inputs[1])
        q = product.inputs[0]
        q_shape = graph.values[q].shape
        if scale is None or scale.size == 1 or scale.ndim > len(q_shape) or scale.shape[-1] != 1 \
                or len(q_shape) < 3 or np.broadcast_shapes(q_shape, scale.shape) != q_shape \
                or not _reaches_softmax(graph, consumers, node.outputs[0]):
            continue
        scaled = f"{q}::{node.name}"
        moved[id(node)] = replace(node, inputs=[q, node.inputs[1]], outputs=[scaled])
        products[id(product)] = replace(product, inputs=[scaled, product.inputs[1]], outputs=list(node.outputs))
    if not moved:
        return graph
    nodes = []
    for node in graph.nodes:
        if id(node) in products:
            nodes += [moved[id(consumer)] for consumer in consumers[node.outputs[0]]] + [products[id(node)]]
        elif id(node) not in moved:
            nodes.append(node)
    values = dict(graph.values)
    values.update({node.outputs[0]: graph.values[node.inputs[0]] for node in moved.values()})
    return with_nodes(graph, nodes, values, graph.constants)


def _reaches_softmax(graph: Graph, consumers: dict[str, list[Node]], value: str, steps: int = 8) -> bool:
    """`value` flows, through sole readers that add, view or cast it, into a Softmax of its last axis."""
    for _ in range(steps):
        reader = _sole_consumer(graph, consumers, value)
        if reader is None:
            return False
        if reader.op_type == "Softmax":
            return int(reader.attrs.get("axis", -1)) in (-1, len(graph.values[value].shape) - 1)
        if reader.op_type not in ("Add", "Reshape", "Where", "Cast"):
            return False
        value = reader.outputs[0]
    return False


_LAYOUT_OPS = ("Transpose", "Reshape", "Flatten", "Unsqueeze", "Squeeze")


def einsums_as_matmuls(graph: Graph) -> Graph:
    """Every Einsum _einsum_terms takes, as a MatMul between views (see the module docstring). The
    graph itself where there is none."""
    values, constants = dict(graph.values), dict(graph.constants)
    nodes: list[Node] = []
    lowered = False
    for node in graph.nodes:
        made = _einsum_as_matmul(graph, node, values, constants)
        lowered = lowered or made is not None
        nodes.extend(made if made is not None else [node])
    return with_nodes(graph, nodes, values, constants) if lowered else graph


def _einsum_terms(node: Node) -> tuple[str, str, str] | None:
    """(first operand's letters, second's, the output's) of a two-operand Einsum each of whose letters
    the output keeps or both operands share (a contraction), none twice in a term; else None."""
    if node.op_type != "Einsum" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    equation = str(node.attrs.get("equation", "")).replace(" ", "")
    if "..." in equation or equation.count("->") != 1:
        return None
    operands, out = equation.split("->")
    if operands.count(",") != 1:
        return None
    a, b = operands.split(",")
    if not all(term.isalpha() and len(set(term)) == len(term) for term in (a, b, out)) \
            or set(out) - set(a) - set(b) or (set(a) ^ set(b)) - set(out):
        return None
    return a, b, out


def _einsum_as_matmul(graph: Graph, node: Node, values: dict[str, TensorSpec],
                      constants: dict[str, np.ndarray]) -> list[Node] | None:
    """The nodes computing `node`, an Einsum, as a MatMul between views; None where it is not one
    _einsum_terms takes. New values and constants go into `values` and `constants`."""
    terms = _einsum_terms(node)
    if terms is None:
        return None
    a, b, out = terms
    size = {letter: extent for term, name in ((a, node.inputs[0]), (b, node.inputs[1]))
            for letter, extent in zip(term, graph.values[name].shape)}
    batch = [letter for letter in out if letter in a and letter in b]
    free_a = [letter for letter in out if letter in a and letter not in b]
    free_b = [letter for letter in out if letter in b and letter not in a]
    contracted = [letter for letter in a if letter in b and letter not in out]
    tag = node.name or node.outputs[0]
    dtype = graph.values[node.outputs[0]].dtype
    made: list[Node] = []

    def laid_out(name: str, term: str, order: list[str], grouped: list[list[str]], label: str) -> str:
        """`name` (letters `term`) transposed to `order` and viewed as batch x one axis per group."""
        perm = [term.index(letter) for letter in order]
        shape = [size[letter] for letter in batch] + [math.prod(size[letter] for letter in part) for part in grouped]
        if name in graph.constants:  # a weight: laid out once, here
            array = np.transpose(graph.constants[name], perm).reshape(shape)
            constants[f"{tag}::{label}"], values[f"{tag}::{label}"] = array, TensorSpec(tuple(shape), dtype)
            return f"{tag}::{label}"
        return _viewed(name, perm, shape, f"{tag}::{label}", values, constants, made)

    # without batch letters the first operand keeps its free axes (MatMul broadcasts a 2-D second
    # operand over them: x (B, S, D) by a weight stays the projection partition knows)
    rows = [[letter] for letter in free_a] if not batch and free_a else [free_a]
    left = laid_out(node.inputs[0], a, batch + free_a + contracted, [*rows, contracted], "a")
    right = laid_out(node.inputs[1], b, batch + contracted + free_b, [contracted, free_b], "b")
    product_shape = tuple([size[letter] for letter in batch] + [math.prod(size[letter] for letter in part)
                                                               for part in (*rows, free_b)])
    product = f"{tag}::product"
    values[product] = TensorSpec(product_shape, dtype)
    made.append(Node(f"{tag}::matmul", "MatMul", [left, right], [product]))
    letters = batch + free_a + free_b
    result = _viewed(product, list(range(len(product_shape))), [size[letter] for letter in letters],
                     f"{tag}::letters", values, constants, made)
    _viewed(result, [letters.index(letter) for letter in out], [size[letter] for letter in out], f"{tag}::out",
            values, constants, made)
    made[-1] = replace(made[-1], outputs=list(node.outputs))  # the Einsum's readers read the last step
    return made


def _viewed(name: str, perm: list[int], shape: list[int], tag: str, values: dict[str, TensorSpec],
            constants: dict[str, np.ndarray], made: list[Node]) -> str:
    """`name` transposed by `perm` and reshaped to `shape`, the nodes appended to `made`; a step that
    changes nothing is left out."""
    spec = values[name]
    if perm != sorted(perm):
        transposed = tuple(spec.shape[axis] for axis in perm)
        values[f"{tag}::t"] = TensorSpec(transposed, spec.dtype)
        made.append(Node(f"{tag}::transpose", "Transpose", [name], [f"{tag}::t"], {"perm": perm}))
        name, spec = f"{tag}::t", values[f"{tag}::t"]
    if tuple(shape) != spec.shape:
        target = f"{tag}::shape"
        values[target], constants[target] = TensorSpec((len(shape),), "int64"), np.array(shape, np.int64)
        values[f"{tag}::v"] = TensorSpec(tuple(shape), spec.dtype)
        made.append(Node(f"{tag}::view", "Reshape", [name, target], [f"{tag}::v"]))
        name = f"{tag}::v"
    return name


def fold_pads_into_convs(graph: Graph) -> Graph:
    """Every Pad of zeros on the spatial axes alone whose readers are all Convs reading it as their
    data, as pads of those Convs (see the module docstring). The graph itself where there is none."""
    consumers = graph.consumers()
    folded: dict[str, tuple[str, list[int]]] = {}  # a Pad's output -> (its input, its spatial pads)
    for node in graph.nodes:
        pads = _spatial_zero_pads(graph, node)
        readers = consumers.get(node.outputs[0], []) if pads is not None else []
        if readers and node.outputs[0] not in graph.outputs and all(
                reader.op_type == "Conv" and reader.domain in ("", "ai.onnx") and reader.inputs[0] == node.outputs[0]
                and node.outputs[0] not in reader.inputs[1:]
                and reader.attrs.get("auto_pad", "NOTSET") in ("NOTSET", "", "VALID") for reader in readers):
            folded[node.outputs[0]] = (node.inputs[0], pads)
    if not folded:
        return graph
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.op_type == "Pad" and node.outputs[0] in folded:
            continue
        if node.op_type == "Conv" and node.inputs[0] in folded:
            source, pads = folded[node.inputs[0]]
            own = [int(p) for p in node.attrs.get("pads", [0] * len(pads))] \
                if node.attrs.get("auto_pad", "NOTSET") != "VALID" else [0] * len(pads)
            attrs = {key: value for key, value in node.attrs.items() if key != "auto_pad"}
            node = replace(node, inputs=[source, *node.inputs[1:]],
                           attrs={**attrs, "pads": [a + b for a, b in zip(own, pads)]})
        nodes.append(node)
    return with_nodes(graph, nodes, graph.values, graph.constants)


def _spatial_zero_pads(graph: Graph, node: Node) -> list[int] | None:
    """A Pad's begin and end pads over the axes after the first two (a Conv's pads attribute), where
    it pads with zeros and only those axes, by a constant amount; else None."""
    if node.op_type != "Pad" or node.domain not in ("", "ai.onnx") or node.attrs.get("mode", "constant") != "constant":
        return None
    if graph.opset < 11:
        pads, value = node.attrs.get("pads"), node.attrs.get("value", 0.0)
    else:
        if len(node.inputs) > 3 and node.inputs[3]:  # axes (opset 18)
            return None
        pads = graph.constants.get(node.inputs[1])
        fill = node.inputs[2] if len(node.inputs) > 2 else ""
        value = graph.constants[fill].reshape(-1)[0] if fill in graph.constants else (None if fill else 0.0)
    rank = len(graph.values[node.inputs[0]].shape)
    if pads is None or value is None or float(value) != 0.0 or rank < 3 or len(pads) != 2 * rank:
        return None
    pads = [int(p) for p in pads]
    begins, ends = pads[:rank], pads[rank:]
    if any(p < 0 for p in pads) or any(begins[:2]) or any(ends[:2]):
        return None
    return begins[2:] + ends[2:]


def collapse_layout_chains(graph: Graph) -> Graph:
    """Every maximal chain of Transposes, Reshapes, Flattens, Unsqueezes and Squeezes (each value in it
    read only by the next, none a graph output) that only reshapes its input, as one Reshape under the chain's output
    name (see the module docstring); as nothing where it gives its input's shape back and the
    input's producer can make the chain's output instead. The graph itself where there is none."""
    consumers, producer = graph.consumers(), graph.producer()
    views: dict[int, list[Node]] = {}  # id(a chain's last node) -> the chain, made one Reshape
    renamed: dict[int, dict[str, str]] = {}  # id(producer) -> {its output: the chain's output it makes instead}
    dropped: set[int] = set()
    for node in graph.nodes:
        if node.op_type not in _LAYOUT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        follower = _sole_consumer(graph, consumers, node.outputs[0])
        if follower is not None and follower.op_type in _LAYOUT_OPS and follower.domain in ("", "ai.onnx"):
            continue  # not the chain's last node
        chain = [node]
        while (before := producer.get(chain[0].inputs[0])) is not None and before.op_type in _LAYOUT_OPS \
                and before.domain in ("", "ai.onnx") \
                and _sole_consumer(graph, consumers, before.outputs[0]) is chain[0]:
            chain.insert(0, before)
        if not _only_reshapes(graph, chain):
            continue
        source, out = chain[0].inputs[0], chain[-1].outputs[0]
        maker = producer.get(source)
        if graph.values[source].shape == graph.values[out].shape and maker is not None \
                and _sole_consumer(graph, consumers, source) is chain[0]:
            renamed.setdefault(id(maker), {})[source] = out
        elif len(chain) > 1:
            views[id(chain[-1])] = chain
        else:
            continue
        dropped.update(id(link) for link in chain)
    if not dropped:
        return graph
    nodes: list[Node] = []
    values, constants = dict(graph.values), dict(graph.constants)
    for node in graph.nodes:
        chain = views.get(id(node))
        if chain is not None:
            shape = np.array(graph.values[node.outputs[0]].shape, np.int64)
            target = f"{node.outputs[0]}::shape"
            values[target], constants[target] = TensorSpec(shape.shape, "int64"), shape
            nodes.append(Node(f"{node.name}::view", "Reshape", [chain[0].inputs[0], target], list(node.outputs)))
        elif id(node) in renamed:
            nodes.append(replace(node, outputs=[renamed[id(node)].get(name, name) for name in node.outputs]))
        elif id(node) not in dropped:
            nodes.append(node)
    return with_nodes(graph, nodes, values, constants)


def _only_reshapes(graph: Graph, chain: list[Node]) -> bool:
    """Whether the chain hands on its input's elements in their own order: followed as a view of
    the input's buffer (shape and strides, as torch's view rules give them), it must end contiguous.
    A Reshape no view can express (a copy) ends the check: the chain is then taken as not one."""
    shape = list(graph.values[chain[0].inputs[0]].shape)
    if math.prod(shape) == 0:
        return False
    strides = _row_major(shape)
    for link in chain:
        if link.op_type == "Transpose":
            perm = list(link.attrs.get("perm", range(len(shape) - 1, -1, -1)))
            shape, strides = [shape[axis] for axis in perm], [strides[axis] for axis in perm]
            continue
        target = list(graph.values[link.outputs[0]].shape)
        viewed = _view_strides(shape, strides, target)
        if viewed is None:
            return False
        shape, strides = target, viewed
    return all(size == 1 or stride == want for size, stride, want in zip(shape, strides, _row_major(shape)))


def _row_major(shape: list[int]) -> list[int]:
    strides = [1] * len(shape)
    for axis in range(len(shape) - 2, -1, -1):
        strides[axis] = strides[axis + 1] * shape[axis + 1]
    return strides


def _view_strides(shape: list[int], strides: list[int], target: list[int]) -> list[int] | None:
    """The strides of a view of (shape, strides) as `target`, or None where none exists: the old
    axes are taken in runs that are contiguous among themselves, and each run must be exactly
    covered by consecutive new axes (torch's rule for Tensor.view)."""
    new = [0] * len(target)
    view_axis = len(target) - 1
    base = strides[-1] if strides else 1
    run_numel = view_numel = 1
    for axis in range(len(shape) - 1, -1, -1):
        run_numel *= shape[axis]
        run_ends = axis == 0 or (shape[axis - 1] != 1 and strides[axis - 1] != run_numel * base)
        if not run_ends:
            continue
        while view_axis >= 0 and (view_numel < run_numel or target[view_axis] == 1):
            new[view_axis] = view_numel * base
            view_numel *= target[view_axis]
            view_axis -= 1
        if view_numel != run_numel:
            return None
        if axis > 0:
            base, run_numel, view_numel = strides[axis - 1], 1, 1
    return new if view_axis == -1 else None


def _rejoined(graph: Graph, consumers: dict[str, list[Node]], value: str) -> bool:
    """A part a Concat reads as it is (Phi's unrotated columns, joined back after the rotary
    embedding): the Concat copies it anyway, so a GEMM of its own saves nothing."""
    reader = _sole_consumer(graph, consumers, value)
    return reader is not None and reader.op_type == "Concat" \
        and graph.values[reader.outputs[0]].shape != graph.values[value].shape  # not a Concat with nothing


def _projection(graph: Graph, consumers: dict[str, list[Node]], producer: dict[str, Node],
                node: Node) -> _Projection | None:
    """The chain from a projection to the cuts of its columns (module docstring), or None."""
    if not _is_projection(graph, node):
        return None
    value = node.outputs[0]
    rows, columns = graph.values[value].shape[:-1], graph.values[value].shape[-1]
    bias_add = _sole_consumer(graph, consumers, value)
    if bias_add is not None and bias_add.op_type == "Add" and sum(
            name in graph.constants and graph.values[name].shape == (columns,) for name in bias_add.inputs) == 1 \
            and graph.values[bias_add.outputs[0]].shape == graph.values[value].shape:
        value = bias_add.outputs[0]
    else:
        bias_add = None
    grid: tuple[int, ...] | None = (columns,)
    view = _sole_consumer(graph, consumers, value)
    if view is not None and view.op_type == "Reshape":
        grid = _column_grid(rows, graph.values[view.outputs[0]].shape, columns)
        value = view.outputs[0]
    else:
        view = None
    transpose = _sole_consumer(graph, consumers, value)
    if transpose is not None and transpose.op_type == "Transpose":
        value = transpose.outputs[0]
    else:
        transpose = None
    readers = consumers.get(value, [])
    if grid is None or not readers or value in graph.outputs:
        return None
    rank = len(graph.values[value].shape)
    cuts = [_cut(graph, reader, rank) for reader in readers]
    if any(cut is None for cut in cuts) or len({cut[0] for cut in cuts if cut}) != 1 \
            or (len(readers) > 1 and any(reader.op_type == "Split" for reader in readers)):
        return None
    value_axis = cuts[0][0] if cuts[0] else 0
    view_axis = list(transpose.attrs["perm"])[value_axis] if transpose is not None else value_axis
    axis = view_axis - (rank - len(grid))
    parts = [part for cut in cuts if cut for part in cut[1]]
    per_index = columns // grid[axis] if axis >= 0 else 0
    if axis < 0 or any((part.hi - part.lo) * per_index < MIN_PART or (part.squeezed and view is None)
                       or _rejoined(graph, consumers, part.output) for part in parts):
        return None
    merge = producer.get(node.inputs[0])
    if merge is None or merge.op_type != "Reshape" or _sole_consumer(graph, consumers, merge.outputs[0]) is None:
        merge = None
    return _Projection(merge, node, bias_add, view, transpose, readers, grid, axis, parts)


def split_projections(graph: Graph, in_tasks: Collection[int] = ()) -> Graph:
    """Every projection whose columns are cut into parts (see the module docstring) as one
    projection per part, each writing its part under the cut's output name; weights and biases are
    gathered once here, and a rows view (Reshape) before the projection is repeated for each part,
    so each part is a GEMM task on its own (partition's row views). Cuts among `in_tasks` (node
    ids: a task reads them in place, no copy to save) are left. The graph itself where there is
    none."""
    consumers, producer = graph.consumers(), graph.producer()
    chains = [chain for node in graph.nodes if (chain := _projection(graph, consumers, producer, node)) is not None
              and not any(id(cut) in in_tasks for cut in chain.cuts)]
    if not chains:
        return graph
    position = {id(node): index for index, node in enumerate(graph.nodes)}
    at_first_cut = {id(min(chain.cuts, key=lambda cut: position[id(cut)])): chain for chain in chains}
    replaced = {id(node) for chain in chains
                for node in (chain.merge, chain.product, chain.bias_add, chain.view, chain.transpose, *chain.cuts)
                if node is not None}
    values, constants = dict(graph.values), dict(graph.constants)
    nodes: list[Node] = []

    def declare(name: str, spec: TensorSpec, value: np.ndarray | None = None) -> str:
        values[name] = spec
        if value is not None:
            constants[name] = value
        return name

    for node in graph.nodes:
        chain = at_first_cut.get(id(node))
        if chain is not None:
            nodes += [made for index, part in enumerate(chain.parts)
                      for made in _part_nodes(graph, chain, part, f"::part{index}", declare)]
        elif id(node) not in replaced:
            nodes.append(node)
    return with_nodes(graph, nodes, values, constants)


def _part_nodes(graph: Graph, chain: _Projection, part: _Part, tag: str, declare: Callable[..., str]) -> list[Node]:
    """The nodes computing one part of `chain`, the last writing the cut's output name."""
    product = chain.product
    columns = np.take(np.arange(math.prod(chain.grid)).reshape(chain.grid), np.arange(part.lo, part.hi),
                      axis=chain.axis).reshape(-1)
    columns_first = product.op_type == "Gemm" and bool(product.attrs.get("transB", 0))  # b is (N, K)
    gemm_bias = product.inputs[2] if len(product.inputs) > 2 and product.inputs[2] else None
    add_bias = next((name for name in chain.bias_add.inputs if name in graph.constants), None) \
        if chain.bias_add is not None else None
    out_spec = graph.values[part.output]
    nodes: list[Node] = []

    def gathered(name: str, axis: int) -> str:
        """The constant's part columns along `axis`, under a name of this projection's part (a
        weight two projections share, cut differently, gets one constant for each)."""
        taken = np.take(graph.constants[name], columns, axis=axis)
        return declare(f"{name}::{product.name}{tag}", TensorSpec(taken.shape, graph.values[name].dtype), taken)

    def made(node: Node, inputs: list[str], shape: tuple[int, ...], last: bool) -> str:
        output = part.output if last else declare(node.outputs[0] + tag, TensorSpec(shape, out_spec.dtype))
        nodes.append(replace(node, name=node.name + tag, inputs=inputs, outputs=[output]))
        return output

    rows = product.inputs[0]
    if chain.merge is not None:  # each part's GEMM reads its own rows view
        rows = declare(rows + tag, graph.values[rows])
        nodes.append(replace(chain.merge, name=chain.merge.name + tag, outputs=[rows]))
    flat = (*graph.values[product.outputs[0]].shape[:-1], len(columns))
    last_step = "transpose" if chain.transpose is not None else "view" if chain.view is not None else \
        "bias" if chain.bias_add is not None else "product"
    inputs = [rows, gathered(product.inputs[1], 0 if columns_first else 1)]
    if gemm_bias is not None:
        inputs.append(gathered(gemm_bias, 0))
    value = made(product, inputs, flat, last_step == "product")
    if chain.bias_add is not None:
        value = made(chain.bias_add, [gathered(name, 0) if name == add_bias else value
                                      for name in chain.bias_add.inputs], flat, last_step == "bias")
    cut_axis = len(flat) - 1  # where the grid's cut axis is in the part's own view
    if chain.view is not None:
        viewed = graph.values[chain.view.outputs[0]].shape
        cut_axis = len(viewed) - len(chain.grid) + chain.axis
        shape = [*viewed]
        shape[cut_axis] = part.hi - part.lo
        if part.squeezed:
            del shape[cut_axis]
        target = declare(f"{chain.view.outputs[0]}::shape{tag}", TensorSpec((len(shape),), "int64"),
                         np.array(shape, np.int64))
        value = made(chain.view, [value, target], tuple(shape), last_step == "view")
    if chain.transpose is not None:
        perm = list(chain.transpose.attrs["perm"])
        if part.squeezed:
            perm = [axis - (axis > cut_axis) for axis in perm if axis != cut_axis]
        made(replace(chain.transpose, attrs={**chain.transpose.attrs, "perm": perm}), [value], out_spec.shape, True)
    return nodes


@dataclass
class GroupNorm:
    """A group normalization as a graph writes it, its affine per channel (C,) in float64."""

    nodes: list[Node]  # what computes it, in graph order
    x: str  # (N, C, spatial...)
    out: str
    groups: int
    eps: float
    scale: np.ndarray
    shift: np.ndarray


def group_norm_at(graph: Graph, producer: dict[str, Node], sole_reader: Callable[[str], Node | None],
                  node: Node) -> GroupNorm | None:
    """The group normalization that `node` (a GroupNormalization or an InstanceNormalization) is the
    heart of, with the per-channel Mul and Add after it: torch's export of GroupNorm (a Reshape to
    (N, G, L), an InstanceNormalization with scale 1 and bias 0, a Reshape back, then the affine:
    Stable Diffusion's UNet and VAE, BiT, PoolFormer, wav2vec2's feature extractor), an
    InstanceNormalization of (N, C, ...) (a group per channel) or the GroupNormalization op (its
    opset-18 scale per group spread over the group's channels). `sole_reader(value)`: the one node
    that reads an intermediate value, else None. None where `node` is none of these."""
    if node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
        return None
    x, out = node.inputs[0], node.outputs[0]
    scale, shift = (graph.constants.get(name) for name in node.inputs[1:3])
    eps = float(node.attrs.get("epsilon", 1e-5))
    if scale is None or shift is None or graph.values[x].dtype not in FLOAT_DTYPES:
        return None
    nodes = [node]
    if node.op_type == "GroupNormalization":
        shape, groups = graph.values[x].shape, int(node.attrs["num_groups"])
        if len(shape) < 3 or shape[1] % groups or scale.size not in (groups, shape[1]):
            return None
        spread = shape[1] // groups if scale.size == groups else 1
        scale, shift = np.repeat(scale.reshape(-1), spread), np.repeat(shift.reshape(-1), spread)
    elif node.op_type == "InstanceNormalization":
        grouped = producer.get(x)
        back = sole_reader(out)
        if grouped is not None and grouped.op_type == "Reshape" and back is not None and back.op_type == "Reshape" \
                and sole_reader(x) is node \
                and graph.values[back.outputs[0]].shape == graph.values[grouped.inputs[0]].shape:
            # torch's GroupNorm: the groups are the middle axis of the (N, G, L) view
            shape, (batch, groups, _) = graph.values[grouped.inputs[0]].shape, graph.values[x].shape
            if len(shape) < 3 or shape[0] != batch or shape[1] % groups or np.any(scale != 1) or np.any(shift != 0):
                return None
            x, out, nodes = grouped.inputs[0], back.outputs[0], [grouped, node, back]
            scale, shift = np.ones(shape[1]), np.zeros(shape[1])
        else:
            shape = graph.values[x].shape
            groups = shape[1] if len(shape) >= 3 else 0
            if not groups or scale.size != groups:
                return None
    else:
        return None
    scale, shift = scale.astype(np.float64).reshape(-1), shift.astype(np.float64).reshape(-1)
    for ops in (("Mul",), ("Add", "Sub")):  # the affine after the statistics, where it is one per channel
        after = sole_reader(out)
        affine = channel_affine(graph, after, out, 1) if after is not None and after.op_type in ops else None
        if affine is None:
            continue
        factor, offset = affine
        scale, shift = scale * factor, shift * factor + offset
        nodes.append(after)
        out = after.outputs[0]
    return GroupNorm(nodes, x, out, groups, eps, scale, shift)


def channel_affine(graph: Graph, node: Node, value: str, channel_axis: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, shift) per channel when `node` computes scale * value + shift with constants: an
    inference BatchNormalization (or its NHWC op) of value, or value times, plus, minus or over a
    constant one per channel (or a single one). What a conv folds into its weights and a group norm
    into its affine."""
    shape = graph.values[value].shape
    channels = shape[channel_axis]
    ones, zeros = np.ones(channels), np.zeros(channels)
    if node.op_type == (NHWC_OPS["BatchNormalization"] if channel_axis == 3 else "BatchNormalization"):
        params = [param for name in node.inputs[1:5]
                  if (param := _per_channel(graph, name, shape, channel_axis, flat=True)) is not None]
        if node.inputs[0] != value or node.attrs.get("training_mode", 0) or any(node.outputs[1:]) \
                or len(params) != 4:
            return None
        gamma, beta, mean, var = params
        scale = gamma / np.sqrt(var + node.attrs.get("epsilon", 1e-5))
        return scale, beta - mean * scale
    if node.op_type not in ("Mul", "Div", "Add", "Sum", "Sub") or len(node.inputs) != 2 or value not in node.inputs \
            or graph.values[node.outputs[0]].shape != shape:
        return None
    constant = _per_channel(graph, node.inputs[1] if node.inputs[0] == value else node.inputs[0], shape, channel_axis)
    if constant is None:
        return None
    if node.op_type == "Mul":
        return constant, zeros
    if node.op_type in ("Add", "Sum"):
        return ones, constant
    if node.op_type == "Sub" and node.inputs[0] == value:
        return ones, -constant
    if node.op_type == "Div" and node.inputs[0] == value and np.all(constant != 0.0):
        return 1.0 / constant, zeros
    return None


def _per_channel(graph: Graph, name: str, shape: tuple[int, ...], channel_axis: int, *,
                 flat: bool = False) -> np.ndarray | None:
    """A float constant that applies one value per channel of a value of `shape`, as (C,).

    `flat`: BatchNormalization's (C,) parameters; otherwise broadcasting must put the values on
    the channel axis (NCHW's 1: (C, 1, 1), (1, C, 1, 1); NHWC's 3: (C,), (1, 1, 1, C)) or be a
    single value.
    """
    value = graph.constants.get(name)
    channels = shape[channel_axis]
    if value is None or value.dtype.name not in FLOAT_DTYPES:
        return None
    as_float = value.astype(np.float64)
    if value.size == 1:
        return np.full(channels, float(as_float.reshape(())))
    padded = (1,) * (len(shape) - value.ndim) + tuple(value.shape) if value.ndim <= len(shape) else ()
    on_axis = tuple(channels if axis == channel_axis else 1 for axis in range(len(shape)))
    if (flat and value.shape == (channels,)) or (not flat and padded == on_axis):
        return as_float.reshape(channels)
    return None


def group_norms_as_ops(graph: Graph) -> Graph:
    """Every group normalization (group_norm_at) as one GroupNormalization node with its affine per
    channel, so the channels-last rewrite can carry it in NHWC (its stretch would otherwise end at
    torch's Reshape to groups, with a Transpose each side). Only for graphs whose glue is not
    onnxruntime's: an opset-17 model has no GroupNormalization op there. The graph itself where there
    is none."""
    consumers, producer = graph.consumers(), graph.producer()
    found: dict[int, GroupNorm] = {}  # id(first node) -> the norm
    covered: set[int] = set()
    for node in graph.nodes:
        if id(node) in covered:
            continue
        norm = group_norm_at(graph, producer, lambda value: _sole_consumer(graph, consumers, value), node)
        if norm is not None:
            found[id(norm.nodes[0])] = norm
            covered.update(id(member) for member in norm.nodes)
    if not found:
        return graph
    nodes: list[Node] = []
    constants, values = dict(graph.constants), dict(graph.values)
    for node in graph.nodes:
        if id(node) in found:
            norm = found[id(node)]
            name = norm.nodes[-1].name or norm.out
            params = []
            for part, array in (("scale", norm.scale), ("shift", norm.shift)):
                constants[f"{name}::{part}"] = array.astype(graph.values[norm.x].dtype)
                values[f"{name}::{part}"] = TensorSpec(array.shape, graph.values[norm.x].dtype)
                params.append(f"{name}::{part}")
            nodes.append(Node(name, "GroupNormalization", [norm.x, *params], [norm.out],
                              {"num_groups": norm.groups, "epsilon": norm.eps}))
        elif id(node) not in covered:
            nodes.append(node)
    return with_nodes(graph, nodes, values, constants)
