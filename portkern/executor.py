"""The numpy reference executor: ONNX semantics, one registry of op implementations.

It is the ground truth every kernel is checked against (tasks run their subgraph here in float64),
the constant folder of the importer, and the CPU fallback of the runtime. It favours plain, exact
numpy over speed: a float64 env computes in float64, float32 in float32, float16 in float16, with
one documented exception: the contractions (MatMul, Gemm, Conv, ConvTranspose, Einsum) compute
float16/bfloat16 operands in float32 and cast the result back, because numpy has no fp16 BLAS and
its fp16 loops are both slow and accumulate in fp16 (what onnxruntime and every GPU library avoid).

Attributes arrive as the importer converts them (`onnx_import.node_from_proto`): ints, floats,
str, lists of those, and tensors as numpy arrays. Opset-dependent forms (axes as attribute before
opset 13/18, as input after) are read from wherever the node carries them, so one implementation
serves every opset; only Softmax/LogSoftmax/Hardmax (2-D coercion before 13) look at the opset.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .errors import ModelError, UnsupportedOpError
from .ir import Graph, Node

Inputs = list["np.ndarray | None"]
OpImpl = Callable[[Node, Inputs, int], Sequence[np.ndarray]]

OPS: dict[str, OpImpl] = {}


def _register(*op_types: str) -> Callable[[OpImpl], OpImpl]:
    def wrap(fn: OpImpl) -> OpImpl:
        for op_type in op_types:
            OPS[op_type] = fn
        return fn
    return wrap


def _attr(node: Node, name: str, default: Any = None) -> Any:
    return node.attrs.get(name, default)


def _opt(inputs: Inputs, index: int) -> np.ndarray | None:
    """An optional input: None when omitted ('' name) or past the end."""
    return inputs[index] if index < len(inputs) else None


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _axes_of(node: Node, inputs: Inputs, index: int) -> list[int] | None:
    """Axes given as attribute (older opsets) or as input `index` (newer); None when absent."""
    if "axes" in node.attrs:
        return _ints(node.attrs["axes"])
    value = _opt(inputs, index)
    return None if value is None else _ints(value)


def _is_low_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" and dtype.itemsize < 4 or dtype.name == "bfloat16"


def _compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """The dtype a contraction accumulates in (fp16/bf16 in fp32, see module docstring)."""
    dtype = np.result_type(*arrays)
    return np.dtype(np.float32) if _is_low_float(dtype) else dtype


# --------------------------------------------------------------------------- elementwise

def _erf(x: np.ndarray) -> np.ndarray:
    """numpy has no erf (and scipy is no dependency): libm's erf, element by element."""
    flat = np.frompyfunc(math.erf, 1, 1)(x.astype(np.float64))
    return np.asarray(flat, dtype=np.float64).astype(x.dtype, copy=False)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1 / (1 + np.exp(-x))).astype(x.dtype, copy=False)


def _softplus(x: np.ndarray) -> np.ndarray:
    return (np.logaddexp(0, x)).astype(x.dtype, copy=False)


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Abs": np.abs, "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt,
    "Reciprocal": np.reciprocal, "Sin": np.sin, "Cos": np.cos, "Tan": np.tan, "Asin": np.arcsin,
    "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh, "Asinh": np.arcsinh,
    "Acosh": np.arccosh, "Atanh": np.arctanh, "Tanh": np.tanh, "Floor": np.floor, "Ceil": np.ceil,
    "Sign": np.sign, "Round": np.round, "Erf": _erf, "Not": np.logical_not, "IsNaN": np.isnan,
    "BitwiseNot": np.invert, "Relu": lambda x: np.maximum(x, 0).astype(x.dtype, copy=False),
    "Sigmoid": _sigmoid, "Softplus": _softplus, "Softsign": lambda x: x / (1 + np.abs(x)),
    "HardSwish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1).astype(x.dtype, copy=False),
    "Mish": lambda x: x * np.tanh(_softplus(x)),
}


@_register(*UNARY)
def _unary(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    (x,) = inputs[:1]
    assert x is not None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return [np.asarray(UNARY[node.op_type](x))]


def _param_unary(node: Node, x: np.ndarray) -> np.ndarray:
    op = node.op_type
    if op == "LeakyRelu":
        return np.where(x >= 0, x, x * _attr(node, "alpha", 0.01))
    if op == "Elu":
        return np.where(x > 0, x, _attr(node, "alpha", 1.0) * np.expm1(np.minimum(x, 0)))
    if op == "Selu":
        alpha = _attr(node, "alpha", 1.67326319217681884765625)
        gamma = _attr(node, "gamma", 1.05070102214813232421875)
        return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))
    if op == "Celu":
        alpha = _attr(node, "alpha", 1.0)
        return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))
    if op == "HardSigmoid":
        return np.clip(_attr(node, "alpha", 0.2) * x + _attr(node, "beta", 0.5), 0, 1)
    if op == "ThresholdedRelu":
        return np.where(x > _attr(node, "alpha", 1.0), x, 0)
    if op == "Shrink":
        bias, lambd = _attr(node, "bias", 0.0), _attr(node, "lambd", 0.5)
        return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))
    if op == "Gelu":
        if _attr(node, "approximate", "none") == "tanh":
            inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
            return 0.5 * x * (1 + np.tanh(inner))
        return 0.5 * x * (1 + _erf(x / math.sqrt(2)))
    raise AssertionError(op)


@_register("LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "ThresholdedRelu", "Shrink", "Gelu")
def _param_unary_op(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    with np.errstate(over="ignore", invalid="ignore"):
        return [np.asarray(_param_unary(node, x)).astype(x.dtype, copy=False)]


@_register("IsInf")
def _isinf(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    positive = _attr(node, "detect_positive", 1) and np.isposinf(x)
    negative = _attr(node, "detect_negative", 1) and np.isneginf(x)
    return [np.logical_or(positive, negative)]


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C-style integer division (truncation toward zero), as onnxruntime computes it."""
    quotient = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -quotient, quotient).astype(np.result_type(a, b))


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.result_type(a, b).kind in "iu":
        return _int_div(a, b)
    return np.divide(a, b)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The result has the base's type (ONNX), whatever the exponent's type."""
    if a.dtype.kind in "iu":
        return np.power(a.astype(np.float64), b).astype(a.dtype)
    return np.power(a, b.astype(a.dtype)).astype(a.dtype, copy=False)


def _bit_shift(node: Node) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    return np.left_shift if _attr(node, "direction") == "LEFT" else np.right_shift


BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _div, "Pow": _pow,
    "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or,
    "Xor": np.logical_xor, "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or,
    "BitwiseXor": np.bitwise_xor,
}


@_register(*BINARY, "BitShift", "Mod", "PRelu")
def _binary(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    op = node.op_type
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if op == "BitShift":
            out = _bit_shift(node)(a, b)
        elif op == "Mod":
            out = np.fmod(a, b) if _attr(node, "fmod", 0) else np.mod(a, b)
        elif op == "PRelu":
            out = np.where(a < 0, a * b, a)
        else:
            out = BINARY[op](a, b)
    out = np.asarray(out)
    if out.dtype != np.bool_ and op != "Pow":
        out = out.astype(a.dtype, copy=False)
    return [out]


VARIADIC: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "Sum": np.add, "Mean": np.add, "Max": np.maximum, "Min": np.minimum,
}


@_register(*VARIADIC)
def _variadic(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    arrays = [x for x in inputs if x is not None]
    result = arrays[0]
    for other in arrays[1:]:
        result = VARIADIC[node.op_type](result, other)
    if node.op_type == "Mean":
        result = result / len(arrays)
    return [np.asarray(result).astype(arrays[0].dtype, copy=False)]


@_register("Where")
def _where(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    cond, a, b = inputs[:3]
    assert cond is not None and a is not None and b is not None
    return [np.where(cond, a, b).astype(a.dtype, copy=False)]


@_register("Clip")
def _clip(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    low = _opt(inputs, 1) if "min" not in node.attrs else node.attrs["min"]
    high = _opt(inputs, 2) if "max" not in node.attrs else node.attrs["max"]
    out = x
    if low is not None:
        out = np.maximum(out, np.asarray(low, dtype=x.dtype))
    if high is not None:
        out = np.minimum(out, np.asarray(high, dtype=x.dtype))
    return [np.asarray(out, dtype=x.dtype)]


# --------------------------------------------------------------------------- type and data movement

def _onnx_dtype(code: int) -> np.dtype:
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(int(code)))


@_register("Cast", "CastLike")
def _cast(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    if node.op_type == "CastLike":
        target_input = inputs[1]
        assert target_input is not None
        target = target_input.dtype
    else:
        target = _onnx_dtype(_attr(node, "to"))
    if target.kind in "OSU" or x.dtype.kind in "OSU":
        raise UnsupportedOpError(node.op_type, node.name, "string casts are not supported")
    if target.kind in "iu" and x.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
            return [np.trunc(x).astype(target)]
    return [x.astype(target)]


@_register("Identity", "Dropout")
def _identity(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Dropout is inference-only here: an identity with an all-true mask."""
    x = inputs[0]
    assert x is not None
    if node.op_type == "Dropout" and _opt(inputs, 2) is not None and bool(inputs[2]):
        raise UnsupportedOpError("Dropout", node.name, "training_mode=1 is not supported")
    return [x.copy(), np.ones(x.shape, dtype=np.bool_)]


@_register("Constant")
def _constant(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    attrs = node.attrs
    if "value" in attrs:
        return [np.array(attrs["value"])]
    if "value_float" in attrs:
        return [np.array(attrs["value_float"], dtype=np.float32)]
    if "value_floats" in attrs:
        return [np.array(attrs["value_floats"], dtype=np.float32)]
    if "value_int" in attrs:
        return [np.array(attrs["value_int"], dtype=np.int64)]
    if "value_ints" in attrs:
        return [np.array(attrs["value_ints"], dtype=np.int64)]
    raise UnsupportedOpError("Constant", node.name, f"attributes {sorted(attrs)} are not supported")


@_register("ConstantOfShape")
def _constant_of_shape(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    shape = inputs[0]
    assert shape is not None
    value = np.asarray(_attr(node, "value", np.zeros(1, dtype=np.float32)))
    return [np.full(_ints(shape), value.reshape(-1)[0], dtype=value.dtype)]


@_register("Shape")
def _shape(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    start, end = _attr(node, "start", 0), _attr(node, "end", None)
    return [np.array(x.shape[start:end], dtype=np.int64)]


@_register("Size")
def _size(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    return [np.array(x.size, dtype=np.int64)]


@_register("Reshape")
def _reshape(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, shape = inputs[0], inputs[1] if len(inputs) > 1 else None
    assert x is not None
    target = _ints(shape if shape is not None else _attr(node, "shape"))
    if not _attr(node, "allowzero", 0):
        target = [x.shape[i] if dim == 0 else dim for i, dim in enumerate(target)]
    return [x.reshape(target)]


@_register("Flatten")
def _flatten(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axis = _attr(node, "axis", 1) % (x.ndim + 1) if x.ndim else 0
    return [x.reshape(math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))]


@_register("Transpose")
def _transpose(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    perm = _attr(node, "perm", None)
    return [np.ascontiguousarray(np.transpose(x, perm))]


@_register("Squeeze")
def _squeeze(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axes = _axes_of(node, inputs, 1)
    if axes is None:
        axes = [i for i, dim in enumerate(x.shape) if dim == 1]
    return [np.squeeze(x, axis=tuple(a % x.ndim for a in axes))]


@_register("Unsqueeze")
def _unsqueeze(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axes = _axes_of(node, inputs, 1) or []
    rank = x.ndim + len(axes)
    return [np.expand_dims(x, tuple(sorted(a % rank for a in axes)))]


@_register("Concat")
def _concat(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    arrays = [x for x in inputs if x is not None]
    return [np.concatenate(arrays, axis=_attr(node, "axis"))]


@_register("Split")
def _split(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axis = _attr(node, "axis", 0) % x.ndim
    sizes = _attr(node, "split", None)
    if sizes is None and _opt(inputs, 1) is not None:
        sizes = _ints(inputs[1])
    count = _attr(node, "num_outputs", len(node.outputs))
    if sizes is None:
        chunk = -(-x.shape[axis] // count)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(count)]
    bounds = np.cumsum(sizes)[:-1]
    return list(np.split(x, bounds, axis=axis))


@_register("Slice")
def _slice(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    if "starts" in node.attrs:
        starts, ends = _ints(node.attrs["starts"]), _ints(node.attrs["ends"])
        axes = _ints(node.attrs["axes"]) if "axes" in node.attrs else None
        steps = None
    else:
        starts, ends = _ints(inputs[1]), _ints(inputs[2])
        axes = None if _opt(inputs, 3) is None else _ints(inputs[3])
        steps = None if _opt(inputs, 4) is None else _ints(inputs[4])
    axes = list(range(len(starts))) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = x.shape[axis]
        # clamp the INT64 sentinels so python slicing sees in-range bounds
        start, end = max(min(start, dim), -dim - 1), max(min(end, dim), -dim - 1)
        if step < 0 and end == -dim - 1:
            end = None  # type: ignore[assignment]
        index[axis % x.ndim] = slice(start, end, step)
    return [np.ascontiguousarray(x[tuple(index)])]


@_register("Gather")
def _gather(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, indices = inputs[0], inputs[1]
    assert x is not None and indices is not None
    axis = _attr(node, "axis", 0) % x.ndim
    return [np.take(x, indices.astype(np.int64), axis=axis, mode="wrap")]


@_register("GatherElements")
def _gather_elements(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, indices = inputs[0], inputs[1]
    assert x is not None and indices is not None
    axis = _attr(node, "axis", 0) % x.ndim
    indices = np.where(indices < 0, indices + x.shape[axis], indices)
    return [np.take_along_axis(x, indices, axis=axis)]


@_register("GatherND")
def _gather_nd(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, indices = inputs[0], inputs[1]
    assert x is not None and indices is not None
    batch = _attr(node, "batch_dims", 0)
    depth = indices.shape[-1]
    batch_shape = x.shape[:batch]
    flat_x = x.reshape((math.prod(batch_shape),) + x.shape[batch:])
    flat_idx = indices.reshape((math.prod(batch_shape), -1, depth))
    picked = np.stack([xb[tuple(ib.T)] for xb, ib in zip(flat_x, flat_idx)])
    return [picked.reshape(indices.shape[:-1] + x.shape[batch + depth:])]


@_register("ScatterElements", "Scatter")
def _scatter_elements(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, indices, updates = inputs[:3]
    assert x is not None and indices is not None and updates is not None
    axis = _attr(node, "axis", 0) % x.ndim
    indices = np.where(indices < 0, indices + x.shape[axis], indices)
    out = x.copy()
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = indices
    _scatter_reduce(node, out, tuple(grid), updates)
    return [out]


def _scatter_reduce(node: Node, out: np.ndarray, index: tuple, updates: np.ndarray) -> None:
    reduction = _attr(node, "reduction", "none")
    if reduction == "none":
        out[index] = updates
        return
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    ufunc.at(out, index, updates)


@_register("ScatterND")
def _scatter_nd(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, indices, updates = inputs[:3]
    assert x is not None and indices is not None and updates is not None
    out = x.copy()
    index = tuple(np.moveaxis(indices, -1, 0))
    _scatter_reduce(node, out, index, updates)
    return [out]


@_register("Expand")
def _expand(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, shape = inputs[0], inputs[1]
    assert x is not None and shape is not None
    target = np.broadcast_shapes(x.shape, tuple(_ints(shape)))
    return [np.broadcast_to(x, target).copy()]


@_register("Tile")
def _tile(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, repeats = inputs[0], inputs[1]
    assert x is not None and repeats is not None
    return [np.tile(x, _ints(repeats))]


@_register("Range")
def _range(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    start, limit, delta = inputs[:3]
    assert start is not None and limit is not None and delta is not None
    count = max(int(math.ceil((limit.item() - start.item()) / delta.item())), 0)
    return [(start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)]


@_register("Pad")
def _pad(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    if "pads" in node.attrs:
        pads, value = _ints(node.attrs["pads"]), _attr(node, "value", 0.0)
        axes = list(range(x.ndim))
    else:
        pads = _ints(inputs[1])
        constant = _opt(inputs, 2)
        value = 0 if constant is None or constant.size == 0 else constant.reshape(-1)[0]
        given = _opt(inputs, 3)
        axes = list(range(x.ndim)) if given is None else [a % x.ndim for a in _ints(given)]
    width = [(0, 0)] * x.ndim
    for i, axis in enumerate(axes):
        width[axis] = (pads[i], pads[i + len(axes)])
    # negative pads crop: pad by the positive part, then slice the negative part away
    grown = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    mode = _attr(node, "mode", "constant")
    if mode == "constant":
        out = np.pad(x, grown, mode="constant", constant_values=value)
    else:
        out = np.pad(x, grown, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])
    crop = tuple(slice(-min(lo, 0), out.shape[i] + min(hi, 0)) for i, (lo, hi) in enumerate(width))
    return [np.ascontiguousarray(out[crop])]


@_register("OneHot")
def _one_hot(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    indices, depth, values = inputs[:3]
    assert indices is not None and depth is not None and values is not None
    size = int(depth.reshape(-1)[0])
    idx = indices.astype(np.int64)
    idx = np.where(idx < 0, idx + size, idx)
    axis = _attr(node, "axis", -1)
    hot = np.arange(size) == idx[..., None]
    hot = np.moveaxis(hot, -1, axis % (idx.ndim + 1))
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


@_register("NonZero")
def _nonzero(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


@_register("Trilu")
def _trilu(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    k = 0 if _opt(inputs, 1) is None else int(inputs[1])  # type: ignore[arg-type]
    return [np.triu(x, k) if _attr(node, "upper", 1) else np.tril(x, k)]


@_register("EyeLike")
def _eye_like(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    dtype = _onnx_dtype(node.attrs["dtype"]) if "dtype" in node.attrs else x.dtype
    return [np.eye(x.shape[0], x.shape[1], k=_attr(node, "k", 0), dtype=dtype)]


@_register("DepthToSpace", "SpaceToDepth")
def _depth_space(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    size = _attr(node, "blocksize")
    n, c, h, w = x.shape
    if node.op_type == "SpaceToDepth":
        tiles = x.reshape(n, c, h // size, size, w // size, size).transpose(0, 3, 5, 1, 2, 4)
        return [tiles.reshape(n, c * size * size, h // size, w // size)]
    if _attr(node, "mode", "DCR") == "DCR":
        tiles = x.reshape(n, size, size, c // size**2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        tiles = x.reshape(n, c // size**2, size, size, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [tiles.reshape(n, c // size**2, h * size, w * size)]


@_register("CumSum")
def _cumsum(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, axis_value = inputs[0], inputs[1]
    assert x is not None and axis_value is not None
    axis = int(axis_value.reshape(-1)[0])
    data = np.flip(x, axis) if _attr(node, "reverse", 0) else x
    out = np.cumsum(data, axis=axis, dtype=x.dtype)
    if _attr(node, "exclusive", 0):
        out = out - data
    return [np.flip(out, axis).copy() if _attr(node, "reverse", 0) else out]


# --------------------------------------------------------------------------- reductions

def _reduce_axes(node: Node, inputs: Inputs, x: np.ndarray) -> tuple[int, ...] | None:
    """The axes to reduce; None means 'no reduction' (noop_with_empty_axes with no axes)."""
    axes = _axes_of(node, inputs, 1)
    if not axes:
        return None if _attr(node, "noop_with_empty_axes", 0) else tuple(range(x.ndim))
    return tuple(a % x.ndim for a in axes)


def _reduce_identity(op: str, dtype: np.dtype) -> Any:
    """The value an empty reduction yields (ONNX 18 'empty set' semantics)."""
    if op in ("ReduceMax", "ReduceLogSumExp", "ReduceLogSum"):
        return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min
    if op == "ReduceMin":
        return np.inf if dtype.kind == "f" else np.iinfo(dtype).max
    return None


REDUCERS: dict[str, Callable[..., np.ndarray]] = {
    "ReduceSum": lambda x, **kw: np.sum(x, **kw),
    "ReduceMean": lambda x, **kw: np.mean(x, **kw),
    "ReduceMax": lambda x, **kw: np.max(x, **kw),
    "ReduceMin": lambda x, **kw: np.min(x, **kw),
    "ReduceProd": lambda x, **kw: np.prod(x, **kw),
    "ReduceL1": lambda x, **kw: np.sum(np.abs(x), **kw),
    "ReduceL2": lambda x, **kw: np.sqrt(np.sum(np.square(x), **kw)),
    "ReduceSumSquare": lambda x, **kw: np.sum(np.square(x), **kw),
    "ReduceLogSum": lambda x, **kw: np.log(np.sum(x, **kw)),
    "ReduceLogSumExp": lambda x, **kw: _logsumexp(x, **kw),
}


def _logsumexp(x: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    if x.size == 0:
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0)
    total = np.sum(np.exp(x - peak), axis=axis, keepdims=True)
    out = np.log(total) + peak
    return out if keepdims else np.squeeze(out, axis=axis)


@_register(*REDUCERS)
def _reduce(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axes = _reduce_axes(node, inputs, x)
    if axes is None:
        return [x.copy()]
    keepdims = bool(_attr(node, "keepdims", 1))
    op = node.op_type
    empty = any(x.shape[a] == 0 for a in axes)
    with np.errstate(divide="ignore"):
        if empty and op in ("ReduceMax", "ReduceMin"):
            out = REDUCERS[op](x, axis=axes, keepdims=keepdims, initial=_reduce_identity(op, x.dtype))
        else:
            out = REDUCERS[op](x, axis=axes, keepdims=keepdims)
    return [np.asarray(out).astype(x.dtype, copy=False)]


@_register("ArgMax", "ArgMin")
def _argmax(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axis = _attr(node, "axis", 0) % x.ndim
    find = np.argmax if node.op_type == "ArgMax" else np.argmin
    if _attr(node, "select_last_index", 0):
        flipped = np.flip(x, axis)
        out = x.shape[axis] - 1 - find(flipped, axis=axis)
    else:
        out = find(x, axis=axis)
    if _attr(node, "keepdims", 1):
        out = np.expand_dims(out, axis)
    return [out.astype(np.int64)]


@_register("TopK")
def _topk(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    k = int(inputs[1].reshape(-1)[0]) if _opt(inputs, 1) is not None else _attr(node, "k")  # type: ignore[union-attr]
    axis = _attr(node, "axis", -1) % x.ndim
    largest = _attr(node, "largest", 1)
    # stable sort on the key keeps the lower index first among equal values, as ONNX asks
    key = -x if largest else x
    order = np.argsort(key, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, indices, axis=axis), indices.astype(np.int64)]


# --------------------------------------------------------------------------- normalization, softmax

def _coerced_2d(node: Node, x: np.ndarray, opset: int) -> tuple[np.ndarray, int]:
    """Before opset 13 the softmax family flattens to 2-D at `axis` (default 1)."""
    if opset >= 13:
        return x, _attr(node, "axis", -1) % max(x.ndim, 1)
    axis = _attr(node, "axis", 1) % max(x.ndim, 1)
    return x.reshape(math.prod(x.shape[:axis]), -1), 1


@_register("Softmax", "LogSoftmax", "Hardmax")
def _softmax(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    view, axis = _coerced_2d(node, x, opset)
    if node.op_type == "Hardmax":
        hot = np.argmax(view, axis=axis)
        out = (np.arange(view.shape[axis]).reshape([-1] + [1] * (view.ndim - axis - 1))
               == np.expand_dims(hot, axis)).astype(x.dtype)
        return [out.reshape(x.shape)]
    shifted = view - np.max(view, axis=axis, keepdims=True)
    if node.op_type == "LogSoftmax":
        out = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    else:
        exp = np.exp(shifted)
        out = exp / np.sum(exp, axis=axis, keepdims=True)
    return [out.reshape(x.shape).astype(x.dtype, copy=False)]


def _stash_dtype(x: np.ndarray, node: Node) -> np.dtype:
    """Statistics in float32 for fp16/bf16 inputs (stash_type=1), else in the input's dtype."""
    if _attr(node, "stash_type", 1) == 1 and _is_low_float(x.dtype):
        return np.dtype(np.float32)
    return x.dtype


@_register("LayerNormalization")
def _layer_norm(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, scale, bias = inputs[0], inputs[1], _opt(inputs, 2)
    assert x is not None and scale is not None
    axis = _attr(node, "axis", -1) % x.ndim
    eps = _attr(node, "epsilon", 1e-5)
    work = x.astype(_stash_dtype(x, node))
    axes = tuple(range(axis, x.ndim))
    mean = work.mean(axis=axes, keepdims=True)
    centered = work - mean
    inv_std = 1 / np.sqrt(np.mean(centered * centered, axis=axes, keepdims=True) + eps)
    out = centered * inv_std * scale
    if bias is not None:
        out = out + bias
    return [out.astype(x.dtype, copy=False), mean, inv_std]


def _channel_shape(x: np.ndarray) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


@_register("BatchNormalization")
def _batch_norm(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, scale, bias, mean, var = inputs[:5]
    assert x is not None and scale is not None and bias is not None
    assert mean is not None and var is not None
    eps = _attr(node, "epsilon", 1e-5)
    shape = _channel_shape(x)
    if not _attr(node, "training_mode", 0):
        inv = 1 / np.sqrt(var.reshape(shape) + eps)
        out = (x - mean.reshape(shape)) * inv * scale.reshape(shape) + bias.reshape(shape)
        return [out.astype(x.dtype, copy=False)]
    axes = (0,) + tuple(range(2, x.ndim))
    batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes)
    momentum = _attr(node, "momentum", 0.9)
    out = (x - batch_mean.reshape(shape)) / np.sqrt(batch_var.reshape(shape) + eps)
    out = out * scale.reshape(shape) + bias.reshape(shape)
    running_mean = mean * momentum + batch_mean * (1 - momentum)
    running_var = var * momentum + batch_var * (1 - momentum)
    return [out.astype(x.dtype, copy=False), running_mean.astype(mean.dtype),
            running_var.astype(var.dtype)]


@_register("InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization")
def _instance_norm(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    eps = _attr(node, "epsilon", 1e-5)
    work = x.astype(_stash_dtype(x, node))
    if node.op_type == "MeanVarianceNormalization":
        axes = tuple(_ints(_attr(node, "axes", [0, 2, 3])))
        mean = work.mean(axis=axes, keepdims=True)
        std = np.sqrt(np.mean((work - mean) ** 2, axis=axes, keepdims=True))
        return [((work - mean) / (std + 1e-9)).astype(x.dtype, copy=False)]
    groups = _attr(node, "num_groups", x.shape[1])
    grouped = work.reshape((x.shape[0], groups, -1))
    mean = grouped.mean(axis=2, keepdims=True)
    var = grouped.var(axis=2, keepdims=True)
    normed = ((grouped - mean) / np.sqrt(var + eps)).reshape(x.shape)
    scale, bias = inputs[1], inputs[2]
    assert scale is not None and bias is not None
    if node.op_type == "GroupNormalization" and scale.shape[0] != x.shape[1]:
        # opset 18 form: scale/bias per group
        scale, bias = np.repeat(scale, x.shape[1] // groups), np.repeat(bias, x.shape[1] // groups)
    out = normed * scale.reshape(_channel_shape(x)) + bias.reshape(_channel_shape(x))
    return [out.astype(x.dtype, copy=False)]


@_register("LpNormalization")
def _lp_norm(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axis, p = _attr(node, "axis", -1), _attr(node, "p", 2)
    norm = np.sum(np.abs(x) ** p, axis=axis, keepdims=True) ** (1 / p)
    return [(x / norm).astype(x.dtype, copy=False)]


@_register("LRN")
def _lrn(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    size = _attr(node, "size")
    alpha, beta, bias = _attr(node, "alpha", 1e-4), _attr(node, "beta", 0.75), _attr(node, "bias", 1.0)
    square = np.square(x)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    padded = np.pad(square, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    window_sum = sum(padded[:, i:i + x.shape[1]] for i in range(size))
    return [(x / (bias + alpha / size * window_sum) ** beta).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- contractions

@_register("MatMul")
def _matmul(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    dtype = _compute_dtype(a, b)
    return [np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False)).astype(a.dtype)]


@_register("Gemm")
def _gemm(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    a, b, c = inputs[0], inputs[1], _opt(inputs, 2)
    assert a is not None and b is not None
    dtype = _compute_dtype(a, b)
    a2, b2 = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    a2 = a2.T if _attr(node, "transA", 0) else a2
    b2 = b2.T if _attr(node, "transB", 0) else b2
    out = _attr(node, "alpha", 1.0) * (a2 @ b2)
    if c is not None:
        out = out + _attr(node, "beta", 1.0) * c.astype(dtype, copy=False)
    return [np.asarray(out).astype(a.dtype)]


@_register("Einsum")
def _einsum(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    arrays = [x for x in inputs if x is not None]
    dtype = _compute_dtype(*arrays)
    equation = _attr(node, "equation").replace(" ", "")
    out = np.einsum(equation, *[x.astype(dtype, copy=False) for x in arrays], optimize=True)
    return [np.asarray(out).astype(arrays[0].dtype)]


def _explicit_pads(node: Node, spatial: Sequence[int], kernel: Sequence[int],
                   strides: Sequence[int], dilations: Sequence[int]) -> list[int]:
    """Begin pads then end pads, resolving auto_pad (SAME_UPPER puts the odd one at the end)."""
    rank = len(spatial)
    auto_pad = _attr(node, "auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        return _ints(_attr(node, "pads", [0] * 2 * rank))
    if auto_pad == "VALID":
        return [0] * 2 * rank
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        out = -(-size // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def _windows(x: np.ndarray, kernel: Sequence[int], strides: Sequence[int],
             dilations: Sequence[int], out_shape: Sequence[int]) -> np.ndarray:
    """A (N, C, *out, *kernel) strided view of an already padded x: the im2col without copy."""
    spatial_axes = tuple(range(2, x.ndim))
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    view = np.lib.stride_tricks.sliding_window_view(x, extent, axis=spatial_axes)
    index = ((slice(None), slice(None))
             + tuple(slice(0, o * s, s) for o, s in zip(out_shape, strides))
             + tuple(slice(None, None, d) for d in dilations))
    return view[index]


def _conv_geometry(node: Node, x: np.ndarray, kernel: Sequence[int]
                   ) -> tuple[list[int], list[int], list[int], list[int]]:
    rank = x.ndim - 2
    strides = _ints(_attr(node, "strides", [1] * rank))
    dilations = _ints(_attr(node, "dilations", [1] * rank))
    pads = _explicit_pads(node, x.shape[2:], kernel, strides, dilations)
    return strides, dilations, pads[:rank], pads[rank:]


@_register("Conv")
def _conv(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    assert x is not None and w is not None
    kernel = list(w.shape[2:])
    strides, dilations, begins, ends = _conv_geometry(node, x, kernel)
    dtype = _compute_dtype(x, w)
    padded = np.pad(x.astype(dtype, copy=False),
                    [(0, 0), (0, 0)] + list(zip(begins, ends)))
    out_shape = [(p - ((k - 1) * d + 1)) // s + 1
                 for p, k, d, s in zip(padded.shape[2:], kernel, dilations, strides)]
    groups = _attr(node, "group", 1)
    n, c = x.shape[:2]
    oc = w.shape[0]
    cols = _windows(padded, kernel, strides, dilations, out_shape)
    # (N, G, C/G, *out, *k) -> (N, G, prod(out), C/G * prod(k)) for one batched GEMM per group
    rank = len(kernel)
    cols = cols.reshape((n, groups, c // groups) + cols.shape[2:])
    order = (0, 1) + tuple(range(3, 3 + rank)) + (2,) + tuple(range(3 + rank, 3 + 2 * rank))
    cols = cols.transpose(order).reshape(n, groups, math.prod(out_shape), -1)
    weights = w.astype(dtype, copy=False).reshape(groups, oc // groups, -1)
    out = np.matmul(cols, weights.transpose(0, 2, 1))  # (N, G, P, OC/G)
    out = out.transpose(0, 1, 3, 2).reshape([n, oc] + out_shape)
    if bias is not None:
        out = out + bias.astype(dtype, copy=False).reshape([1, oc] + [1] * rank)
    return [np.ascontiguousarray(out).astype(x.dtype, copy=False)]


@_register("ConvTranspose")
def _conv_transpose(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Scatter-add of each input pixel's kernel-sized contribution, then crop the pads."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    assert x is not None and w is not None
    rank = x.ndim - 2
    kernel = list(w.shape[2:])
    groups = _attr(node, "group", 1)
    strides = _ints(_attr(node, "strides", [1] * rank))
    dilations = _ints(_attr(node, "dilations", [1] * rank))
    out_pad = _ints(_attr(node, "output_padding", [0] * rank))
    n, c = x.shape[:2]
    oc = w.shape[1] * groups
    full = [(i - 1) * s + (k - 1) * d + 1 + op
            for i, s, k, d, op in zip(x.shape[2:], strides, kernel, dilations, out_pad)]
    if "output_shape" in node.attrs:
        target = _ints(node.attrs["output_shape"])[-rank:]
        total = [f - t for f, t in zip(full, target)]
        upper = _attr(node, "auto_pad", "NOTSET") != "SAME_LOWER"
        begins = [t // 2 if upper else t - t // 2 for t in total]
        ends = [t - b for t, b in zip(total, begins)]
    elif _attr(node, "auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(x.shape[2:], strides)]
        total = [f - t for f, t in zip(full, target)]
        upper = _attr(node, "auto_pad") == "SAME_UPPER"
        begins = [t // 2 if upper else t - t // 2 for t in total]
        ends = [t - b for t, b in zip(total, begins)]
    else:
        pads = _ints(_attr(node, "pads", [0] * 2 * rank))
        begins, ends = pads[:rank], pads[rank:]
    dtype = _compute_dtype(x, w)
    xg = x.astype(dtype, copy=False).reshape((n, groups, c // groups) + x.shape[2:])
    wg = w.astype(dtype, copy=False).reshape((groups, c // groups, oc // groups) + tuple(kernel))
    # contribution of every input pixel: (N, G, OC/G, *in, *k)
    contrib = np.einsum("ngc...,gco...->ngo...", xg.reshape(n, groups, c // groups, -1),
                        wg.reshape(groups, c // groups, oc // groups, -1), optimize=True)
    contrib = contrib.reshape((n, groups, oc // groups) + x.shape[2:] + tuple(kernel))
    out = np.zeros((n, groups, oc // groups) + tuple(full), dtype=dtype)
    for offset in np.ndindex(*kernel):
        index = tuple(slice(o * d, o * d + (i - 1) * s + 1, s)
                      for o, d, i, s in zip(offset, dilations, x.shape[2:], strides))
        out[(Ellipsis,) + index] += contrib[(Ellipsis,) + offset]
    out = out.reshape((n, oc) + tuple(full))
    crop = tuple(slice(b, f - e) for b, e, f in zip(begins, ends, full))
    out = out[(slice(None), slice(None)) + crop]
    if bias is not None:
        out = out + bias.astype(dtype).reshape([1, oc] + [1] * rank)
    return [np.ascontiguousarray(out).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- pooling

def _pool_geometry(node: Node, x: np.ndarray) -> tuple[list[int], list[int], list[int],
                                                       list[int], list[int], list[int]]:
    """kernel, strides, dilations, begin pads, end pads (incl. ceil_mode extra), output shape."""
    kernel = _ints(_attr(node, "kernel_shape"))
    rank = len(kernel)
    strides = _ints(_attr(node, "strides", [1] * rank))
    dilations = _ints(_attr(node, "dilations", [1] * rank))
    pads = _explicit_pads(node, x.shape[2:], kernel, strides, dilations)
    begins, ends = pads[:rank], pads[rank:]
    out_shape, extra = [], []
    for size, k, s, d, b, e in zip(x.shape[2:], kernel, strides, dilations, begins, ends):
        span = size + b + e - ((k - 1) * d + 1)
        out = span // s + 1
        if _attr(node, "ceil_mode", 0):
            out = -(-span // s) + 1
            if (out - 1) * s >= size + b:  # a last window that starts in the end padding: drop
                out -= 1
        out_shape.append(out)
        extra.append(max((out - 1) * s + (k - 1) * d + 1 - (size + b + e), 0))
    return kernel, strides, dilations, begins, [e + x for e, x in zip(ends, extra)], out_shape


@_register("MaxPool", "AveragePool", "LpPool")
def _pool(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    kernel, strides, dilations, begins, ends, out_shape = _pool_geometry(node, x)
    width = [(0, 0), (0, 0)] + list(zip(begins, ends))
    spatial = tuple(range(-len(kernel), 0))
    if node.op_type == "MaxPool":
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        padded = np.pad(x, width, constant_values=low)
        windows = _windows(padded, kernel, strides, dilations, out_shape)
        out = windows.max(axis=spatial)
        if len(node.outputs) > 1 and node.outputs[1]:
            return [out, _max_pool_indices(node, x, windows, begins, strides, dilations)]
        return [out]
    padded = np.pad(x, width)
    windows = _windows(padded, kernel, strides, dilations, out_shape)
    if node.op_type == "LpPool":
        p = _attr(node, "p", 2)
        return [(np.sum(np.abs(windows) ** p, axis=spatial) ** (1 / p)).astype(x.dtype)]
    # the count: real elements, plus the explicit pads when count_include_pad (never ceil extra)
    weight = np.zeros((1, 1) + x.shape[2:], dtype=x.dtype)
    weight[...] = 1
    if _attr(node, "count_include_pad", 0):
        explicit = _explicit_pads(node, x.shape[2:], kernel, strides, dilations)
        rank = len(kernel)
        weight = np.pad(weight, [(0, 0), (0, 0)] + list(zip(explicit[:rank], explicit[rank:])),
                        constant_values=1)
        tail = [(0, 0), (0, 0)] + [(0, e - explicit[rank + i]) for i, e in enumerate(ends)]
        head_fix = [(0, 0), (0, 0)] + [(b - explicit[i], 0) for i, b in enumerate(begins)]
        weight = np.pad(np.pad(weight, tail), head_fix)
    else:
        weight = np.pad(weight, width)
    counts = _windows(weight, kernel, strides, dilations, out_shape).sum(axis=spatial)
    return [(windows.sum(axis=spatial) / counts).astype(x.dtype, copy=False)]


def _max_pool_indices(node: Node, x: np.ndarray, windows: np.ndarray, begins: Sequence[int],
                      strides: Sequence[int], dilations: Sequence[int]) -> np.ndarray:
    """Flat indices (row-major, or column-major per storage_order) of each window's maximum."""
    rank = len(begins)
    flat = windows.reshape(windows.shape[:2 + rank] + (-1,))
    best = np.argmax(flat, axis=-1)
    kernel = windows.shape[2 + rank:]
    offsets = np.unravel_index(best, kernel)
    grid = np.indices(windows.shape[2:2 + rank], sparse=True)
    coords = [g * s + o * d - b for g, o, s, d, b in zip(grid, offsets, strides, dilations, begins)]
    spatial = x.shape[2:]
    if _attr(node, "storage_order", 0):
        position = sum(c * math.prod(spatial[:i]) for i, c in enumerate(coords))
    else:
        position = np.ravel_multi_index(tuple(coords), spatial)
    n, c = x.shape[:2]
    base = (np.arange(n)[:, None] * c + np.arange(c)[None, :]) * math.prod(spatial)
    return (position + base.reshape((n, c) + (1,) * rank)).astype(np.int64)


@_register("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _global_pool(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axes = tuple(range(2, x.ndim))
    if node.op_type == "GlobalAveragePool":
        out = x.mean(axis=axes, keepdims=True)
    elif node.op_type == "GlobalMaxPool":
        out = x.max(axis=axes, keepdims=True)
    else:
        p = _attr(node, "p", 2)
        out = np.sum(np.abs(x) ** p, axis=axes, keepdims=True) ** (1 / p)
    return [out.astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- running

SUPPORTED_OPS: frozenset[str] = frozenset(OPS)


def run_nodes(nodes: Sequence[Node], env: dict[str, np.ndarray], opset: int) -> None:
    """Run nodes in order, reading inputs from env and writing their outputs into it."""
    for node in nodes:
        impl = OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if impl is None:
            raise UnsupportedOpError(node.op_type, node.name)
        args: Inputs = [env[name] if name else None for name in node.inputs]
        outputs = impl(node, args, opset)
        for index, name in enumerate(node.outputs):
            if not name:
                continue
            if index >= len(outputs):
                raise UnsupportedOpError(node.op_type, node.name, f"output {index} is not computed")
            env[name] = np.asarray(outputs[index])


def check_feeds(graph: Graph, feeds: Mapping[str, np.ndarray]) -> None:
    """Every graph input present with its bound shape and dtype: else a ModelError naming it."""
    for name in graph.inputs:
        if name not in feeds:
            raise ModelError(f"missing input '{name}' (expects {graph.values[name]})")
        spec, value = graph.values[name], np.asarray(feeds[name])
        if tuple(value.shape) != spec.shape or value.dtype.name != spec.dtype:
            got = f"{'x'.join(map(str, value.shape)) or 'scalar'}:{value.dtype.name}"
            raise ModelError(f"input '{name}' is {got}, the model is bound to {spec}")
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise ModelError(f"unknown input(s) {', '.join(unknown)}; inputs: {', '.join(graph.inputs)}")


def run_graph(graph: Graph, feeds: Mapping[str, np.ndarray],
              overrides: Mapping[str, Callable[[dict[str, np.ndarray]], None]] | None = None
              ) -> dict[str, np.ndarray]:
    """Run the whole graph; a node named in `overrides` runs the override instead (kernels)."""
    check_feeds(graph, feeds)
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update({name: np.asarray(value) for name, value in feeds.items()})
    overrides = overrides or {}
    for node in graph.nodes:
        override = overrides.get(node.name)
        if override is not None:
            override(env)
        else:
            run_nodes([node], env, graph.opset)
    return {name: env[name] for name in graph.outputs}
