"""Standalone kernel tasks for tests and benchmarks, made the one way tasks are made.

Each builder writes the ONNX subgraph an exporter emits for the op (as a tiny Graph whose tensors
are all runtime inputs and whose scalars are constants of the task's dtype) and returns the single
task `partition` finds in it. So a synthetic task has the kind, attrs, canonical input order,
FLOPs and bytes - hence the workload key - of the same subgraph inside a model, and its reference
runs through the executor like any model task.

Shapes the builders choose (they match what BERT/ResNet exports contain):
  attention  q (B,H,S,D), k (B,H,D,Sk) if k_transposed else (B,H,Sk,D) (+ Transpose), v (B,H,Sk,D),
             scores times 1/sqrt(D), mask (B,1,S,Sk) additive (what transformers' BERT exports
             feed), causal as a constant mask of the dtype's lowest value above the diagonal
  gemm gelu  the erf form x * (1 + erf(x / sqrt 2)) * 0.5; gelu_tanh the tanh form; silu x*sigmoid(x)
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np
from onnx import helper

from .errors import PortkernError
from .ir import Graph, Node, TensorSpec
from .layout import LAYOUT_DOMAIN, NHWC_OPS, TO_NHWC
from .partition import EPILOGUE_ACTIVATIONS, partition
from .tasks import Task

SYNTHETIC_OPSET = 17
GELU_OPSET = 20  # the Gelu op, only for elementwise expressions with a gelu step


class SyntheticTaskError(PortkernError):
    """A builder was asked for a task it cannot express."""


class GraphBuilder:
    """A tiny Graph written by hand: nodes with their output specs, tensors as runtime inputs.

    Public so tests can spell a subgraph the way some exporter does and check what partition
    makes of it; `task(output)` insists on exactly one task.
    """

    def __init__(self, name: str, dtype: str) -> None:
        self.name = name
        self.dtype = dtype
        self.nodes: list[Node] = []
        self.inputs: list[str] = []
        self.values: dict[str, TensorSpec] = {}
        self.constants: dict[str, np.ndarray] = {}

    def input(self, name: str, shape: Sequence[int], dtype: str | None = None) -> str:
        self.inputs.append(name)
        self.values[name] = TensorSpec(tuple(int(d) for d in shape), dtype or self.dtype)
        return name

    def constant(self, value: Any, dtype: str | None = None) -> str:
        array = np.asarray(value, dtype=dtype or self.dtype)
        name = f"const{len(self.constants)}"
        self.constants[name] = array
        self.values[name] = TensorSpec(tuple(array.shape), array.dtype.name)
        return name

    def op(self, op_type: str, inputs: Sequence[str], shape: Sequence[int], dtype: str | None = None,
           domain: str = "", **attrs: Any) -> str:
        out = f"{op_type.lower()}{len(self.nodes)}"
        self.nodes.append(Node(out, op_type, list(inputs), [out], attrs, domain))
        self.values[out] = TensorSpec(tuple(int(d) for d in shape), dtype or self.dtype)
        return out

    def graph(self, outputs: Sequence[str], opset: int = SYNTHETIC_OPSET) -> Graph:
        return Graph(self.name, self.nodes, self.inputs, list(outputs), self.values, self.constants,
                     opset, model_hash=f"synthetic:{self.name}")

    def task(self, output: str, opset: int = SYNTHETIC_OPSET, fold_attention_transposes: bool = False,
             share_kv_heads: bool = False, fuse_rotary: bool = False, scale_conv_inputs: bool = False) -> Task:
        return only_task(self.graph([output], opset), fold_attention_transposes, share_kv_heads, fuse_rotary,
                         scale_conv_inputs)


def only_task(graph: Graph, fold_attention_transposes: bool = False, share_kv_heads: bool = False,
              fuse_rotary: bool = False, scale_conv_inputs: bool = False) -> Task:
    """The one task partition makes of a synthetic graph (with a backend's partition flags)."""
    tasks = partition(graph, fold_attention_transposes, share_kv_heads, fuse_rotary=fuse_rotary,
                      scale_conv_inputs=scale_conv_inputs)
    if len(tasks) != 1:
        kinds = ", ".join(task.kind for task in tasks) or "none"
        raise SyntheticTaskError(f"synthetic {graph.name} partitions into {len(tasks)} tasks ({kinds}), not one")
    return tasks[0]


def _activation(builder: GraphBuilder, x: str, activation: str) -> str:
    """The nodes an exporter emits for an activation, on x."""
    if activation != "none" and activation not in EPILOGUE_ACTIVATIONS:
        raise SyntheticTaskError(f"unknown activation '{activation}' (none, {', '.join(EPILOGUE_ACTIVATIONS)})")
    shape = builder.values[x].shape
    if activation == "none":
        return x
    if activation in ("relu", "sigmoid", "tanh"):
        return builder.op(activation.capitalize(), [x], shape)
    if activation == "relu6":
        return builder.op("Clip", [x, builder.constant(0.0), builder.constant(6.0)], shape)
    if activation == "hardswish":
        return builder.op("HardSwish", [x], shape)
    if activation == "relu_squared":  # torch.square(F.relu(x)) as torch exports it
        return builder.op("Pow", [builder.op("Relu", [x], shape), builder.constant(2.0)], shape)
    if activation == "silu":
        return builder.op("Mul", [x, builder.op("Sigmoid", [x], shape)], shape)
    if activation == "gelu":
        erf = builder.op("Erf", [builder.op("Div", [x, builder.constant(math.sqrt(2.0))], shape)], shape)
        inner = builder.op("Mul", [x, builder.op("Add", [erf, builder.constant(1.0)], shape)], shape)
        return builder.op("Mul", [inner, builder.constant(0.5)], shape)
    # gelu_tanh: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
    cube = builder.op("Pow", [x, builder.constant(3.0)], shape)
    inner = builder.op("Add", [x, builder.op("Mul", [cube, builder.constant(0.044715)], shape)], shape)
    tanh = builder.op("Tanh", [builder.op("Mul", [inner, builder.constant(math.sqrt(2.0 / math.pi))], shape)],
                      shape)
    half = builder.op("Mul", [x, builder.constant(0.5)], shape)
    return builder.op("Mul", [half, builder.op("Add", [tanh, builder.constant(1.0)], shape)], shape)


def gemm_task(m: int, n: int, k: int, dtype: str = "float32", *, activation: str = "none",
              bias: bool = False, residual: bool = False, gate: bool = False, trans_b: bool = False,
              batch: Sequence[int] = ()) -> Task:
    """a (*batch,M,K) @ b (K,N) [+ bias] [-> act] [+ residual | * gate]; trans_b: a Gemm op with
    b (N,K). A gate multiplies as SwiGLU's up projection does its silu(x @ W_gate)."""
    if residual and gate:
        raise SyntheticTaskError("a gemm's last operand is a residual or a gate, not both")
    builder = GraphBuilder("gemm", dtype)
    out_shape = (*batch, m, n)
    a = builder.input("a", (*batch, m, k))
    if trans_b:
        if batch:
            raise SyntheticTaskError("trans_b comes from a Gemm op, which takes a 2-D a: give no batch")
        operands = [a, builder.input("b", (n, k))] + ([builder.input("bias", (n,))] if bias else [])
        y = builder.op("Gemm", operands, out_shape, transB=1)
    else:
        y = builder.op("MatMul", [a, builder.input("b", (k, n))], out_shape)
        if bias:
            y = builder.op("Add", [y, builder.input("bias", (n,))], out_shape)
    y = _activation(builder, y, activation)
    if residual:
        y = builder.op("Add", [y, builder.input("residual", out_shape)], out_shape)
    if gate:
        y = builder.op("Mul", [y, builder.input("gate", out_shape)], out_shape)
    return builder.task(y)


def bmm_task(b: int, m: int, n: int, k: int, dtype: str = "float32") -> Task:
    """a (B,M,K) @ b (B,K,N)."""
    builder = GraphBuilder("bmm", dtype)
    y = builder.op("MatMul", [builder.input("a", (b, m, k)), builder.input("b", (b, k, n))], (b, m, n))
    return builder.task(y)


def attention_task(batch: int, heads: int, seq: int, head_dim: int, dtype: str = "float32", *,
                   seq_kv: int | None = None, mask: bool = False, causal: bool = False,
                   k_transposed: bool = False, packed_heads: bool = False,
                   mask_shape: tuple[int, int, int, int] | None = None, kv_heads: int | None = None,
                   softcap: float | None = None, value_dim: int | None = None,
                   scores_dtype: str | None = None) -> Task:
    """softmax(q @ k^T * (1/sqrt(D)) [+ mask] [+ causal]) @ v, as BERT-style exports spell it.
    packed_heads: q, k, v arrive as (B, S, H, D) and the output leaves as one, through the
    head-split and merge Transposes a backend with folds_attention_transposes folds in.
    mask_shape: the mask's, broadcast over the scores' (B, H, S, Sk); (B, 1, S, Sk) by default. An
    encoder's key-padding mask is (B, 1, 1, Sk): one row for all queries.
    kv_heads: grouped-query attention: k and v have kv_heads heads, each repeated for heads /
    kv_heads query heads as transformers' repeat_kv writes it (what a backend with shares_kv_heads
    reads before the repeat). softcap: the scores soft-capped before the mask, Div by it, Tanh,
    Mul by it (Gemma 2). value_dim: v's head dim where it is not q's and k's (LeViT's values are
    twice as wide as its keys; DeepSeek's MLA has 192-wide keys, 128-wide values). scores_dtype:
    the scaled scores cast to a wider float for the mask and the softmax, the probabilities cast
    back (MPT's float16 attention); the mask is then in that dtype."""
    dv = head_dim if value_dim is None else value_dim
    builder = GraphBuilder("attention", dtype)
    sk = seq if seq_kv is None else seq_kv
    if causal and sk < seq:
        raise SyntheticTaskError(f"causal attention needs seq_kv >= seq (got {sk} < {seq})")
    if kv_heads is not None and (heads % kv_heads or k_transposed):
        raise SyntheticTaskError(f"{kv_heads} key/value heads for {heads} query heads, k_transposed {k_transposed}")

    def operand(name: str, shape: tuple[int, int, int, int]) -> str:
        """(B, H, X, Y) as given, or split from a (B, X, H, Y) buffer by a Transpose; k and v with
        kv_heads heads, repeated to H."""
        if kv_heads is not None and name in ("k", "v"):
            b, _, x, y = shape
            groups = heads // kv_heads
            shared = _plain_operand(name, (b, kv_heads, x, y))
            lifted = builder.op("Unsqueeze", [shared, builder.constant(np.array([2]), "int64")], (b, kv_heads, 1, x, y))
            expanded = builder.op("Expand", [lifted, builder.constant(np.array([b, kv_heads, groups, x, y]), "int64")],
                                  (b, kv_heads, groups, x, y))
            return builder.op("Reshape", [expanded, builder.constant(np.array(shape), "int64")], shape)
        return _plain_operand(name, shape)

    def _plain_operand(name: str, shape: tuple[int, int, int, int]) -> str:
        if not packed_heads:
            return builder.input(name, shape)
        buffer = builder.input(name, (shape[0], shape[2], shape[1], shape[3]))
        return builder.op("Transpose", [buffer], shape, perm=[0, 2, 1, 3])

    q = operand("q", (batch, heads, seq, head_dim))
    if k_transposed and packed_heads:
        buffer = builder.input("k", (batch, sk, heads, head_dim))
        kt = builder.op("Transpose", [buffer], (batch, heads, head_dim, sk), perm=[0, 2, 3, 1])
    elif k_transposed:
        kt = builder.input("k", (batch, heads, head_dim, sk))
    else:
        k = operand("k", (batch, heads, sk, head_dim))
        kt = builder.op("Transpose", [k], (batch, heads, head_dim, sk), perm=[0, 1, 3, 2])
    v = operand("v", (batch, heads, sk, dv))
    scores_shape = (batch, heads, seq, sk)
    scores = builder.op("MatMul", [q, kt], scores_shape)
    scores = builder.op("Mul", [scores, builder.constant(1.0 / math.sqrt(head_dim))], scores_shape)
    if softcap is not None:
        divided = builder.op("Div", [scores, builder.constant(softcap)], scores_shape)
        capped = builder.op("Tanh", [divided], scores_shape)
        scores = builder.op("Mul", [capped, builder.constant(softcap)], scores_shape)
    wide = scores_dtype or dtype
    if wide != dtype:
        scores = builder.op("Cast", [scores], scores_shape, wide, to=_onnx_dtype(wide))
    if mask:
        scores = builder.op("Add", [scores, builder.input("mask", mask_shape or (batch, 1, seq, sk), wide)],
                            scores_shape, wide)
    if causal:
        allowed = np.arange(sk)[None, :] <= np.arange(seq)[:, None] + (sk - seq)
        lowest = ml_dtypes.finfo(wide).min
        scores = builder.op("Add", [scores, builder.constant(np.where(allowed, 0.0, lowest), wide)], scores_shape, wide)
    probs = builder.op("Softmax", [scores], scores_shape, wide, axis=-1)
    if wide != dtype:
        probs = builder.op("Cast", [probs], scores_shape, to=_onnx_dtype(dtype))
    out = builder.op("MatMul", [probs, v], (batch, heads, seq, dv))
    if packed_heads:
        out = builder.op("Transpose", [out], (batch, seq, heads, dv), perm=[0, 2, 1, 3])
    return builder.task(out, fold_attention_transposes=packed_heads, share_kv_heads=kv_heads is not None)


def softmax_task(rows: int, cols: int, dtype: str = "float32") -> Task:
    builder = GraphBuilder("softmax", dtype)
    return builder.task(builder.op("Softmax", [builder.input("x", (rows, cols))], (rows, cols), axis=-1))


def _post_norm_residual(builder: GraphBuilder, normed: str, residual: bool) -> str:
    """A post-norm block's residual add after the norm (residual + norm(x)), where asked."""
    if not residual:
        return normed
    shape = builder.values[normed].shape
    return builder.op("Add", [builder.input("residual", shape), normed], shape)


def layernorm_task(rows: int, cols: int, dtype: str = "float32", eps: float = 1e-5, residual: bool = False) -> Task:
    builder = GraphBuilder("layernorm", dtype)
    operands = [builder.input("x", (rows, cols)), builder.input("gamma", (cols,)), builder.input("beta", (cols,))]
    normed = builder.op("LayerNormalization", operands, (rows, cols), axis=-1, epsilon=float(eps))
    return builder.task(_post_norm_residual(builder, normed, residual))


def rmsnorm_task(rows: int, cols: int, dtype: str = "float32", eps: float = 1e-6, residual: bool = False) -> Task:
    """x / sqrt(mean(x^2) + eps) * gamma [+ residual], in the primitive form exporters emit."""
    builder = GraphBuilder("rmsnorm", dtype)
    x = builder.input("x", (rows, cols))
    square = builder.op("Pow", [x, builder.constant(2.0)], (rows, cols))
    mean = builder.op("ReduceMean", [square], (rows, 1), axes=[-1], keepdims=1)
    std = builder.op("Sqrt", [builder.op("Add", [mean, builder.constant(eps)], (rows, 1))], (rows, 1))
    normalized = builder.op("Div", [x, std], (rows, cols))
    normed = builder.op("Mul", [builder.input("gamma", (cols,)), normalized], (rows, cols))
    return builder.task(_post_norm_residual(builder, normed, residual))


def groupnorm_task(n: int, c: int, spatial: Sequence[int], groups: int, dtype: str = "float32", *,
                   eps: float = 1e-5, activation: str = "none", form: str = "torch", nhwc: bool = False) -> Task:
    """GroupNorm of x (N, C, *spatial) [then an activation], written as `form` says: "torch" (its
    export: Reshape to (N, G, -1), InstanceNormalization with scale 1 and bias 0, Reshape back, Mul
    and Add by (C, 1, ...) weights) or "op" (the GroupNormalization op, opset 21); nhwc: the
    channels-last graph's op on (N, H, W, C) buffers. gamma and beta are constants drawn here, as a
    model's weights are."""
    builder = GraphBuilder("groupnorm", dtype)
    rng = np.random.default_rng(0)
    gamma, beta = 1.0 + 0.1 * rng.standard_normal(c), 0.1 * rng.standard_normal(c)
    shape = (n, c, *spatial)
    if nhwc or form == "op":
        op_type, domain = _layout_op("GroupNormalization", nhwc)
        out_shape = _layout(shape, True) if nhwc else shape
        y = builder.op(op_type, [builder.input("x", out_shape), builder.constant(gamma), builder.constant(beta)],
                       out_shape, domain=domain, num_groups=groups, epsilon=float(eps))
        return builder.task(_activation(builder, y, activation), opset=21)
    if form != "torch":
        raise SyntheticTaskError(f"unknown group norm form '{form}' (torch or op)")
    x = builder.input("x", shape)
    grouped = builder.op("Reshape", [x, builder.constant([n, groups, -1], "int64")],
                         (n, groups, math.prod(shape) // (n * groups)))
    normed = builder.op("InstanceNormalization",
                        [grouped, builder.constant(np.ones(groups)), builder.constant(np.zeros(groups))],
                        builder.values[grouped].shape, epsilon=float(eps))
    y = builder.op("Reshape", [normed, builder.constant(shape, "int64")], shape)
    channel_view = (c,) + (1,) * len(spatial)
    y = builder.op("Mul", [y, builder.constant(gamma.reshape(channel_view))], shape)
    y = builder.op("Add", [y, builder.constant(beta.reshape(channel_view))], shape)
    return builder.task(_activation(builder, y, activation))


def _onnx_dtype(name: str) -> int:
    """A Cast's `to` for a dtype name (bfloat16 too: ml_dtypes, imported, gives numpy the name)."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(name))


def rotary_graph(batch: int, heads: int, seq: int, dim: int, dtype: str = "float32", *,
                 packed_heads: bool = False, per_example: bool = False, rotary_dims: int | None = None,
                 interleaved: bool = False, angles_dtype: str | None = None) -> Graph:
    """x * cos + rotate_half(x) * sin as transformers' apply_rotary_pos_emb writes it (two Slices
    of the last axis, Neg, Concat), cos and sin (1, 1, S, R) (per_example: (B, 1, S, R)).
    packed_heads: x arrives as (B, S, H, D) through the head-split Transpose a backend that folds
    attention transposes folds in. rotary_dims R < D: a partial rotary as GPT-NeoX writes it, the
    first R columns of each head (a Slice) rotated and Concatenated with the other D - R.
    interleaved: GPT-J's rotate_every_two instead, stack((-x[..., 1::2], x[..., ::2]), -1) flattened
    (two strided Slices, Neg, two Unsqueezes, a Concat and a Reshape). angles_dtype: cos and sin
    in a wider float than x (OLMo 2's float32 angles in a float16 model): x and its rotation cast
    up for the products, the sum cast back to x's dtype."""
    rotated_dims = dim if rotary_dims is None else rotary_dims
    if rotated_dims % 2 or not 0 < rotated_dims <= dim:
        raise SyntheticTaskError(f"rotary embeddings rotate halves of 2..{dim} columns, not {rotated_dims}")
    builder = GraphBuilder("rotary", dtype)
    shape = (batch, heads, seq, dim)
    if packed_heads:
        heads_value = builder.op("Transpose", [builder.input("x", (batch, seq, heads, dim))], shape, perm=[0, 2, 1, 3])
    else:
        heads_value = builder.input("x", shape)

    def last_axis(value: str, start: int, end: int, step: int = 1) -> str:
        bounds = [builder.constant(np.array([bound]), "int64") for bound in (start, end, -1, step)]
        return builder.op("Slice", [value, *bounds], (batch, heads, seq, len(range(start, end, step))))

    x = last_axis(heads_value, 0, rotated_dims) if rotated_dims < dim else heads_value
    part = (batch, heads, seq, rotated_dims)
    angles = (batch if per_example else 1, 1, seq, rotated_dims)
    wide = angles_dtype or dtype
    cos, sin = builder.input("cos", angles, wide), builder.input("sin", angles, wide)
    half = (batch, heads, seq, rotated_dims // 2)
    if interleaved:
        pairs, last = (*half, 2), builder.constant(np.array([-1]), "int64")
        even, odd = last_axis(x, 0, rotated_dims, 2), last_axis(x, 1, rotated_dims, 2)
        lifted = [builder.op("Unsqueeze", [value, last], (*half, 1))
                  for value in (builder.op("Neg", [odd], half), even)]
        rotated = builder.op("Reshape", [builder.op("Concat", lifted, pairs, axis=-1),
                                         builder.constant(np.array(part), "int64")], part)
    else:
        first, second = last_axis(x, 0, rotated_dims // 2), last_axis(x, rotated_dims // 2, rotated_dims)
        rotated = builder.op("Concat", [builder.op("Neg", [second], half), first], part, axis=-1)
    if wide != dtype:
        x, rotated = (builder.op("Cast", [value], part, wide, to=_onnx_dtype(wide)) for value in (x, rotated))
    out = builder.op("Add", [builder.op("Mul", [x, cos], part, wide), builder.op("Mul", [rotated, sin], part, wide)],
                     part, wide)
    if wide != dtype:
        out = builder.op("Cast", [out], part, to=_onnx_dtype(dtype))
    if rotated_dims < dim:
        out = builder.op("Concat", [out, last_axis(heads_value, rotated_dims, dim)], shape, axis=-1)
    return builder.graph([out])


def rotary_task(batch: int, heads: int, seq: int, dim: int, dtype: str = "float32", *,
                packed_heads: bool = False, per_example: bool = False, rotary_dims: int | None = None,
                interleaved: bool = False, angles_dtype: str | None = None) -> Task:
    """rotary_graph's one task, as a backend with a rotary kernel (and, packed_heads, folded
    attention transposes) partitions it."""
    graph = rotary_graph(batch, heads, seq, dim, dtype, packed_heads=packed_heads, per_example=per_example,
                         rotary_dims=rotary_dims, interleaved=interleaved, angles_dtype=angles_dtype)
    return only_task(graph, fold_attention_transposes=packed_heads, fuse_rotary=True)


_EXPR_OPS = {"add": "Add", "sub": "Sub", "mul": "Mul", "div": "Div", "pow": "Pow", "max": "Max",
             "min": "Min", "sqrt": "Sqrt", "exp": "Exp", "log": "Log", "tanh": "Tanh",
             "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf", "neg": "Neg", "abs": "Abs",
             "reciprocal": "Reciprocal", "gelu": "Gelu", "gelu_tanh": "Gelu", "cast": "Cast",
             "where": "Where"}


def elementwise_task(shape: Sequence[int], dtype: str, expr: Sequence[Sequence[Any]],
                     input_shapes: Mapping[str, Sequence[int]] | None = None) -> Task:
    """The task of an expression (see partition.py) whose inputs in0..inK have `shape` (the
    output's), or the shape `input_shapes` gives one, broadcast as ONNX does.

    A "where" condition input is boolean; the result's attrs["expr"] is the expression as a model
    would spell it (scalars at the dtype's shortest round-trip decimal).
    """
    builder = GraphBuilder("elementwise", dtype)
    refs: dict[str, str] = {}

    def operand(ref: Any, condition: bool = False) -> str:
        if not isinstance(ref, str):
            return builder.constant(ref)
        if ref.startswith("in") and ref not in refs:
            expected = f"in{sum(name.startswith('in') for name in refs)}"
            if ref != expected:
                raise SyntheticTaskError(f"expression inputs must appear in order: {ref} before {expected}")
            refs[ref] = builder.input(ref, (input_shapes or {}).get(ref, shape), "bool" if condition else None)
        if ref not in refs:
            raise SyntheticTaskError(f"expression operand {ref!r} is not defined before it is used")
        return refs[ref]

    out = ""
    uses_gelu = False
    for index, (op, *args) in enumerate(expr):
        if op not in _EXPR_OPS:
            raise SyntheticTaskError(f"unknown expression step {op!r}")
        attrs: dict[str, Any] = {}
        step_dtype = None
        if op == "cast":
            step_dtype = str(args[1])
            attrs["to"] = _onnx_dtype(step_dtype)
            operands = [operand(args[0])]
        elif op == "where":
            operands = [operand(args[0], condition=True), operand(args[1]), operand(args[2])]
        else:
            operands = [operand(arg) for arg in args]
        if op.startswith("gelu"):
            uses_gelu = True
            attrs["approximate"] = "tanh" if op == "gelu_tanh" else "none"
        out = builder.op(_EXPR_OPS[op], operands, shape, step_dtype, **attrs)
        refs[f"t{index}"] = out
    if not out:
        raise SyntheticTaskError("an elementwise expression needs at least one step")
    return builder.task(out, GELU_OPSET if uses_gelu else SYNTHETIC_OPSET)


_REDUCE_OPS = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin"}


def reduce_task(shape: Sequence[int], dtype: str, op: str, axes: Sequence[int], keepdims: bool = True) -> Task:
    if op not in _REDUCE_OPS:
        raise SyntheticTaskError(f"unknown reduction '{op}' (one of {', '.join(_REDUCE_OPS)})")
    builder = GraphBuilder("reduce", dtype)
    x = builder.input("x", shape)
    rank = len(shape)
    reduced = {a % rank for a in axes} if axes else set(range(rank))
    out_shape = [1 if i in reduced else d for i, d in enumerate(shape) if keepdims or i not in reduced]
    axes_list = [int(a) for a in axes]
    if op == "sum":  # ReduceSum takes its axes as an input from opset 13
        operands = [x, builder.constant(axes_list, "int64")] if axes_list else [x]
        y = builder.op("ReduceSum", operands, out_shape, keepdims=int(keepdims))
    else:
        extra: dict[str, Any] = {"axes": axes_list} if axes_list else {}
        y = builder.op(_REDUCE_OPS[op], [x], out_shape, keepdims=int(keepdims), **extra)
    return builder.task(y)


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    first, second = value
    return int(first), int(second)


def _window_out(size: int, kernel: int, stride: int, pad: int, dilation: int = 1) -> int:
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def conv2d_task(n: int, c: int, h: int, w: int, oc: int, kh: int, kw: int, dtype: str = "float32", *,
                stride: int | Sequence[int] = 1, pad: int | Sequence[int] = 0,
                dilation: int | Sequence[int] = 1, group: int = 1, activation: str = "none",
                bias: bool = True, residual: bool = False, nhwc: bool = False, input_scale: bool = False) -> Task:
    """act(conv(x, w) + bias + residual); pad is symmetric per spatial axis; nhwc: the same task
    on NHWC buffers (OHWI weight), as in layout.py's channels-last graph; input_scale: x is first
    multiplied by a gate (N, C, 1, 1) (squeeze-excite's), which the task reads (its last input)."""
    if c % group or oc % group:
        raise SyntheticTaskError(f"group {group} must divide channels {c} and {oc}")
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(pad), _pair(dilation)
    builder = GraphBuilder("conv2d", dtype)
    out_shape = _layout((n, oc, _window_out(h, kh, sh, ph, dh), _window_out(w, kw, sw, pw, dw)), nhwc)
    x = builder.input("x", _layout((n, c, h, w), nhwc))
    if input_scale:
        x = builder.op("Mul", [x, builder.input("gate", _layout((n, c, 1, 1), nhwc))], _layout((n, c, h, w), nhwc))
    operands = [x, builder.input("w", _layout((oc, c // group, kh, kw), nhwc))]
    if bias:
        operands.append(builder.input("bias", (oc,)))
    op_type, domain = _layout_op("Conv", nhwc)
    y = builder.op(op_type, operands, out_shape, domain=domain, kernel_shape=[kh, kw], strides=[sh, sw],
                   pads=[ph, pw, ph, pw], dilations=[dh, dw], group=group)
    if residual:
        y = builder.op("Add", [y, builder.input("residual", out_shape)], out_shape)
    return builder.task(_activation(builder, y, activation), scale_conv_inputs=input_scale)


def _layout(nchw_shape: tuple[int, ...], nhwc: bool) -> tuple[int, ...]:
    """An NCHW (or OIHW) shape, or its NHWC (OHWI) permutation."""
    return tuple(nchw_shape[axis] for axis in TO_NHWC) if nhwc else nchw_shape


def _layout_op(op_type: str, nhwc: bool) -> tuple[str, str]:
    """(op type, domain) of an ONNX op, or of its NHWC form (layout.py)."""
    return (NHWC_OPS[op_type], LAYOUT_DOMAIN) if nhwc else (op_type, "")


def pool_task(n: int, c: int, h: int, w: int, op: str, kernel: int | Sequence[int] = 2,
              stride: int | Sequence[int] = 2, pad: int | Sequence[int] = 0, dtype: str = "float32",
              nhwc: bool = False) -> Task:
    """max | avg (count_include_pad=0, the ONNX default) | global_avg (kernel/stride/pad unused);
    nhwc: the same task on NHWC buffers."""
    builder = GraphBuilder("pool", dtype)
    x = builder.input("x", _layout((n, c, h, w), nhwc))
    if op == "global_avg":
        op_type, domain = _layout_op("GlobalAveragePool", nhwc)
        return builder.task(builder.op(op_type, [x], _layout((n, c, 1, 1), nhwc), domain=domain))
    if op not in ("max", "avg"):
        raise SyntheticTaskError(f"unknown pool '{op}' (max, avg or global_avg)")
    (kh, kw), (sh, sw), (ph, pw) = _pair(kernel), _pair(stride), _pair(pad)
    out_shape = _layout((n, c, _window_out(h, kh, sh, ph), _window_out(w, kw, sw, pw)), nhwc)
    op_type, domain = _layout_op("MaxPool" if op == "max" else "AveragePool", nhwc)
    y = builder.op(op_type, [x], out_shape, domain=domain, kernel_shape=[kh, kw], strides=[sh, sw],
                   pads=[ph, pw, ph, pw])
    return builder.task(y)
