"""Partition a graph into kernel tasks: the fusion groups a kernel implements.

`partition(graph)` walks the (constant-folded) graph in topological order and claims nodes for the
patterns below, first match wins; the nodes no task claims are glue (Reshape, Transpose, Gather...)
that the runtime runs with the numpy executor. A task's nodes run by the executor reproduce its
subgraph exactly (`Task.reference`), so a kernel is checked against the model's own semantics.

Patterns (kinds and kernel signatures are in tasks.py):
  attention   MatMul(Q, K^T) [-> Div|Mul scalar] [-> Tanh -> Mul cap] [-> Add mask] [-> Add causal
              constant] [-> Max(the dtype's lowest)] -> Softmax(last axis) -> MatMul(., V), or the
              Attention op (opset 23) without a key/value cache (_match_attention_op); scalar
              Mul/Div on Q or K^T (the SDPA export) folds into `scale`; cap * tanh(scores / cap)
              (Gemma 2) is attrs["softcap"]; float16 q and k cast to float32 for the scores, with the
              probabilities cast back for the product with v (GPT-J, CodeGen), are a float16 task
              (the Casts inside it); a Transpose swapping the last two axes of K folds into
              k_transposed=False. A constant mask that is 0 on and below the (bottom-right aligned)
              diagonal and <= -1e4 above is `causal` and stays a task constant; XGLM's Max clamps
              only -inf.
              With fold_attention_transposes (a backend whose kernels read through strides), the
              Transposes that split the heads of q, k, v (sole users) and the one that merges the
              output's are the task's too: its operands are the contiguous buffers around them and
              attrs["perms"] says how (see tasks.py), so no head-split copy is ever made.
              Constant biases added one after another (a position bias, then Swin's shifted-window
              mask added in a view that splits the batch into images x windows) fold into one
              constant mask (B or 1, H or 1, S, Sk), its reference one Add and an Identity in the
              place of each other node of the chain.
              With share_kv_heads (a backend whose kernels read one key/value head for each group
              of query heads), K and V repeated as transformers' repeat_kv writes it (Unsqueeze at
              axis 2, Expand, Reshape: grouped-query attention) are read before the repeat: the
              task's k and v have H / G heads, and no repeated copy is made.
  gemm        MatMul(x, W 2-D) or Gemm (alpha = beta = 1, no transA)
              -> [Add bias (N,)] -> [activation] -> [Add residual]:  out = act(x@W + bias) + residual
              (a Reshape merging x's leading axes into rows before it and one splitting them back
              after it are views: the task is the GEMM on the unmerged x, as GPT-2's Conv1D)
  bmm         MatMul with both operands >= 3-D -> [Mul|Div scalar]   (scale)
  conv2d      Conv [-> BatchNormalization, per-channel Mul/Add/Sub/Div by constants: folded]
              -> [Add residual] -> [activation]:  out = act(conv(x, w) + bias + residual)  (the
              ResNet order). Folding yields new weights/bias (when the conv's are constants) that
              live in Task.constants under the task's input names. With scale_conv_inputs (a
              backend whose convs scale x as they load it), a Mul of x by a runtime gate (N, C, 1, 1)
              that only the conv reads (squeeze-excite's) is part of the task (attrs input_scale).
  pool        MaxPool, AveragePool (no ceil_mode, no dilation), GlobalAveragePool
  The NHWC ops of layout.py (NhwcConv, NhwcBatchNormalization, the Nhwc pools: a backend with
  conv_layout "NHWC") match as conv2d and pool with attrs["layout"] = "nhwc" (tasks.py).
  layernorm   LayerNormalization (last axis), or ReduceMean -> Sub -> Pow 2 | Mul(d,d) -> ReduceMean
              -> Add eps -> Sqrt -> Div | Reciprocal*x -> Mul gamma -> Add beta
  groupnorm   Reshape to (N, G, L) -> InstanceNormalization (scale 1, bias 0) -> Reshape back (torch's
              GroupNorm export), InstanceNormalization of (N, C, ...), or GroupNormalization; then
              Mul and Add/Sub by per-channel constants (the affine) -> [activation]
              (rewrites.group_norm_at; on a channels-last graph its NHWC op, attrs["layout"])
  rmsnorm     Pow 2 | Mul(x,x) -> ReduceMean -> Add eps -> Sqrt -> Div | Reciprocal*x -> Mul gamma, or
              RMSNormalization (opset 23) over the last axis
              (both norms: the scale may follow a Cast that keeps the dtype, as transformers writes;
              a norm computed in a wider float, its input cast up and the result cast back, is a
              task on the input's dtype)
  softmax     Softmax over the last axis (outside attention)
  rotary      Add(Mul(x, cos), Mul(Concat(Neg(Slice(x, D/2:)), Slice(x, :D/2)), sin)) over the last
              axis (transformers' apply_rotary_pos_emb), or with the columns rotated in pairs,
              Reshape(Concat(Unsqueeze(Neg(x[..., 1::2])), Unsqueeze(x[..., ::2]))) (GPT-J, RoFormer:
              attrs["interleaved"]), with fuse_rotary (a backend with a rotary
              kernel); with fold_attention_transposes the head-split Transpose before it is folded
              in (attrs["perm"]), so the heads are rotated in place and written where attention reads.
              A partial rotary (GPT-NeoX, Phi) rotates the Slice x[..., :R] of the heads and Concats
              x[..., R:] back: both Slices and the Concat are in the task (attrs["rotary_dims"] = R)
  reduce      ReduceSum/Mean/Max/Min (outside norms)
  elementwise maximal trees of elementwise ops whose intermediates have one consumer

Activations are recognised by what they compute, not by how an exporter spelled them: the largest
closed elementwise region fed only by the pre-activation value and scalar constants is evaluated
on probe points; the closest of relu, gelu (erf), gelu_tanh, silu, sigmoid, tanh (and relu6 =
Clip(0, 6), convolutions only) wins if it is within a tolerance set by the constants' precision.
A two-input Sum counts as an Add (older exports' residual adds).

Every task's nodes are in graph order and are the graph's own nodes (same names), except that a
folded conv task runs a new Conv (the conv's name, folded weights) and an Identity in the place of
each folded node (BN, per-channel scale or shift), and a groupnorm task runs opset-13 steps under the
names of the nodes it replaces (the last one's on the steps past them);
so a runtime that skips a task's nodes by name and runs its kernel at the last one is correct.

Elementwise expressions (attrs["expr"]) are a tuple of steps; step i defines "t{i}", the last step
is the output; operands are task inputs "in0".."inK" (in the task's input order), earlier steps,
or inline Python floats (scalar constants):
  binary  ("add"|"sub"|"mul"|"div"|"pow"|"max"|"min", a, b)
  unary   ("sqrt"|"exp"|"log"|"tanh"|"sigmoid"|"relu"|"erf"|"neg"|"abs"|"reciprocal"|"gelu"|"gelu_tanh", a)
  other   ("cast", a, dtype_name)   ("where", condition, a, b)
Clip becomes max then min. `evaluate_expr` is the numpy meaning of an expression.

FLOPs (documented estimates; the roofline uses them):
  gemm 2*M*N*K + per output element: bias 1, residual 1, activation ACTIVATION_FLOPS
  bmm 2*B*M*N*K (+1 per output element when scaled); attention 4*B*H*S*Sk*D
  conv2d 2*N*OC*OH*OW*(C/g)*KH*KW + the same epilogue as gemm; pool OH*OW*KH*KW per plane
  softmax 5, layernorm 8, rmsnorm 6, groupnorm 8 (+ its activation's) per element; reduce 1 per input element;
  elementwise 1 per step per output element.
min_bytes: every input read once plus every output written once, at their dtypes.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

import ml_dtypes
import numpy as np

from .executor import _explicit_pads, one_axis_cut
from .ir import Graph, Node, TensorSpec, connected_groups
from .layout import NHWC_OPS, ONNX_OF, channels_last, conv1d_as_2d, is_channels_last
from .rewrites import (GroupNorm, channel_affine, collapse_layout_chains, drop_identity_arithmetic, einsums_as_matmuls,
                       fold_column_affines, fold_pads_into_convs, group_norm_at, group_norms_as_ops, query_scales,
                       reassociate_residuals, reduce_axes, spatial_means_as_pools, split_projections)
from .tasks import EXPRESSION_ACTIVATIONS, FLOAT_DTYPES, Task, freeze_attrs

if TYPE_CHECKING:
    from .backends.base import Backend


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


ACTIVATION_FUNCS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "gelu_tanh": lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x * _sigmoid(x),
    "sigmoid": _sigmoid,
    "tanh": np.tanh,
    "relu6": lambda x: np.clip(x, 0.0, 6.0),
    "hardswish": lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0),  # MobileNetV3's, LeViT's
    "relu_squared": lambda x: np.square(np.maximum(x, 0.0)),  # Nemotron's, Persimmon's MLP (primer's relu^2)
}
ACTIVATION_FLOPS = {"none": 0, "relu": 1, "relu6": 2, "sigmoid": 4, "tanh": 4, "silu": 5,
                    "gelu": 8, "gelu_tanh": 10, "hardswish": 5, "relu_squared": 2}
EPILOGUE_ACTIVATIONS = tuple(ACTIVATION_FUNCS)  # what a GEMM's or a conv's epilogue applies, on every backend

_UNARY_STEPS = {"Sqrt": "sqrt", "Exp": "exp", "Log": "log", "Tanh": "tanh", "Sigmoid": "sigmoid",
                "Relu": "relu", "Erf": "erf", "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal"}
_BINARY_STEPS = {"Add": "add", "Sum": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Pow": "pow",
                 "Max": "max", "Min": "min"}
_UNARY_FUNCS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sqrt": np.sqrt, "exp": np.exp, "log": np.log, "erf": _erf, "neg": np.negative, "abs": np.abs,
    "reciprocal": np.reciprocal, **{name: ACTIVATION_FUNCS[name] for name in EXPRESSION_ACTIVATIONS}}
_BINARY_FUNCS: dict[str, Callable[[Any, Any], np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "pow": np.power,
    "max": np.maximum, "min": np.minimum}
_ADDS = ("Add", "Sum")  # a two-input Sum (older exports' residual add) is an Add
# the float dtypes each float dtype converts to and back exactly
_EXACT_WIDENINGS = {"float16": ("float32", "float64"), "bfloat16": ("float32", "float64"), "float32": ("float64",)}
_MAX_ACTIVATION_NODES = 12
_CAUSAL_MASKED_AT_MOST = -1e4
_PROBE = np.linspace(-8.0, 8.0, 161)
_MATCH_TOLERANCE = 1e-5  # float32 constants; lower-precision constants widen it

Expr = tuple[tuple[Any, ...], ...]


def evaluate_expr(expr: Expr, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """The numpy meaning of an elementwise expression (float64 unless a step casts)."""
    values: dict[str, Any] = {}
    for index, value in enumerate(inputs):
        value = np.asarray(value)
        values[f"in{index}"] = value.astype(np.float64) if value.dtype.name in FLOAT_DTYPES else value

    def operand(ref: Any) -> Any:
        return values[ref] if isinstance(ref, str) else ref

    result: Any = None
    for index, (op, *args) in enumerate(expr):
        if op in _UNARY_FUNCS:
            result = _UNARY_FUNCS[op](np.asarray(operand(args[0]), dtype=np.float64))
        elif op in _BINARY_FUNCS:
            result = _BINARY_FUNCS[op](operand(args[0]), operand(args[1]))
        elif op == "cast":
            result = np.asarray(operand(args[0])).astype(args[1])
        elif op == "where":
            result = np.where(operand(args[0]), operand(args[1]), operand(args[2]))
        else:
            raise ValueError(f"unknown expression step {op!r}")
        values[f"t{index}"] = result
    return np.asarray(result)


def canonical_float(value: float | np.ndarray, dtype: str = "float32") -> float:
    """The shortest decimal that round-trips at `dtype`: 1/8 from a Div and a Mul give one key."""
    return float(str(np.asarray(value, dtype=dtype).reshape(())[()]))


@dataclass
class _Match:
    """A recognised fusion group before it becomes a Task."""

    kind: str
    covers: list[Node]  # the graph nodes the task replaces
    inputs: list[str]  # canonical kernel input order
    output: str
    attrs: dict[str, Any]
    flops: int
    nodes: list[Node] | None = None  # what the reference runs, when not `covers` (folded BN)
    folded: dict[str, np.ndarray] = field(default_factory=dict)  # new constants under input names


class _Context:
    """Read-only views of the graph plus the set of nodes already claimed by a task."""

    def __init__(self, graph: Graph, fold_attention_transposes: bool = False, share_kv_heads: bool = False,
                 fuse_rotary: bool = False, scale_conv_inputs: bool = False) -> None:
        self.graph = graph
        self.fold_attention_transposes = fold_attention_transposes
        self.share_kv_heads = share_kv_heads
        self.fuse_rotary = fuse_rotary
        self.scale_conv_inputs = scale_conv_inputs
        self.producer = graph.producer()
        self.position = {id(node): index for index, node in enumerate(graph.nodes)}
        self.users: dict[str, list[Node]] = {}
        for name, nodes in graph.consumers().items():
            unique = {id(node): node for node in nodes}
            self.users[name] = list(unique.values())
        self.graph_outputs = set(graph.outputs)
        self.claimed: set[int] = set()

    def spec(self, name: str) -> TensorSpec:
        return self.graph.values[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.graph.values[name].shape

    def scalar(self, name: str) -> float | None:
        """A one-element constant as written in an expression (canonical at its dtype), else None."""
        value = self.graph.constants.get(name)
        if value is None or value.size != 1 or not (value.dtype.kind in "iu" or value.dtype.name in FLOAT_DTYPES):
            return None
        return canonical_float(value, value.dtype.name)

    def exact_scalar(self, name: str) -> float | None:
        """A one-element constant's exact value, for arithmetic (scales) before canonicalising."""
        return None if self.scalar(name) is None else float(self.graph.constants[name].reshape(())[()])

    def sole_user(self, value: str, *op_types: str) -> Node | None:
        """The one unclaimed consumer of an intermediate value (of one of `op_types`)."""
        users = self.users.get(value, [])
        if value in self.graph_outputs or len(users) != 1 or id(users[0]) in self.claimed:
            return None
        node = users[0]
        return node if not op_types or node.op_type in op_types else None

    def is_copy(self, node: Node) -> bool:
        """An Identity, or a Cast to the dtype its input already has (transformers casts to the
        input's dtype: softmax's float32 probabilities, LlamaRMSNorm's output, a residual)."""
        return node.op_type == "Identity" or (
            node.op_type == "Cast" and self.spec(node.outputs[0]).dtype == self.spec(node.inputs[0]).dtype)

    def widens(self, node: Node | None) -> bool:
        """A Cast to a float dtype that holds every value of its input's exactly (float16 to
        float32): the way back to the input's dtype returns the value unchanged."""
        return node is not None and node.op_type == "Cast" and \
            self.spec(node.outputs[0]).dtype in _EXACT_WIDENINGS.get(self.spec(node.inputs[0]).dtype, ())

    def cast_back(self, value: str, dtype: str) -> Node | None:
        """The sole user of `value` when it is a Cast to `dtype`."""
        node = self.sole_user(value, "Cast")
        return node if node is not None and self.spec(node.outputs[0]).dtype == dtype else None

    def pass_through(self, value: str) -> tuple[str, list[Node]]:
        """Follow `value` through sole users that copy it unchanged (is_copy), and through a
        widening Cast with the Cast back after it (transformers' softmax probabilities in a
        float16 model: float32 and back), so a pattern sees past them; the nodes passed become
        part of the match."""
        passed: list[Node] = []
        while (node := self.sole_user(value, "Identity", "Cast")) is not None:
            if self.is_copy(node):
                steps = [node]
            elif self.widens(node) and (back := self.cast_back(node.outputs[0], self.spec(value).dtype)):
                steps = [node, back]
            else:
                break
            passed += steps
            value = steps[-1].outputs[0]
        return value, passed

    def other_input(self, node: Node, value: str) -> str | None:
        """The second operand of a binary node one of whose operands is `value`."""
        if len(node.inputs) != 2 or value not in node.inputs:
            return None
        first, second = node.inputs
        return second if first == value else first

    def closed(self, nodes: Sequence[Node], output: str, inner: Collection[str] = ()) -> bool:
        """Every value made inside (and every `inner` value) is read only inside, except `output`."""
        ids = {id(node) for node in nodes}
        made = {name for node in nodes for name in node.outputs if name} | set(inner)
        for name in made - {output}:
            if name in self.graph_outputs:
                return False
            if any(id(user) not in ids for user in self.users.get(name, [])):
                return False
        return True

    def is_float(self, name: str) -> bool:
        return self.spec(name).dtype in FLOAT_DTYPES


# ----------------------------------------------------------------------------- expressions


def _node_steps(ctx: _Context, node: Node, refs: dict[str, Any], steps: list[tuple[Any, ...]]) -> None:
    """Append the steps of one elementwise node; `refs` maps value names to operands."""
    def ref(index: int) -> Any:
        name = node.inputs[index] if index < len(node.inputs) else ""
        return refs[name] if name in refs else (ctx.scalar(name) if name else None)

    def emit(*step: Any) -> str:
        steps.append(step)
        return f"t{len(steps) - 1}"

    op = node.op_type
    if op in _UNARY_STEPS:
        out = emit(_UNARY_STEPS[op], ref(0))
    elif op in _BINARY_STEPS:
        out = emit(_BINARY_STEPS[op], ref(0), ref(1))
    elif op == "Gelu":
        out = emit("gelu_tanh" if node.attrs.get("approximate", "none") == "tanh" else "gelu", ref(0))
    elif op == "Cast":  # a copy is no step
        out = ref(0) if ctx.is_copy(node) else emit("cast", ref(0), ctx.spec(node.outputs[0]).dtype)
    elif op == "Where":
        out = emit("where", ref(0), ref(1), ref(2))
    elif op in ("HardSigmoid", "HardSwish"):  # min(max(alpha x + beta, 0), 1) [times x]: steps every backend has
        alpha, beta = (canonical_float(node.attrs.get("alpha", 0.2)), canonical_float(node.attrs.get("beta", 0.5))) \
            if op == "HardSigmoid" else (canonical_float(1 / 6), 0.5)
        out = emit("min", emit("max", emit("add", emit("mul", ref(0), alpha), beta), 0.0), 1.0)
        if op == "HardSwish":
            out = emit("mul", ref(0), out)
    else:  # Clip
        low, high = _clip_bounds(ctx, node)
        out = ref(0)
        if low is not None:
            out = emit("max", out, low)
        if high is not None:
            out = emit("min", out, high)
    refs[node.outputs[0]] = out


def _clip_bounds(ctx: _Context, node: Node) -> tuple[float | None, float | None]:
    if "min" in node.attrs or "max" in node.attrs:  # opset < 11
        low, high = node.attrs.get("min"), node.attrs.get("max")
        return (None if low is None else canonical_float(low), None if high is None else canonical_float(high))
    low, high = (ctx.scalar(node.inputs[index]) if index < len(node.inputs) and node.inputs[index] else None
                 for index in (1, 2))
    return low, high


def _is_elementwise(ctx: _Context, node: Node) -> bool:
    """An op the expression language covers, on floats, with scalar constants where it needs them."""
    op = node.op_type
    if node.domain not in ("", "ai.onnx") or len(node.outputs) != 1 or not ctx.is_float(node.outputs[0]):
        return False
    data = [name for name in node.inputs if name]
    if op == "Where":
        return len(data) == 3 and ctx.is_float(data[1]) and ctx.is_float(data[2])
    if not all(ctx.is_float(name) or ctx.scalar(name) is not None for name in data):
        return False
    if op in _UNARY_STEPS or op in ("Gelu", "Cast", "HardSigmoid", "HardSwish"):
        return len(data) == 1
    if op == "Pow":
        return len(node.inputs) == 2 and ctx.scalar(node.inputs[1]) is not None
    if op in _BINARY_STEPS:
        return len(node.inputs) == 2
    if op == "Clip":
        return all(ctx.scalar(name) is not None for name in node.inputs[1:] if name)
    return False


def _build_expr(ctx: _Context, nodes: Sequence[Node], inputs: Sequence[str]) -> Expr:
    refs: dict[str, Any] = {name: f"in{index}" for index, name in enumerate(inputs)}
    steps: list[tuple[Any, ...]] = []
    for node in nodes:
        _node_steps(ctx, node, refs, steps)
    return tuple(steps)


def _identify_activation(ctx: _Context, region: Sequence[Node], value: str) -> str | None:
    """The known activation closest to what the region computes on probe points, if close enough.

    Close enough scales with the precision of the region's constants: an fp16 export's sqrt(2) is
    1.414, and must still read as gelu (the closest, not the first, candidate wins).
    """
    expr = _build_expr(ctx, region, [value])
    scalars = [ctx.graph.constants[name] for node in region for name in node.inputs if ctx.scalar(name) is not None]
    tolerance = max([_MATCH_TOLERANCE] + [8 * float(ml_dtypes.finfo(c.dtype).eps) for c in scalars
                                          if c.dtype.name in FLOAT_DTYPES])
    with np.errstate(all="ignore"):
        got = evaluate_expr(expr, [_PROBE]).astype(np.float64)
        if got.shape != _PROBE.shape:
            return None
        errors = {name: float(np.max(np.abs(got - want) / (1.0 + np.abs(want))))
                  for name, want in ((name, func(_PROBE)) for name, func in ACTIVATION_FUNCS.items())}
    best = min(errors, key=errors.__getitem__)
    return best if errors[best] < tolerance else None


def _match_activation(ctx: _Context, value: str) -> tuple[str, list[Node], str]:
    """The largest closed elementwise region on `value` computing a known activation."""
    best: tuple[str, list[Node], str] = ("none", [], value)
    region: list[Node] = []
    available = {value}
    while len(region) < _MAX_ACTIVATION_NODES:
        in_region = {id(node) for node in region}
        candidates = [
            user for name in available for user in ctx.users.get(name, [])
            if id(user) not in in_region and id(user) not in ctx.claimed and _is_elementwise(ctx, user)
            and all(name in available or ctx.scalar(name) is not None for name in user.inputs if name)]
        if not candidates:
            break
        step = min(candidates, key=lambda node: ctx.position[id(node)])
        region.append(step)
        available.add(step.outputs[0])
        out = step.outputs[0]
        if ctx.closed(region, out, {value}):
            name = _identify_activation(ctx, region, value)
            if name is not None:
                best = (name, list(region), out)
    return best


# ----------------------------------------------------------------------------- patterns


def _epilogue(ctx: _Context, value: str, bias_of: int | None,
              residual_first: bool) -> tuple[list[Node], str | None, str, str, str | None]:
    """What follows a contraction: (nodes, bias, activation, out, residual).

    A bias Add of shape (bias_of,) is fused only when `bias_of` is given (a gemm without one). A
    residual after the activation may also be a Mul by a tensor of the output's shape (a gate,
    SwiGLU's silu(x @ W_gate) * up): the last node says which (`_residual_op`).
    """
    nodes: list[Node] = []
    cur = value
    bias = None
    if bias_of is not None:
        add = ctx.sole_user(cur, *_ADDS)
        other = add and ctx.other_input(add, cur)
        if add and other and ctx.shape(other) == (bias_of,) and ctx.shape(add.outputs[0]) == ctx.shape(cur):
            nodes.append(add)
            bias, cur = other, add.outputs[0]

    def take_residual(*ops: str) -> str | None:
        nonlocal cur
        joined = _residual_join(ctx, cur, *ops)
        if joined is None:
            return None
        nodes.append(joined[0])
        cur = joined[0].outputs[0]
        return joined[1]

    residual = take_residual(*_ADDS) if residual_first else None
    activation, region, cur = _match_activation(ctx, cur)
    nodes.extend(region)
    if not residual_first:
        residual = take_residual(*_ADDS, "Mul")
    return nodes, bias, activation, cur, residual


def _residual_join(ctx: _Context, value: str, *ops: str) -> tuple[Node, str] | None:
    """(the node, its other operand) where value's only reader joins it with a tensor of its own
    dtype and shape by one of `ops` (a residual add, or a gate's Mul)."""
    node = ctx.sole_user(value, *ops)
    other = node and ctx.other_input(node, value)
    if node and other and other != value and ctx.spec(other) == ctx.spec(value) \
            and ctx.shape(node.outputs[0]) == ctx.shape(value):
        return node, other
    return None


def _residual_op(epilogue: list[Node]) -> dict[str, str]:
    """The gemm attribute of a residual that multiplies (the epilogue's last node a Mul); {} for an add."""
    return {"residual_op": "mul"} if epilogue and epilogue[-1].op_type == "Mul" else {}


def _epilogue_flops(numel: int, bias: bool, activation: str, residual: bool) -> int:
    return numel * (int(bias) + ACTIVATION_FLOPS[activation] + int(residual))


def _match_gemm(ctx: _Context, node: Node) -> _Match | None:
    a, b = node.inputs[0], node.inputs[1]
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    if len(b_shape) != 2 or len(a_shape) < 2:
        return None
    bias = None
    trans_b = False
    if node.op_type == "Gemm":
        attrs = node.attrs
        if attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0 or attrs.get("transA", 0) \
                or len(a_shape) != 2:
            return None
        trans_b = bool(attrs.get("transB", 0))
        if len(node.inputs) > 2 and node.inputs[2]:
            bias = node.inputs[2]
    k, n = (b_shape[1], b_shape[0]) if trans_b else b_shape
    if bias is not None and ctx.shape(bias) != (n,):
        return None
    m = math.prod(a_shape[:-1])
    views, product = _row_views(ctx, a, node, n)
    if views:
        a = views[0].inputs[0]
    epilogue, bias_add, activation, out, residual = _epilogue(
        ctx, product, n if bias is None else None, residual_first=False)
    bias = bias or bias_add
    flops = 2 * m * n * k + _epilogue_flops(m * n, bias is not None, activation, residual is not None)
    attrs = {"activation": activation, "trans_b": trans_b, "bias": bias is not None,
             "residual": residual is not None, **(_residual_op(epilogue) if residual else {})}
    inputs = [a, b] + [name for name in (bias, residual) if name is not None]
    return _Match("gemm", [*views, node] + epilogue, inputs, out, attrs, flops)


def _row_views(ctx: _Context, a: str, gemm: Node, n: int) -> tuple[list[Node], str]:
    """(the two Reshapes, the product past them) where a Reshape merges an operand's leading axes
    into rows for a 2-D Gemm or MatMul and another splits the product's rows back (GPT-2's Conv1D:
    view, addmm, view): views of the same memory, so the task is the GEMM on the unmerged operand,
    as a MatMul on it would be, and its epilogue (GELU, the residual) follows the split product.
    Otherwise ([], the product)."""
    merge, product = ctx.producer.get(a), gemm.outputs[0]
    if merge is None or merge.op_type != "Reshape" or ctx.sole_user(a) is not gemm:
        return [], product
    rows = ctx.shape(merge.inputs[0])
    split = ctx.sole_user(product, "Reshape")
    if len(rows) < 3 or rows[-1] != ctx.shape(a)[-1] or split is None \
            or ctx.shape(split.outputs[0]) != (*rows[:-1], n):
        return [], product
    return [merge, split], split.outputs[0]


def _peel_operand(ctx: _Context, value: str, consumer: Node, allow_transpose: bool
                  ) -> tuple[str, float, bool, list[Node]]:
    """Walk up through scalar Mul/Div and (once) a last-two-axes Transpose feeding `consumer`."""
    scale, transposed = 1.0, False
    nodes: list[Node] = []
    while True:
        node = ctx.producer.get(value)
        if node is None or id(node) in ctx.claimed or ctx.sole_user(value) is not (nodes[-1] if nodes else consumer):
            break
        if node.op_type in ("Mul", "Div") and len(node.inputs) == 2 and ctx.exact_scalar(node.inputs[1]):
            factor = ctx.exact_scalar(node.inputs[1]) or 1.0
            scale = scale * factor if node.op_type == "Mul" else scale / factor
            value = node.inputs[0]
        elif node.op_type == "Mul" and ctx.exact_scalar(node.inputs[0]):
            scale *= ctx.exact_scalar(node.inputs[0]) or 1.0
            value = node.inputs[1]
        elif allow_transpose and not transposed and node.op_type == "Transpose" \
                and _swaps_last_two(node.attrs.get("perm"), len(ctx.shape(value))):
            transposed = True
            value = node.inputs[0]
        else:
            break
        nodes.append(node)
    return value, scale, transposed, nodes


def _widened(ctx: _Context, value: str, consumer: Node) -> tuple[str, Node] | None:
    """(the narrower value, the Cast) where `value` is a float16/bfloat16 value cast exactly to
    float32 for `consumer` alone."""
    cast = ctx.producer.get(value)
    if cast is None or id(cast) in ctx.claimed or not ctx.widens(cast) or ctx.sole_user(value) is not consumer:
        return None
    return cast.inputs[0], cast


def _transpose_perm(ctx: _Context, node: Node) -> tuple[int, ...]:
    """A Transpose's perm; ONNX's default (no attribute) reverses the axes."""
    rank = len(ctx.shape(node.inputs[0]))
    return tuple(int(axis) for axis in node.attrs.get("perm") or range(rank - 1, -1, -1))


def _swaps_last_two(perm: Sequence[int] | None, rank: int) -> bool:
    return perm is not None and rank >= 2 and list(perm) == list(range(rank - 2)) + [rank - 1, rank - 2]


def _is_causal(mask: np.ndarray, s: int, sk: int) -> bool:
    """Every (s, sk) plane of the mask is the causal one (bottom-right aligned): a decoder's mask
    built in the graph, once or broadcast over the batch (GPT-2 and LLaMA with an attention mask of
    ones fold it to one plane per example)."""
    if s < 2 or mask.ndim < 2 or mask.shape[-2:] != (s, sk):
        return False
    planes = mask.reshape(-1, s, sk)
    first = planes[0].astype(np.float64)  # one plane at a time: a (B, 1, S, S) mask can be large
    allowed = np.arange(sk)[None, :] <= np.arange(s)[:, None] + (sk - s)
    causal = bool(np.all(first[allowed] == 0.0) and np.all(first[~allowed] <= _CAUSAL_MASKED_AT_MOST))
    return causal and all(np.array_equal(plane, planes[0]) for plane in planes[1:])


def _merged_heads(ctx: _Context, value: str, consumer: Node) -> tuple[str, Node] | None:
    """A 3-D (B*H, X, Y) operand made by a Reshape of a 4-D (B, H, X, Y) value (BLOOM's and
    DeBERTa's attention multiply heads merged into the batch): that value and the Reshape."""
    reshape = ctx.producer.get(value)
    if reshape is None or reshape.op_type != "Reshape" or id(reshape) in ctx.claimed \
            or ctx.sole_user(value) is not consumer:
        return None
    four, three = ctx.shape(reshape.inputs[0]), ctx.shape(value)
    if len(four) != 4 or len(three) != 3 or four[0] * four[1] != three[0] or four[2:] != three[1:]:
        return None
    return reshape.inputs[0], reshape


def _head_split(ctx: _Context, operand: str, readers: Sequence[Node]) -> Node | None:
    """The Transpose that makes `operand` (a head split) where only `readers`, all inside one task,
    read it: the task can read the buffer before it through a perm instead."""
    split = ctx.producer.get(operand)
    users = ctx.users.get(operand, [])
    if split is None or split.op_type != "Transpose" or id(split) in ctx.claimed or operand in ctx.graph_outputs \
            or not users or {id(user) for user in users} - {id(reader) for reader in readers}:
        return None
    return split


def _repeated_heads(ctx: _Context, value: str, consumer: Node) -> tuple[str, list[Node]] | None:
    """(the (B, KVH, S, D) value, the repeat's nodes) where `value` (B, H, S, D) repeats each of its
    heads H / KVH times as transformers' repeat_kv writes it: Unsqueeze (or Reshape) to
    (B, KVH, 1, S, D), Expand to (B, KVH, G, S, D), Reshape to (B, KVH * G, S, D)."""
    reshape = ctx.producer.get(value)
    if reshape is None or reshape.op_type != "Reshape" or ctx.sole_user(value) is not consumer:
        return None
    expand = ctx.producer.get(reshape.inputs[0])
    if expand is None or expand.op_type != "Expand" or ctx.sole_user(expand.outputs[0]) is not reshape:
        return None
    unsqueeze = ctx.producer.get(expand.inputs[0])
    if unsqueeze is None or unsqueeze.op_type not in ("Unsqueeze", "Reshape") \
            or ctx.sole_user(unsqueeze.outputs[0]) is not expand:
        return None
    source = unsqueeze.inputs[0]
    if len(ctx.shape(source)) != 4:
        return None
    b, kv_heads, s, d = ctx.shape(source)
    groups = ctx.shape(expand.outputs[0])[2] if len(ctx.shape(expand.outputs[0])) == 5 else 0
    if ctx.shape(unsqueeze.outputs[0]) != (b, kv_heads, 1, s, d) \
            or ctx.shape(expand.outputs[0]) != (b, kv_heads, groups, s, d) \
            or ctx.shape(value) != (b, kv_heads * groups, s, d):
        return None
    return source, [unsqueeze, expand, reshape]


def _masked_where(ctx: _Context, node: Node, value: str) -> np.ndarray | None:
    """Where a masked fill (Where(cond, fill, value) or Where(cond, value, fill), cond constant,
    fill a scalar at most _CAUSAL_MASKED_AT_MOST) hides scores: True there; None for other Wheres."""
    cond, first, second = node.inputs
    if value not in (first, second) or first == second or cond not in ctx.graph.constants:
        return None
    fill = ctx.exact_scalar(second if first == value else first)
    if fill is None or fill > _CAUSAL_MASKED_AT_MOST:
        return None
    masked = ctx.graph.constants[cond].astype(bool)
    return masked if second == value else ~masked


def _soft_cap(ctx: _Context, scores: str) -> tuple[float, list[Node]] | None:
    """(cap, [Tanh, Mul]) where the scaled scores go through cap * tanh(.) (Gemma 2's attention
    logit soft-capping; the division by cap before the Tanh is a scale the caller has taken)."""
    tanh = ctx.sole_user(scores, "Tanh")
    times = ctx.sole_user(tanh.outputs[0], "Mul") if tanh is not None else None
    cap = ctx.exact_scalar(ctx.other_input(times, tanh.outputs[0]) or "") if times is not None else None
    return (cap, [tanh, times]) if cap is not None and cap > 0 else None


def _match_attention(ctx: _Context, scores_mm: Node) -> _Match | None:
    """softmax(q k^T * scale + mask) v over (B, H, S, D) operands, or over (B*H, S, D) ones that
    Reshapes merge from and split back to (B, H, ...): those Reshapes are views inside the task."""
    q_in, kt_in = scores_mm.inputs
    rank = len(ctx.shape(q_in))
    if rank not in (3, 4) or len(ctx.shape(kt_in)) != rank:
        return None
    q, q_scale, _, q_nodes = _peel_operand(ctx, q_in, scores_mm, allow_transpose=False)
    k, k_scale, k_swapped, k_nodes = _peel_operand(ctx, kt_in, scores_mm, allow_transpose=True)
    q_user = q_nodes[-1] if q_nodes else scores_mm
    k_user = k_nodes[-1] if k_nodes else scores_mm
    if rank == 3:
        q_lift, k_lift = _merged_heads(ctx, q, q_user), _merged_heads(ctx, k, k_user)
        if q_lift is None or k_lift is None:
            return None
        (q, q_user), (k, k_user) = q_lift, k_lift
        q_nodes, k_nodes = q_nodes + [q_user], k_nodes + [k_user]
    scale = q_scale * k_scale
    # GPT-J's and CodeGen's float16 attention: q and k cast to float32 for the scores, the
    # probabilities cast back for the second product, as a float16 kernel computes it anyway
    q_wide, k_wide = _widened(ctx, q, q_user), _widened(ctx, k, k_user)
    narrow_to = None
    if q_wide and k_wide and ctx.spec(q_wide[0]).dtype == ctx.spec(k_wide[0]).dtype:
        (q, q_user), (k, k_user) = q_wide, k_wide
        q_nodes, k_nodes = q_nodes + [q_user], k_nodes + [k_user]
        narrow_to = ctx.spec(q).dtype
    nodes = [scores_mm]
    cur = scores_mm.outputs[0]
    b, h, s, d = ctx.shape(q)
    sk = ctx.shape(kt_in)[-1]
    scores_shape = (b, h, s, sk)
    merged_shape = (b * h, s, sk)
    if ctx.shape(cur) not in (scores_shape, merged_shape):
        return None
    while (node := ctx.sole_user(cur, "Mul", "Div")) is not None:
        factor = ctx.exact_scalar(ctx.other_input(node, cur) or "")
        if not factor or (node.op_type == "Div" and node.inputs[0] != cur):
            break
        scale = scale * factor if node.op_type == "Mul" else scale / factor
        nodes.append(node)
        cur = node.outputs[0]
    softcap = _soft_cap(ctx, cur)
    if softcap is not None:  # cap * tanh(scale * s): the task's scale is the one before the division by cap
        cap, capping = softcap
        scale *= cap
        nodes += capping
        cur = capping[-1].outputs[0]
    widen = ctx.sole_user(cur, "Cast")
    if narrow_to is None and ctx.widens(widen):
        # MPT's float16 scores cast up for the mask and the softmax, the probabilities cast back
        # for the product (required below): the kernels score in float32 anyway
        nodes.append(widen)
        narrow_to, cur = ctx.spec(cur).dtype, widen.outputs[0]
    mask = None
    causal = False
    # constant biases added one after another (Swin V2's position bias, then its shifted windows'
    # mask in a view with the batch split into images x windows) fold into one constant mask
    biases: list[tuple[list[Node], np.ndarray]] = []
    while (node := ctx.sole_user(cur, *_ADDS, "Where", "Reshape", "Max")) is not None:
        shape = ctx.shape(cur)
        windowed = _batch_split_bias(ctx, node, cur) if node.op_type == "Reshape" and shape == scores_shape else None
        # (where a bias came before, it is the node just before: the chain of constant adds is unbroken)
        follows = mask in nodes[-1].inputs if mask is not None else (not biases or biases[-1][0][-1] is nodes[-1])
        if windowed is not None and (mask is None or mask in ctx.graph.constants) and follows:
            if mask is not None:  # the constant mask before it folds in too
                biases.append(([nodes[-1]], ctx.graph.constants[mask]))
                mask = None
            biases.append(windowed[:2])
            nodes += windowed[0]
            cur = windowed[2]
            continue
        if ctx.shape(node.outputs[0]) not in (scores_shape, merged_shape):
            break
        if node.op_type == "Reshape":  # between the merged and the (B, H) view of the scores
            if ctx.shape(node.outputs[0]) == shape:
                break
        elif node.op_type == "Max":
            # XGLM's (fairseq's) clamp of the masked scores at the dtype's lowest value: it changes
            # only -inf, which scores plus transformers' masks (finfo.min, not -inf) do not reach
            lowest = ml_dtypes.finfo(ctx.spec(cur).dtype).min
            if ctx.exact_scalar(ctx.other_input(node, cur) or "") != float(lowest):
                break
        elif node.op_type == "Where":
            masked = _masked_where(ctx, node, cur)
            if masked is None or ctx.shape(node.outputs[0]) != shape:
                break
            if masked.any():  # all False: the fill never lands
                if causal or not _is_causal(np.where(masked, -np.inf, 0.0), s, sk):
                    break
                causal = True
        else:
            other = ctx.other_input(node, cur)
            if other is None or other == cur or ctx.shape(node.outputs[0]) != shape:
                break
            constant = ctx.graph.constants.get(other)
            other_shape = ctx.shape(other)
            if constant is not None and not constant.any():
                pass  # a mask of zeros (an exporter's "no padding") adds nothing: none to read
            elif not causal and constant is not None and _is_causal(constant, s, sk):
                causal = True
            elif biases and constant is not None and shape == scores_shape and biases[-1][0][-1] is nodes[-1]:
                biases.append(([node], constant))
            elif mask is None and not biases and ctx.scalar(other) is None and (
                    shape == scores_shape or len(other_shape) < 3 or other_shape[-3] == 1 or b == 1):
                # a mask added to merged scores broadcasts the same over (B, H, S, Sk) when it has
                # no batch*head axis, or when the batch is 1
                mask = other
            else:
                break
        nodes.append(node)
        cur = node.outputs[0]
    softmax = ctx.sole_user(cur, "Softmax")
    if softmax is None or not _is_last_axis_softmax(ctx, softmax):
        return None
    folded: dict[str, np.ndarray] = {}
    reference: dict[int, Node] = {}  # id(covered node) -> what the reference runs in its place
    if biases:
        mask = f"{scores_mm.name or scores_mm.outputs[0]}::bias"
        folded[mask] = sum(array.astype(np.float64) for _, array in biases).astype(ctx.spec(cur).dtype)
        chain = [node for steps, _ in biases for node in steps]
        reference = _folded_bias_steps(chain, mask, next(name for name in chain[0].inputs
                                                         if name not in ctx.graph.constants))
    probs, passed = ctx.pass_through(softmax.outputs[0])
    if narrow_to is not None:
        back = ctx.cast_back(probs, narrow_to)
        if back is None:
            return None
        passed.append(back)
        probs = back.outputs[0]
    merge = ctx.sole_user(probs, "Reshape")
    if rank == 3 and merge is not None and ctx.shape(merge.outputs[0]) == merged_shape:
        passed.append(merge)
        probs = merge.outputs[0]
    out_mm = ctx.sole_user(probs, "MatMul")
    if out_mm is None or out_mm.inputs[0] != probs or len(ctx.shape(probs)) != rank:
        return None
    v, v_user, out = out_mm.inputs[1], out_mm, out_mm.outputs[0]
    dv = ctx.shape(v)[-1]  # the values' head dim may differ from the keys' (LeViT, DeepSeek's MLA)
    tail: list[Node] = []
    if rank == 3:
        v_lift = _merged_heads(ctx, v, out_mm)
        split = ctx.sole_user(out, "Reshape")
        if v_lift is None or split is None or ctx.shape(split.outputs[0]) != (b, h, s, dv):
            return None
        v, v_user = v_lift
        tail, out = [v_user, split], split.outputs[0]
    kv_heads = h
    if ctx.share_kv_heads and rank == 4 and k_swapped:
        k_shared, v_shared = _repeated_heads(ctx, k, k_user), _repeated_heads(ctx, v, v_user)
        if k_shared and v_shared and ctx.shape(k_shared[0]) == ctx.shape(v_shared[0]):
            (k, k_repeat), (v, v_repeat) = k_shared, v_shared
            k_user, v_user = k_repeat[0], v_repeat[0]  # the Unsqueezes read the shared heads
            k_nodes, tail = k_nodes + k_repeat, tail + v_repeat
            kv_heads = ctx.shape(v)[1]
    k_shape = (b, kv_heads, sk, d) if k_swapped else (b, kv_heads, d, sk)
    if ctx.shape(k) != k_shape or ctx.shape(v) != (b, kv_heads, sk, dv):
        return None
    nodes += [softmax, *passed, out_mm, *tail]
    attrs = {"scale": canonical_float(scale), "k_transposed": not k_swapped, "mask": mask is not None,
             "causal": causal, **({"softcap": canonical_float(softcap[0])} if softcap else {})}
    if ctx.fold_attention_transposes:
        perms: list[tuple[int, ...]] = []
        operands = []
        for operand, consumer in ((q, q_user), (k, k_user), (v, v_user)):
            split_heads = _head_split(ctx, operand, [consumer])
            if split_heads is not None:
                nodes.append(split_heads)
                perms.append(_transpose_perm(ctx, split_heads))
                operand = split_heads.inputs[0]
            else:
                perms.append(())
            operands.append(operand)
        q, k, v = operands
        merge_heads = ctx.sole_user(out, "Transpose")
        if merge_heads is not None:
            nodes.append(merge_heads)
            # the output buffer's way back to the (B, H, S, D) the kernel computes
            perms.append(tuple(int(axis) for axis in np.argsort(_transpose_perm(ctx, merge_heads))))
            out = merge_heads.outputs[0]
        else:
            perms.append(())
        if any(perms):
            attrs["perms"] = tuple(perms)
    covers = sorted(q_nodes + k_nodes + nodes, key=lambda node: ctx.position[id(node)])
    inputs = [q, k, v] + ([mask] if mask is not None else [])
    match = _Match("attention", covers, inputs, out, attrs, 2 * b * h * _scored_pairs(s, sk, causal) * (d + dv),
                   nodes=_in_place(ctx, covers, reference) if reference else None)
    match.folded = folded
    return match


def _in_place(ctx: _Context, covers: Sequence[Node], replacing: dict[int, Node]) -> list[Node]:
    """A task's reference: the nodes it covers in graph order, each that `replacing` names (by id)
    replaced by what the reference runs in its place (under its name: a runtime knows tasks by name)."""
    ordered = sorted(covers, key=lambda covered: ctx.position[id(covered)])
    return [replacing.get(id(covered), covered) for covered in ordered]


def _batch_split_bias(ctx: _Context, split: Node, scores: str) -> tuple[list[Node], np.ndarray, str] | None:
    """(the nodes, the constant bias they add as one (B, ...) array, the value after them) where
    `split` views the scores (B, H, S, Sk) as (B / n, n, H, S, Sk), constants are added in that view
    and the sum is viewed back (Swin's shifted windows: n windows an image, a mask per window)."""
    shape, view = ctx.shape(scores), ctx.shape(split.outputs[0])
    if len(view) != len(shape) + 1 or view[0] * view[1] != shape[0] or view[2:] != shape[1:]:
        return None
    nodes, cur, total = [split], split.outputs[0], np.zeros((1,) * len(view))
    while (add := ctx.sole_user(cur, *_ADDS)) is not None:
        constant = ctx.graph.constants.get(ctx.other_input(add, cur) or "")
        if constant is None or ctx.shape(add.outputs[0]) != view or not _broadcasts_to(constant.shape, view):
            return None
        total = total + constant.astype(np.float64)
        nodes.append(add)
        cur = add.outputs[0]
    back = ctx.sole_user(cur, "Reshape")
    if len(nodes) == 1 or back is None or ctx.shape(back.outputs[0]) != shape:
        return None
    per_window = np.broadcast_to(total, view[:2] + total.shape[2:])
    return [*nodes, back], per_window.reshape((shape[0], *total.shape[2:])), back.outputs[0]


def _folded_bias_steps(chain: list[Node], mask: str, scores: str) -> dict[int, Node]:
    """What the reference runs for a chain of constant bias adds on `scores` folded into the one
    constant `mask`: the first node adds it, the others (under their own names) pass the sum on."""
    first = chain[0]
    steps = {id(first): Node(first.name, "Add", [scores, mask], list(first.outputs))}
    for previous, node in zip(chain, chain[1:]):
        steps[id(node)] = Node(node.name, "Identity", [previous.outputs[0]], list(node.outputs))
    return steps


def _scored_pairs(s: int, sk: int, causal: bool) -> int:
    """Query-key pairs attention must score: all of them, or (causal, bottom-right aligned) those
    with key <= query + (sk - s); a kernel that skips the masked blocks does only these."""
    if not causal:
        return s * sk
    return sum(min(sk, max(0, row + sk - s + 1)) for row in range(s))


def _is_last_axis_softmax(ctx: _Context, node: Node) -> bool:
    rank = len(ctx.shape(node.inputs[0]))
    axis = node.attrs.get("axis", -1 if ctx.graph.opset >= 13 else 1)
    return axis % rank == rank - 1 and ctx.is_float(node.inputs[0])


def _match_bmm(ctx: _Context, node: Node) -> _Match | None:
    a, b = node.inputs
    a_shape, b_shape = ctx.shape(a), ctx.shape(b)
    if len(a_shape) < 3 or len(b_shape) < 3:
        return None
    nodes, out, scale = [node], node.outputs[0], 1.0
    scaler = ctx.sole_user(out, "Mul", "Div")
    factor = ctx.exact_scalar(ctx.other_input(scaler, out) or "") if scaler else None
    if scaler and factor and not (scaler.op_type == "Div" and scaler.inputs[0] != out):
        scale = factor if scaler.op_type == "Mul" else 1.0 / factor
        nodes.append(scaler)
        out = scaler.outputs[0]
    out_shape = ctx.shape(out)
    flops = 2 * math.prod(out_shape) * a_shape[-1] + (math.prod(out_shape) if len(nodes) > 1 else 0)
    return _Match("bmm", nodes, [a, b], out, {"scale": canonical_float(scale)}, flops)


def _last_axis_mean(ctx: _Context, node: Node | None) -> Node | None:
    """`node` when it is a ReduceMean over the last axis that keeps dims."""
    if node is None or node.op_type != "ReduceMean":
        return None
    rank = len(ctx.shape(node.inputs[0]))
    return node if reduce_axes(ctx.graph, node) == (rank - 1,) and node.attrs.get("keepdims", 1) == 1 else None


def _square_of(ctx: _Context, node: Node, value: str) -> bool:
    if node.op_type == "Pow":
        return node.inputs[0] == value and ctx.scalar(node.inputs[1]) == 2.0
    return node.op_type == "Mul" and list(node.inputs) == [value, value]


def _match_normalize(ctx: _Context, mean_square: str, value: str
                     ) -> tuple[list[Node], float, str] | None:
    """Add eps -> Sqrt -> (Div(value, std) | value * Reciprocal(std)): (nodes, eps, normalized)."""
    add = ctx.sole_user(mean_square, *_ADDS)
    eps = ctx.exact_scalar(ctx.other_input(add, mean_square) or "") if add else None
    sqrt = ctx.sole_user(add.outputs[0], "Sqrt") if add else None
    if add is None or eps is None or sqrt is None:
        return None
    std = sqrt.outputs[0]
    step = ctx.sole_user(std, "Div", "Reciprocal")
    if step is None:
        return None
    twin = _same_value(ctx, step.inputs[0], value) if step.op_type == "Div" and step.inputs[1] == std else None
    if twin is not None:
        return [add, sqrt, step, *twin], eps, step.outputs[0]
    if step.op_type == "Div" and (ctx.scalar(step.inputs[0]) != 1.0 or step.inputs[1] != std):
        return None
    mul = ctx.sole_user(step.outputs[0], "Mul")
    twin = _same_value(ctx, ctx.other_input(mul, step.outputs[0]) or "", value) if mul else None
    if mul is None or twin is None:
        return None
    return [add, sqrt, step, mul, *twin], eps, mul.outputs[0]


def _same_value(ctx: _Context, operand: str, value: str) -> list[Node] | None:
    """[] where `operand` is `value`; [its Cast] where both are the same Cast of one source (T5's
    RMSNorm in float16 casts its input to float32 twice, once for the mean square and once for the
    product); else None."""
    if operand == value:
        return []
    twin, cast = ctx.producer.get(operand), ctx.producer.get(value)
    if twin is None or cast is None or twin.op_type != "Cast" or cast.op_type != "Cast" or id(twin) in ctx.claimed \
            or twin.inputs[0] != cast.inputs[0] or ctx.spec(operand) != ctx.spec(value) \
            or len(ctx.users.get(operand, [])) != 1 or operand in ctx.graph_outputs:
        return None
    return [twin]


def _affine(ctx: _Context, value: str, op_types: Sequence[str], n: int) -> tuple[Node, str] | None:
    node = ctx.sole_user(value, *op_types)
    other = ctx.other_input(node, value) if node else None
    if node is None or other is None or ctx.shape(other) != (n,):
        return None
    return node, other


def _norm_io(ctx: _Context, x: str, normalized: str) -> tuple[str, str, list[Node]]:
    """(input, normalized value, the casts and copies between): past copies of the normalized
    value, and where the exporter normalizes in a wider float (the input cast up, the normalized
    value cast back to the input's dtype: LlamaRMSNorm in a float16 model), from the input before
    the cast: the task reads and writes the model's dtype and computes in float32 as its kernels do."""
    cur, passed = ctx.pass_through(normalized)
    casts = _widened_between(ctx, x, cur)
    if casts is None:
        return x, cur, passed
    up, back = casts
    cur, after = ctx.pass_through(back.outputs[0])
    return up.inputs[0], cur, [up, *passed, back, *after]


def _widened_between(ctx: _Context, x: str, value: str) -> tuple[Node, Node] | None:
    """(the Cast that widens x's source into x, the Cast of `value` back to the source's dtype),
    where both are there: what between them is computed in the wider float."""
    up = ctx.producer.get(x)
    if up is None or id(up) in ctx.claimed or not ctx.widens(up):
        return None
    back = ctx.cast_back(value, ctx.spec(up.inputs[0]).dtype)
    return None if back is None else (up, back)


def _narrowed_after_affine(ctx: _Context, x: str, out: str) -> tuple[str, str, list[Node]]:
    """(input, output, the two casts) where a norm is computed, weight and all, in a wider float and
    only its result is cast back to the input's dtype (GemmaRMSNorm: x.float(), the norm, times
    1 + weight in float32, .type_as(x)): the task reads and writes the model's dtype, its weights
    stay float32. Otherwise (x, out, [])."""
    casts = _widened_between(ctx, x, out)
    if casts is None:
        return x, out, []
    up, back = casts
    return up.inputs[0], back.outputs[0], [up, back]


def _norm_match(ctx: _Context, kind: str, x: str, nodes: list[Node], eps: float, out: str,
                params: list[str]) -> _Match:
    """The norm's task, with the residual its output is added to where that add is its only reader
    (the post-norms of Gemma 2 and 3, OLMo 2, Swin V2: x + norm(f(x)))."""
    numel = ctx.spec(x).numel
    per_element = {"layernorm": 8, "rmsnorm": 6}[kind]
    residual = _residual_join(ctx, out, *_ADDS)
    if residual is None:
        return _Match(kind, nodes, [x] + params, out, {"eps": canonical_float(eps)}, per_element * numel)
    add, other = residual
    return _Match(kind, nodes + [add], [x, *params, other], add.outputs[0],
                  {"eps": canonical_float(eps), "residual": True}, (per_element + 1) * numel)


def _match_layernorm_primitive(ctx: _Context, mean: Node) -> _Match | None:
    x = mean.inputs[0]
    if _last_axis_mean(ctx, mean) is None or not ctx.is_float(x):
        return None
    sub = ctx.sole_user(mean.outputs[0], "Sub")
    if sub is None or list(sub.inputs) != [x, mean.outputs[0]]:
        return None
    centered = sub.outputs[0]
    users = ctx.users.get(centered, [])
    squares = [node for node in users if _square_of(ctx, node, centered)]
    if len(users) != 2 or len(squares) != 1 or centered in ctx.graph_outputs:
        return None
    var = _last_axis_mean(ctx, ctx.sole_user(squares[0].outputs[0]))
    if var is None:
        return None
    normalized = _match_normalize(ctx, var.outputs[0], centered)
    if normalized is None:
        return None
    norm_nodes, eps, cur = normalized
    x, cur, passed = _norm_io(ctx, x, cur)
    n = ctx.shape(x)[-1]
    scaled = _affine(ctx, cur, ("Mul",), n)
    shifted = _affine(ctx, scaled[0].outputs[0], _ADDS, n) if scaled else None
    if scaled is None or shifted is None:
        return None
    x, out, narrowed = _narrowed_after_affine(ctx, x, shifted[0].outputs[0])
    nodes = [mean, sub, squares[0], var, *norm_nodes, *passed, scaled[0], shifted[0], *narrowed]
    return _norm_match(ctx, "layernorm", x, nodes, eps, out, [scaled[1], shifted[1]])


def _match_rmsnorm(ctx: _Context, square: Node) -> _Match | None:
    x = square.inputs[0]
    if not _square_of(ctx, square, x) or not ctx.is_float(x):
        return None
    mean = _last_axis_mean(ctx, ctx.sole_user(square.outputs[0]))
    if mean is None:
        return None
    normalized = _match_normalize(ctx, mean.outputs[0], x)
    if normalized is None:
        return None
    norm_nodes, eps, cur = normalized
    x, cur, passed = _norm_io(ctx, x, cur)  # transformers' LlamaRMSNorm casts back to the input's dtype
    scaled = _affine(ctx, cur, ("Mul",), ctx.shape(x)[-1])
    if scaled is None:
        return None
    x, out, narrowed = _narrowed_after_affine(ctx, x, scaled[0].outputs[0])
    nodes = [square, mean, *norm_nodes, *passed, scaled[0], *narrowed]
    return _norm_match(ctx, "rmsnorm", x, nodes, eps, out, [scaled[1]])


def _match_layernorm_op(ctx: _Context, node: Node) -> _Match | None:
    """LayerNormalization over the last axis; without a bias (MPT's and OLMo's LayerNorm as torch's
    dynamo exporter writes it) the task's bias is zeros, and its reference the op reading them."""
    x = node.inputs[0]
    rank = len(ctx.shape(x))
    n = ctx.shape(x)[-1]
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if node.attrs.get("axis", -1) % rank != rank - 1 or ctx.shape(node.inputs[1]) != (n,) \
            or (bias is not None and ctx.shape(bias) != (n,)):
        return None
    eps = node.attrs.get("epsilon", 1e-5)
    x, out, narrowed = _narrowed_after_affine(ctx, x, node.outputs[0])  # OLMo's float32 norm in a float16 model
    if bias is not None:
        return _norm_match(ctx, "layernorm", x, [node, *narrowed], eps, out, [node.inputs[1], bias])
    zeros = f"{node.name or node.outputs[0]}::zero_bias"
    match = _norm_match(ctx, "layernorm", x, [node, *narrowed], eps, out, [node.inputs[1], zeros])
    match.folded = {zeros: np.zeros(n, ctx.spec(node.inputs[1]).dtype)}
    biased = Node(node.name, node.op_type, [node.inputs[0], node.inputs[1], zeros], list(node.outputs),
                  dict(node.attrs))
    match.nodes = _in_place(ctx, match.covers, {id(node): biased})
    return match


def _match_group_norm(ctx: _Context, node: Node) -> _Match | None:
    """A group normalization (rewrites.group_norm_at; on the channels-last graph its NHWC op) and the
    activation after it (Stable Diffusion's GroupNorm -> SiLU): one pass that reads x and writes the
    output, its statistics per sample and group, its affine per channel. The reference runs it as
    ops every opset-17 runtime has (its NHWC op runs as its ONNX op on permuted views)."""
    if is_channels_last(node):
        scale, shift = (ctx.graph.constants.get(name) for name in node.inputs[1:3])
        if scale is None or shift is None:
            return None
        norm: GroupNorm | None = GroupNorm([node], node.inputs[0], node.outputs[0], int(node.attrs["num_groups"]),
                                           float(node.attrs.get("epsilon", 1e-5)), scale, shift)
    else:
        norm = group_norm_at(ctx.graph, ctx.producer, ctx.sole_user, node)
    if norm is None or not ctx.is_float(norm.x):
        return None
    x, spec = norm.x, ctx.spec(norm.x)
    activation, region, out = _match_activation(ctx, norm.out)
    prefix = f"{node.name or node.outputs[0]}::group_norm"
    params = [f"{prefix}_scale", f"{prefix}_shift"]
    folded = {name: array.astype(spec.dtype) for name, array in zip(params, (norm.scale, norm.shift))}
    if is_channels_last(node):
        reference = [Node(node.name, node.op_type, [x, *params], [norm.out], dict(node.attrs), node.domain)]
    else:
        reference, constants = _group_norm_nodes(prefix, x, params, norm.out, spec.shape, norm.groups, norm.eps)
        # under the names of the nodes it replaces, the last one's on the rest: a runtime knows a task's
        # nodes, and where it runs, by name
        names = [covered.name for covered in norm.nodes]
        reference = [Node(names[min(index, len(names) - 1)], step.op_type, step.inputs, step.outputs, step.attrs)
                     for index, step in enumerate(reference)]
        folded.update({name: array.astype(spec.dtype) if array.dtype.kind == "f" else array
                       for name, array in constants.items()})
    attrs = {"groups": norm.groups, "eps": canonical_float(norm.eps), "activation": activation, **_layout_attr(node)}
    match = _Match("groupnorm", norm.nodes + region, [x, *params], out, attrs,
                   (8 + ACTIVATION_FLOPS[activation]) * spec.numel, nodes=reference + region)
    match.folded = folded
    return match


def _group_norm_nodes(prefix: str, x: str, params: list[str], out: str, shape: tuple[int, ...], groups: int,
                      eps: float) -> tuple[list[Node], dict[str, np.ndarray]]:
    """A group norm with its affine per channel as opset-17 ops (what torch exports), and their constants."""
    channel_view = (shape[1],) + (1,) * (len(shape) - 2)
    constants = {f"{prefix}_grouped_shape": np.array([shape[0], groups, -1], np.int64),
                 f"{prefix}_shape": np.array(shape, np.int64),
                 f"{prefix}_channel_view": np.array(channel_view, np.int64),
                 f"{prefix}_ones": np.ones(groups, np.float32), f"{prefix}_zeros": np.zeros(groups, np.float32)}
    grouped, normed, ungrouped, scale_view, scaled, shift_view = (
        f"{prefix}_{step}" for step in ("grouped", "normed", "ungrouped", "scale_view", "scaled", "shift_view"))
    nodes = [Node(grouped, "Reshape", [x, f"{prefix}_grouped_shape"], [grouped]),
             Node(normed, "InstanceNormalization", [grouped, f"{prefix}_ones", f"{prefix}_zeros"], [normed],
                  {"epsilon": eps}),
             Node(ungrouped, "Reshape", [normed, f"{prefix}_shape"], [ungrouped]),
             Node(scale_view, "Reshape", [params[0], f"{prefix}_channel_view"], [scale_view]),
             Node(scaled, "Mul", [ungrouped, scale_view], [scaled]),
             Node(shift_view, "Reshape", [params[1], f"{prefix}_channel_view"], [shift_view]),
             Node(out, "Add", [scaled, shift_view], [out])]
    return nodes, constants


def _match_rms_norm_op(ctx: _Context, node: Node) -> _Match | None:
    """ONNX's RMSNormalization (opset 23, what torch's exporter writes for F.rms_norm there) over the
    last axis with one scale per column."""
    x, scale = node.inputs[0], node.inputs[1]
    shape = ctx.shape(x)
    if not shape or int(node.attrs.get("axis", -1)) % len(shape) != len(shape) - 1 \
            or ctx.shape(scale) != shape[-1:] or not ctx.is_float(x):
        return None
    return _norm_match(ctx, "rmsnorm", x, [node], float(node.attrs.get("epsilon", 1e-5)), node.outputs[0], [scale])


def _match_attention_op(ctx: _Context, node: Node) -> _Match | None:
    """ONNX's Attention (opset 23, torch's export of scaled_dot_product_attention there): q, k, v
    (B, H, S, D) without a key/value cache, an additive float mask, a constant boolean one (causal:
    the task's flag; otherwise an additive constant, where no row is hidden whole) or none, the causal
    flag where S equals Sk (the op aligns it top-left, the task bottom-right: the same there), the
    soft cap; fewer key/value heads where the backend shares them, read before transformers'
    repeat_kv where the graph repeats them."""
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3] else None
    if any(node.inputs[4:]) or any(node.outputs[1:]) or node.attrs.get("qk_matmul_output_mode", 0) \
            or node.attrs.get("softmax_precision") or any(len(ctx.shape(x)) != 4 for x in (q, k, v)):
        return None
    (b, h, s, d), sk = ctx.shape(q), ctx.shape(k)[2]
    causal = bool(node.attrs.get("is_causal", 0))
    if causal and s != sk or mask is not None and (ctx.shape(mask)[-1:] != (sk,)
                                                   or not _broadcasts_to(ctx.shape(mask), (b, h, s, sk))):
        return None
    covers = [node]
    folded: dict[str, np.ndarray] = {}
    if mask is not None and ctx.spec(mask).dtype == "bool":
        allowed = ctx.graph.constants.get(mask)
        if allowed is None or not allowed.any(axis=-1).all():
            return None  # a runtime boolean mask, or a row hidden whole (the op gives it zeros)
        if _is_causal(np.where(allowed, 0.0, -np.inf), s, sk) and s == sk:
            causal, mask = True, None
        elif allowed.all():
            mask = None
        else:
            mask = f"{node.name or node.outputs[0]}::bias"
            dtype = ctx.spec(q).dtype
            folded[mask] = np.where(allowed, 0.0, ml_dtypes.finfo(dtype).min).astype(dtype)
    if ctx.share_kv_heads:
        k_shared, v_shared = _repeated_heads(ctx, k, node), _repeated_heads(ctx, v, node)
        if k_shared and v_shared and ctx.shape(k_shared[0]) == ctx.shape(v_shared[0]):
            (k, k_repeat), (v, v_repeat) = k_shared, v_shared
            covers = [*k_repeat, *v_repeat, node]
    kv_heads = ctx.shape(k)[1]
    if kv_heads != h and not (ctx.share_kv_heads and h % kv_heads == 0):
        return None
    scale, softcap = node.attrs.get("scale"), float(node.attrs.get("softcap", 0.0))
    attrs = {"scale": canonical_float(scale if scale is not None else 1 / math.sqrt(d)), "k_transposed": False,
             "mask": mask is not None, "causal": causal}
    if softcap > 0:
        attrs["softcap"] = canonical_float(softcap)
    flops = 2 * b * h * _scored_pairs(s, sk, causal) * (d + ctx.shape(v)[-1])
    inputs = [q, k, v] + ([mask] if mask else [])
    # the op as the reference runs it: on the heads before their repeat, the boolean mask as the task's
    attention = Node(node.name, node.op_type, inputs, list(node.outputs), {**node.attrs, "is_causal": int(causal)},
                     node.domain)
    match = _Match("attention", covers, inputs, node.outputs[0], attrs, flops,
                   nodes=_in_place(ctx, covers, {id(node): attention}))
    match.folded = folded
    return match


def _match_softmax(ctx: _Context, node: Node) -> _Match | None:
    if not _is_last_axis_softmax(ctx, node):
        return None
    x = node.inputs[0]
    return _Match("softmax", [node], [x], node.outputs[0], {}, 5 * ctx.spec(x).numel)


def _match_reduce(ctx: _Context, node: Node) -> _Match | None:
    axes = reduce_axes(ctx.graph, node)
    x = node.inputs[0]
    if axes is None or not ctx.is_float(x):
        return None
    attrs = {"op": node.op_type[len("Reduce"):].lower(), "axes": axes,
             "keepdims": bool(node.attrs.get("keepdims", 1))}
    return _Match("reduce", [node], [x], node.outputs[0], attrs, ctx.spec(x).numel)


def _spatial_attrs(node: Node, spatial: Sequence[int], kernel: Sequence[int]) -> dict[str, Any]:
    strides = [int(s) for s in node.attrs.get("strides", [1, 1])]
    dilations = [int(d) for d in node.attrs.get("dilations", [1, 1])]
    pads = _explicit_pads(node, spatial, kernel, strides, dilations)
    return {"strides": tuple(strides), "pads": (pads[0], pads[1], pads[2], pads[3]),
            "dilations": tuple(dilations)}


def _channel_axis(node: Node) -> int:
    return 3 if is_channels_last(node) else 1


def _spatial_shape(node: Node, shape: Sequence[int]) -> tuple[int, ...]:
    """(H, W) of a 4-D data tensor or weight (OIHW, or OHWI for an NHWC conv) of the node."""
    return tuple(shape[1:3] if is_channels_last(node) else shape[2:])


def _fold_into_conv(ctx: _Context, conv: Node) -> tuple[list[Node], list[Node], dict[str, np.ndarray]] | None:
    """Conv -> BatchNormalization / per-channel Mul, Add, Sub, Div by constants, as one Conv.

    Returns the nodes the task runs (a Conv with folded weight and bias, then each folded node as an
    Identity under its own name, so a runtime that skips a task's nodes by name skips them too),
    the graph nodes folded away, and the folded weight and bias by name.
    """
    consts = ctx.graph.constants
    w_name = conv.inputs[1]
    bias_name = conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else None
    if w_name not in consts or (bias_name is not None and bias_name not in consts):
        return None
    out_shape = ctx.shape(conv.outputs[0])
    channel_axis = _channel_axis(conv)
    weight = consts[w_name].astype(np.float64)
    bias = consts[bias_name].astype(np.float64).reshape(-1) if bias_name else np.zeros(out_shape[channel_axis])
    folded_nodes: list[Node] = []
    cur = conv.outputs[0]
    while (node := ctx.sole_user(cur)) is not None:
        affine = channel_affine(ctx.graph, node, cur, channel_axis)
        if affine is None:
            break
        scale, shift = affine
        weight, bias = weight * scale[:, None, None, None], bias * scale + shift  # OIHW or OHWI
        folded_nodes.append(node)
        cur = node.outputs[0]
    if not folded_nodes:
        return None
    dtype = consts[w_name].dtype
    prefix = f"{conv.name or conv.outputs[0]}::folded"
    folded = {f"{prefix}_weight": weight.astype(dtype), f"{prefix}_bias": bias.astype(dtype)}
    run = [Node(conv.name, conv.op_type, [conv.inputs[0], *folded], [conv.outputs[0]], dict(conv.attrs), conv.domain)]
    for node in folded_nodes:
        run.append(Node(node.name, "Identity", [run[-1].outputs[0]], [node.outputs[0]]))
    return run, folded_nodes, folded


def _match_conv(ctx: _Context, conv: Node) -> _Match | None:
    x, w = conv.inputs[0], conv.inputs[1]
    x_shape, w_shape = ctx.shape(x), ctx.shape(w)
    if len(x_shape) != 4 or len(w_shape) != 4:
        return None
    fold = _fold_into_conv(ctx, conv)
    covers = [conv]
    if fold is None:
        run, bias_name = [conv], conv.inputs[2] if len(conv.inputs) > 2 and conv.inputs[2] else None
        folded: dict[str, np.ndarray] = {}
        out = conv.outputs[0]
    else:
        run, folded_nodes, folded = fold
        w, bias_name, out = run[0].inputs[1], run[0].inputs[2], run[-1].outputs[0]
        covers += folded_nodes
    gated = _input_gate(ctx, conv) if ctx.scale_conv_inputs else None
    if gated is not None:  # squeeze-excite's x * gate, read by this conv alone: scaled as the conv loads x
        gate_node, x, gate = gated
        covers, run = [gate_node, *covers], [gate_node, *run]
    oc = w_shape[0]
    epilogue, _, activation, out, residual = _epilogue(ctx, out, None, residual_first=True)
    n, c = x_shape[0], x_shape[_channel_axis(conv)]
    oh, ow = _spatial_shape(conv, ctx.shape(out))
    kernel = _spatial_shape(conv, w_shape)
    group = int(conv.attrs.get("group", 1))
    macs = n * oc * oh * ow * (c // group) * math.prod(kernel)
    attrs = {**_spatial_attrs(conv, _spatial_shape(conv, x_shape), kernel), "group": group,
             "activation": activation, "bias": bias_name is not None, "residual": residual is not None,
             **_layout_attr(conv), **({"input_scale": True} if gated else {})}
    flops = 2 * macs + _epilogue_flops(n * oc * oh * ow, bias_name is not None, activation,
                                       residual is not None) + (math.prod(x_shape) if gated else 0)
    inputs = [x, w] + [name for name in (bias_name, residual, gated and gated[2]) if name]
    return _Match("conv2d", covers + epilogue, inputs, out, attrs, flops, run + epilogue, folded)


def _input_gate(ctx: _Context, conv: Node) -> tuple[Node, str, str] | None:
    """(the Mul, x, the gate) where the conv's input is x times a gate computed at run time, one value
    per sample and channel ((N, C, 1, 1); NHWC (N, 1, 1, C)), and nothing else reads the product:
    squeeze-excite's scaling of the block's activation (EfficientNet, MobileNetV3, RegNet) before
    the projection conv. conv(x * g) with g constant over the positions is the conv of x read
    scaled, zero padding included, so the product never goes through memory."""
    mul = ctx.producer.get(conv.inputs[0])
    if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2 or id(mul) in ctx.claimed \
            or ctx.sole_user(conv.inputs[0]) is not conv:
        return None
    shape = ctx.shape(conv.inputs[0])
    channels = _channel_axis(conv)
    gate_shape = tuple(size if axis in (0, channels) else 1 for axis, size in enumerate(shape))
    for x, gate in (mul.inputs, mul.inputs[::-1]):
        if ctx.shape(x) == shape and ctx.shape(gate) == gate_shape and gate not in ctx.graph.constants \
                and ctx.spec(gate).dtype == ctx.spec(x).dtype:
            return mul, x, gate
    return None


def _layout_attr(node: Node) -> dict[str, str]:
    """attrs["layout"] of an NHWC task; NCHW tasks have none, so their workload keys never changed."""
    return {"layout": "nhwc"} if is_channels_last(node) else {}


def _match_pool(ctx: _Context, node: Node) -> _Match | None:
    x = node.inputs[0]
    shape = ctx.shape(x)
    if len(shape) != 4 or not ctx.is_float(x) or any(name for name in node.outputs[1:]):
        return None
    out_shape = ctx.shape(node.outputs[0])
    op_type = ONNX_OF[node.op_type] if is_channels_last(node) else node.op_type
    spatial_shape = _spatial_shape(node, shape)
    if op_type == "GlobalAveragePool":
        attrs: dict[str, Any] = {"op": "global_avg", "kernel": spatial_shape, "strides": (1, 1),
                                 "pads": (0, 0, 0, 0)}
    else:
        if node.attrs.get("ceil_mode", 0) or any(d != 1 for d in node.attrs.get("dilations", [1, 1])):
            return None
        kernel = tuple(int(k) for k in node.attrs["kernel_shape"])
        spatial = _spatial_attrs(node, spatial_shape, kernel)
        attrs = {"op": "max" if op_type == "MaxPool" else "avg", "kernel": kernel,
                 "strides": spatial["strides"], "pads": spatial["pads"]}
        if op_type == "AveragePool":
            attrs["count_include_pad"] = bool(node.attrs.get("count_include_pad", 0))
    flops = math.prod(out_shape) * math.prod(attrs["kernel"])
    return _Match("pool", [node], [x], node.outputs[0], {**attrs, **_layout_attr(node)}, flops)


def _match_matmul(ctx: _Context, node: Node) -> _Match | None:
    return _match_attention(ctx, node) or _match_gemm(ctx, node) or _match_bmm(ctx, node)


def _last_axis_cut(ctx: _Context, node: Node) -> tuple[int, int, int] | None:
    """[start, end) and step of a Slice that cuts only the last axis, forwards, bounds in range."""
    shape = ctx.shape(node.inputs[0])
    cut = one_axis_cut(node, ctx.graph.constants, shape)
    return cut[1:] if cut is not None and cut[0] == len(shape) - 1 else None


def _last_axis_range(ctx: _Context, node: Node) -> tuple[int, int] | None:
    """[start, end) of a Slice that cuts only the last axis, with unit steps, bounds in range."""
    cut = _last_axis_cut(ctx, node)
    return cut[:2] if cut is not None and cut[2] == 1 else None


def _rotate_half(ctx: _Context, concat: Node) -> tuple[str, list[Node], str] | None:
    """(x, the nodes, the rotated value) where `concat` is Concat(Neg(x[..., D/2:]), x[..., :D/2])
    over the last axis (transformers' rotate_half)."""
    shape = ctx.shape(concat.outputs[0])
    if len(shape) != 4 or shape[-1] % 2 or int(concat.attrs.get("axis", 0)) % 4 != 3:
        return None
    half = shape[-1] // 2
    neg, first = (ctx.producer.get(name) for name in concat.inputs)
    if neg is None or neg.op_type != "Neg" or first is None or ctx.sole_user(neg.outputs[0]) is not concat \
            or ctx.sole_user(first.outputs[0]) is not concat:
        return None
    second = ctx.producer.get(neg.inputs[0])
    x = first.inputs[0]
    if second is None or second.inputs[0] != x or ctx.sole_user(second.outputs[0]) is not neg \
            or _last_axis_range(ctx, first) != (0, half) or _last_axis_range(ctx, second) != (half, 2 * half) \
            or ctx.shape(x) != shape:
        return None
    return x, [first, second, neg, concat], concat.outputs[0]


def _rotate_pairs(ctx: _Context, concat: Node) -> tuple[str, list[Node], str] | None:
    """(x, the nodes, the rotated value) where `concat` and the Reshape after it are
    stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2) (GPT-J's and RoFormer's rotate_every_two:
    each even column paired with the odd one after it)."""
    shape = ctx.shape(concat.outputs[0])
    if len(shape) != 5 or shape[-1] != 2 or int(concat.attrs.get("axis", 0)) % 5 != 4:
        return None
    lifted = [ctx.producer.get(name) for name in concat.inputs]
    if any(node is None or node.op_type != "Unsqueeze" or ctx.sole_user(node.outputs[0]) is not concat
           or ctx.shape(node.inputs[0]) != shape[:-1] for node in lifted):
        return None
    neg, even = (ctx.producer.get(node.inputs[0]) for node in lifted)
    if neg is None or neg.op_type != "Neg" or even is None or ctx.sole_user(neg.outputs[0]) is not lifted[0] \
            or ctx.sole_user(even.outputs[0]) is not lifted[1]:
        return None
    odd = ctx.producer.get(neg.inputs[0])
    x = even.inputs[0]
    flat = ctx.sole_user(concat.outputs[0], "Reshape")
    width = 2 * shape[-2]
    if odd is None or odd.inputs[0] != x or ctx.sole_user(odd.outputs[0]) is not neg or flat is None \
            or _last_axis_cut(ctx, even) != (0, width, 2) or _last_axis_cut(ctx, odd) != (1, width, 2) \
            or ctx.shape(x) != shape[:3] + (width,) or ctx.shape(flat.outputs[0]) != ctx.shape(x):
        return None
    return x, [even, odd, neg, *lifted, concat, flat], flat.outputs[0]


def _match_rotary(ctx: _Context, concat: Node) -> _Match | None:
    """x * cos + rotate(x) * sin (see the module docstring), anchored at the rotation's Concat.
    Where x and its rotation are widened for the products (a float16 model's float32 cos and sin:
    OLMo 2) and the sum is cast back to x's dtype, the task reads and writes x's dtype and
    computes in float32, as its kernels do anyway."""
    if not ctx.fuse_rotary or len(concat.inputs) != 2:
        return None
    half = _rotate_half(ctx, concat)
    found = half or _rotate_pairs(ctx, concat)
    if found is None:
        return None
    x, nodes, rotated = found
    shape = ctx.shape(x)
    widened = [cast for cast in (ctx.sole_user(rotated, "Cast"),) if ctx.widens(cast)]
    rotated = widened[0].outputs[0] if widened else rotated
    rotated_mul = ctx.sole_user(rotated, "Mul")
    sin = ctx.other_input(rotated_mul, rotated) if rotated_mul else None
    add = ctx.sole_user(rotated_mul.outputs[0], *_ADDS) if rotated_mul else None
    other = ctx.other_input(add, rotated_mul.outputs[0]) if add and rotated_mul else None
    x_mul = ctx.producer.get(other) if other else None
    x_read = x
    if widened and x_mul is not None:  # x widened the same way: the Cast x_mul reads
        x_cast = next((ctx.producer[name] for name in x_mul.inputs if name in ctx.producer
                       and ctx.widens(ctx.producer[name]) and ctx.producer[name].inputs[0] == x), None)
        if x_cast is None or ctx.sole_user(x_cast.outputs[0]) is not x_mul:
            return None
        widened.append(x_cast)
        x_read = x_cast.outputs[0]
    cos = ctx.other_input(x_mul, x_read) if x_mul is not None and x_mul.op_type == "Mul" else None
    if sin is None or cos is None or ctx.sole_user(x_mul.outputs[0]) is not add \
            or any(not _broadcasts_to(ctx.shape(angle), shape) for angle in (cos, sin)):
        return None
    out, narrowed = add.outputs[0], []
    if widened:
        back = ctx.cast_back(out, ctx.spec(x).dtype)
        if back is None:
            return None
        out, narrowed = back.outputs[0], [back]
    readers = [*(node for node in nodes if x in node.inputs), widened[-1] if widened else x_mul]
    nodes = [*nodes, *widened, rotated_mul, x_mul, add, *narrowed]
    attrs: dict[str, Any] = {} if half else {"interleaved": True}
    partial = _partial_rotary(ctx, x, readers, out)
    if partial is not None:
        cut, passed, join = partial
        nodes = [cut, *nodes, passed, join]
        attrs["rotary_dims"] = shape[-1]
        x, readers, out = cut.inputs[0], [cut, passed], join.outputs[0]
    split_heads = _head_split(ctx, x, readers) if ctx.fold_attention_transposes else None
    if split_heads is not None:
        nodes.insert(0, split_heads)
        attrs["perm"] = _transpose_perm(ctx, split_heads)
        x = split_heads.inputs[0]
    return _Match("rotary", nodes, [x, cos, sin], out, attrs, 4 * ctx.spec(x).numel)


def _partial_rotary(ctx: _Context, x: str, readers: Sequence[Node], rotated: str) -> tuple[Node, Node, Node] | None:
    """(the Slice x = heads[..., :R], the Slice heads[..., R:], the Concat of the rotated x and the
    latter) where only the first R columns of each head are rotated (GPT-NeoX, Phi); else None."""
    cut = ctx.producer.get(x)
    if cut is None or x in ctx.graph_outputs or _last_axis_range(ctx, cut) != (0, ctx.shape(x)[-1]) \
            or {id(user) for user in ctx.users.get(x, [])} != {id(reader) for reader in readers}:
        return None
    heads = cut.inputs[0]
    join = ctx.sole_user(rotated, "Concat")
    passed = ctx.producer.get(join.inputs[1]) if join is not None and len(join.inputs) == 2 else None
    if passed is None or join.inputs[0] != rotated or int(join.attrs.get("axis", 0)) % 4 != 3 \
            or passed.inputs[0] != heads or ctx.sole_user(passed.outputs[0]) is not join \
            or _last_axis_range(ctx, passed) != (ctx.shape(x)[-1], ctx.shape(heads)[-1]):
        return None
    return cut, passed, join


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Numpy broadcasting of `shape` to `target` without growing it."""
    return len(shape) <= len(target) and all(size in (1, want) for size, want in zip(shape[::-1], target[::-1]))


_ANCHORS: dict[str, Callable[[_Context, Node], _Match | None]] = {
    "MatMul": _match_matmul,
    "Gemm": _match_gemm,
    "Conv": _match_conv,
    "MaxPool": _match_pool,
    "AveragePool": _match_pool,
    "GlobalAveragePool": _match_pool,
    "LayerNormalization": _match_layernorm_op,
    "InstanceNormalization": _match_group_norm,
    "GroupNormalization": _match_group_norm,
    "ReduceMean": lambda ctx, node: _match_layernorm_primitive(ctx, node) or _match_reduce(ctx, node),
    "ReduceSum": _match_reduce,
    "ReduceMax": _match_reduce,
    "ReduceMin": _match_reduce,
    "Pow": _match_rmsnorm,
    "Concat": _match_rotary,
    "Mul": _match_rmsnorm,
    "Softmax": _match_softmax,
    "RMSNormalization": _match_rms_norm_op,
    "Attention": _match_attention_op,
}
# the same patterns on the channels-last graph's NHWC ops (layout.py)
_ANCHORS.update({NHWC_OPS[op]: match for op, match in list(_ANCHORS.items()) if op in NHWC_OPS})


def _elementwise_matches(ctx: _Context) -> list[_Match]:
    """Unclaimed elementwise nodes grouped into trees joined through single-consumer values."""
    nodes = [node for node in ctx.graph.nodes if id(node) not in ctx.claimed and _is_elementwise(ctx, node)]
    ids = {id(node) for node in nodes}
    group_of = connected_groups(ids, [
        (id(producer), id(node)) for node in nodes for name in set(node.inputs)
        if (producer := ctx.producer.get(name)) is not None and id(producer) in ids and ctx.sole_user(name) is node])
    groups: dict[int, list[Node]] = {}
    for node in nodes:  # graph order is topological within each group
        groups.setdefault(group_of[id(node)], []).append(node)
    matches = []
    for group in groups.values():
        made = {node.outputs[0] for node in group}
        inputs = list(dict.fromkeys(
            name for node in group for name in node.inputs
            if name and name not in made and ctx.scalar(name) is None))
        out = group[-1].outputs[0]
        expr = _build_expr(ctx, group, inputs)
        if not expr:  # only copies: glue, no kernel's worth of work
            continue
        flops = len(expr) * ctx.spec(out).numel
        # a chain that computes a known activation of its one input (GPT-2's GELU written out in
        # eight ops) is that activation's one step: the same task as the Gelu op's, and one a
        # backend's expression kernel computes in its own form
        activation = _identify_activation(ctx, group, inputs[0]) if len(inputs) == 1 and len(expr) > 1 else None
        if activation in EXPRESSION_ACTIVATIONS and ctx.spec(inputs[0]).shape == ctx.spec(out).shape:
            expr = ((activation, "in0"),)
            flops = ACTIVATION_FLOPS[activation] * ctx.spec(out).numel
        matches.append(_Match("elementwise", group, inputs, out, {"expr": expr}, flops))
    return matches


def _to_task(ctx: _Context, match: _Match) -> Task | None:
    """The Task of a match, or None when the group is not self-contained."""
    if not ctx.closed(match.covers, match.output):
        return None
    # graph order: the last node is the task's place in the graph (where a runtime runs its kernel)
    nodes = match.nodes if match.nodes is not None else sorted(match.covers, key=lambda n: ctx.position[id(n)])
    if not match.inputs:
        return None  # computes on constants only: nothing for a kernel to read
    made = {name for node in nodes for name in node.outputs if name}
    constants: dict[str, np.ndarray] = dict(match.folded)
    for node in nodes:
        for name in node.inputs:
            if not name or name in made or name in match.inputs or name in constants:
                continue
            if name not in ctx.graph.constants:
                return None  # a runtime value the kernel signature has no slot for
            constants[name] = ctx.graph.constants[name]

    def spec(name: str) -> TensorSpec:
        if name in match.folded:
            return TensorSpec(tuple(match.folded[name].shape), match.folded[name].dtype.name)
        return ctx.spec(name)

    inputs = tuple(spec(name) for name in match.inputs)
    outputs = (ctx.spec(match.output),)
    min_bytes = sum(s.nbytes for s in inputs) + sum(s.nbytes for s in outputs)
    return Task(match.kind, inputs, outputs, freeze_attrs(match.attrs), int(match.flops), min_bytes,
                nodes=tuple(nodes), input_names=tuple(match.inputs), output_names=(match.output,),
                constants=constants, opset=ctx.graph.opset)


def partition(graph: Graph, fold_attention_transposes: bool = False, share_kv_heads: bool = False, *,
              fuse_rotary: bool = False, scale_conv_inputs: bool = False) -> list[Task]:
    """The graph's kernel tasks in topological order (see the module docstring for the patterns).

    Tasks are ordered by the graph position of their last node: running glue nodes in graph order
    and each task at its last node's position respects every dependency.
    fold_attention_transposes: the backend's `folds_attention_transposes` (see the docstring).
    share_kv_heads: the backend's `shares_kv_heads`; fuse_rotary: its `fuses_rotary`; scale_conv_inputs:
    its `scales_conv_inputs` (see the docstring).
    """
    ctx = _Context(graph, fold_attention_transposes, share_kv_heads, fuse_rotary, scale_conv_inputs)
    placed: list[tuple[int, Task]] = []

    def claim(match: _Match | None) -> None:
        task = _to_task(ctx, match) if match is not None else None
        if match is not None and task is not None:
            ctx.claimed.update(id(node) for node in match.covers)
            placed.append((max(ctx.position[id(node)] for node in match.covers), task))

    for node in graph.nodes:
        anchor = _ANCHORS.get(node.op_type)
        if anchor is not None and id(node) not in ctx.claimed and (node.domain in ("", "ai.onnx")
                                                                  or is_channels_last(node)):
            claim(anchor(ctx, node))
    for match in _elementwise_matches(ctx):
        claim(match)
    placed.sort(key=lambda item: item[0])
    return [task for _, task in placed]


def backend_tasks(graph: Graph, backend: Backend) -> tuple[Graph, list[Task]]:
    """The graph as the backend runs it and its tasks: the one way the tuner, the runtime and the
    CLI see a model, so a pack's keys name the tasks a later run makes. The graph: arithmetic by
    exactly 1 or 0 dropped; means over (H, W) as global-average pools; two-operand Einsums as
    MatMuls between views; a per-row score scale moved onto the queries; zero Pads folded into the
    convs they feed; 1-D convs as 2-D ones; per-column affines folded into their projections; a
    parallel block's residual sum regrouped; channels-last where the backend's conv_layout is NHWC
    (each group norm first one op); a chain of Transposes, Reshapes and (Un)Squeezes that only
    reshapes as one Reshape; a projection whose columns are cut into parts as one projection per
    part (rewrites.py), except where a task reads the cut in place (the Slices of a partial rotary
    task)."""
    graph = reassociate_residuals(fold_column_affines(conv1d_as_2d(fold_pads_into_convs(
        query_scales(einsums_as_matmuls(spatial_means_as_pools(drop_identity_arithmetic(graph))))))))
    if backend.conv_layout == "NHWC":  # (its glue is torch's and the executor's, not onnxruntime's)
        graph = channels_last(group_norms_as_ops(graph))
    graph = collapse_layout_chains(graph)
    options = dict(fold_attention_transposes=backend.folds_attention_transposes,
                   share_kv_heads=backend.shares_kv_heads, fuse_rotary=backend.fuses_rotary,
                   scale_conv_inputs=backend.scales_conv_inputs)
    tasks = partition(graph, **options)
    split = split_projections(graph, in_tasks={id(node) for task in tasks for node in task.nodes})
    return (graph, tasks) if split is graph else (split, partition(split, **options))


def summarize(tasks: Sequence[Task]) -> list[tuple[Task, int]]:
    """Unique workloads with how often each occurs, in order of first appearance."""
    counts = Counter(task.key for task in tasks)
    first: dict[str, Task] = {}
    for task in tasks:
        first.setdefault(task.key, task)
    return [(task, counts[key]) for key, task in first.items()]
