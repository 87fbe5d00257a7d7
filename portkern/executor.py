"""The numpy reference executor: ONNX semantics, one registry of op implementations.

It is the ground truth every kernel is checked against (tasks run their subgraph here in float64),
the constant folder of the importer, and the CPU fallback of the runtime. It favours plain, exact
numpy over speed: a float64 env computes in float64, float32 in float32, float16 in float16, with
documented exceptions: the contractions (MatMul, Gemm, Conv, ConvTranspose, Einsum and the two
products inside Attention) compute float16/bfloat16 operands in float32 and cast the result back,
because numpy has no fp16 BLAS and its fp16 loops accumulate in fp16 (what onnxruntime and every
GPU library avoid); the resampling and quantized ops (Resize, GridSample, RoiAlign, DeformConv,
QLinear*, ConvInteger) compute in float64 and cast back, so their rounding is the exact one.
Erf (numpy has none) is a vectorized series and continued fraction within 1e-15 of libm's erf
(checked against math.erf in the tests), 1.4-2.6x faster here than libm called element by element,
which matters: a BERT GELU GEMM's gate references (12.6M erfs each) took 16 s on the H200 host.

Attributes arrive as the importer converts them (`onnx_import.node_from_proto`): ints, floats,
str, lists of those, and tensors as numpy arrays. Opset-dependent forms (axes as attribute before
opset 13/18, as input after) are read from wherever the node carries them, so one implementation
serves every opset; only Softmax/LogSoftmax/Hardmax (2-D coercion before 13) look at the opset.
"""
from __future__ import annotations

import itertools
import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from .errors import ModelError, UnsupportedOpError
from .ir import Graph, Node, TensorSpec
from .layout import is_channels_last, run_as_nchw

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

_ERF_SERIES_BELOW = 2.5  # |x| below: the series; above: erfc's continued fraction
_ERF_INVERSE_ODD = 1.0 / (2.0 * np.arange(1, 37) + 1.0)  # 36 terms: 9e-16 at |x| = 2.5
_ERF_FRACTION_TERMS = 60  # 9e-16 at |x| = 2.5, better beyond
_ERF_CHUNK = 1 << 15  # elements per pass: each step's operands stay in the core's cache


def _erf_chunk(x: np.ndarray) -> np.ndarray:
    a = np.abs(x)
    out = np.empty_like(a)
    small = a < _ERF_SERIES_BELOW
    # erf(a) = 2/sqrt(pi) a exp(-a^2) sum_n (2a^2)^n / (2n+1)!!: positive terms, no cancellation
    xs = a[small]
    y = 2.0 * xs * xs
    total = np.ones_like(xs)
    for inverse in _ERF_INVERSE_ODD[::-1]:
        total *= y * inverse
        total += 1.0
    out[small] = (2.0 / math.sqrt(math.pi)) * xs * np.exp(-xs * xs) * total
    # erfc(a) = exp(-a^2) / sqrt(pi) / (a + (1/2) / (a + 1 / (a + (3/2) / (a + ...)))), evaluated
    # from the tail; inf stays inf, nan stays nan
    xb = a[~small]
    with np.errstate(invalid="ignore"):
        fraction = xb.copy()
        for k in range(_ERF_FRACTION_TERMS, 0, -1):
            fraction = xb + (0.5 * k) / fraction
        out[~small] = np.where(np.isinf(xb), 1.0, 1.0 - np.exp(-xb * xb) / (math.sqrt(math.pi) * fraction))
    return np.copysign(out, x)


def _erf(x: np.ndarray) -> np.ndarray:
    values = np.asarray(x, dtype=np.float64)
    flat = values.reshape(-1)
    out = np.empty_like(flat)
    for start in range(0, flat.size, _ERF_CHUNK):
        out[start:start + _ERF_CHUNK] = _erf_chunk(flat[start:start + _ERF_CHUNK])
    return out.reshape(values.shape).astype(np.asarray(x).dtype, copy=False)


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


def _selu(node: Node, x: np.ndarray) -> np.ndarray:
    alpha = _attr(node, "alpha", 1.67326319217681884765625)
    gamma = _attr(node, "gamma", 1.05070102214813232421875)
    return gamma * np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


def _celu(node: Node, x: np.ndarray) -> np.ndarray:
    alpha = _attr(node, "alpha", 1.0)
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(x / alpha))


def _shrink(node: Node, x: np.ndarray) -> np.ndarray:
    bias, lambd = _attr(node, "bias", 0.0), _attr(node, "lambd", 0.5)
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


def _gelu(node: Node, x: np.ndarray) -> np.ndarray:
    if _attr(node, "approximate", "none") == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _swish(node: Node, x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(np.asarray(_attr(node, "alpha", 1.0) * x, dtype=x.dtype))


# unary ops with attributes: fn(node, x)
PARAM_UNARY: dict[str, Callable[[Node, np.ndarray], np.ndarray]] = {
    "LeakyRelu": lambda node, x: np.where(x >= 0, x, x * _attr(node, "alpha", 0.01)),
    "Elu": lambda node, x: np.where(x > 0, x,
                                    _attr(node, "alpha", 1.0) * np.expm1(np.minimum(x, 0))),
    "HardSigmoid": lambda node, x: np.clip(
        _attr(node, "alpha", 0.2) * x + _attr(node, "beta", 0.5), 0, 1),
    "ThresholdedRelu": lambda node, x: np.where(x > _attr(node, "alpha", 1.0), x, 0),
    "Selu": _selu, "Celu": _celu, "Shrink": _shrink, "Gelu": _gelu, "Swish": _swish,
}


@_register(*PARAM_UNARY)
def _param_unary(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    with np.errstate(over="ignore", invalid="ignore"):
        return [np.asarray(PARAM_UNARY[node.op_type](node, x)).astype(x.dtype, copy=False)]


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


def _bit_shift(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.left_shift(a, b) if _attr(node, "direction") == "LEFT" else np.right_shift(a, b)


def _mod(node: Node, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """fmod=1: the sign of the dividend (C fmod); fmod=0: the sign of the divisor (Python)."""
    return np.fmod(a, b) if _attr(node, "fmod", 0) else np.mod(a, b)


def _ufunc2(ufunc: Callable[[np.ndarray, np.ndarray], np.ndarray]
            ) -> Callable[[Node, np.ndarray, np.ndarray], np.ndarray]:
    return lambda node, a, b: ufunc(a, b)


# binary ops: fn(node, a, b); the result keeps a's dtype unless it is boolean
BINARY: dict[str, Callable[[Node, np.ndarray, np.ndarray], np.ndarray]] = {
    "Add": _ufunc2(np.add), "Sub": _ufunc2(np.subtract), "Mul": _ufunc2(np.multiply),
    "Div": _ufunc2(_div), "Pow": _ufunc2(_pow), "Equal": _ufunc2(np.equal),
    "Less": _ufunc2(np.less), "Greater": _ufunc2(np.greater),
    "LessOrEqual": _ufunc2(np.less_equal), "GreaterOrEqual": _ufunc2(np.greater_equal),
    "And": _ufunc2(np.logical_and), "Or": _ufunc2(np.logical_or), "Xor": _ufunc2(np.logical_xor),
    "BitwiseAnd": _ufunc2(np.bitwise_and), "BitwiseOr": _ufunc2(np.bitwise_or),
    "BitwiseXor": _ufunc2(np.bitwise_xor), "BitShift": _bit_shift, "Mod": _mod,
    "PRelu": lambda node, a, b: np.where(a < 0, a * b, a),
}


@_register(*BINARY)
def _binary(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.asarray(BINARY[node.op_type](node, a, b))
    return [out if out.dtype == np.bool_ else out.astype(a.dtype, copy=False)]


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
    if target.name.startswith("float8") and _attr(node, "saturate", 1):
        import ml_dtypes

        limit = float(ml_dtypes.finfo(target).max)
        wide = x.astype(np.float32)
        return [np.where(np.isnan(wide), wide, np.clip(wide, -limit, limit)).astype(target)]
    return [x.astype(target)]


@_register("Identity", "Dropout")
def _identity(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Dropout is inference-only here: an identity with an all-true mask (training mode only
    with ratio 0, where it is the same; random drops would make the reference irreproducible)."""
    x = inputs[0]
    assert x is not None
    training = _opt(inputs, 2)
    ratio = _opt(inputs, 1)
    if node.op_type == "Dropout" and training is not None and bool(training):
        if ratio is None or float(ratio) != 0.0:
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
    axis = _attr(node, "axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
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


def slice_arguments(node: Node, inputs: Sequence[Any]) -> list[tuple[int, int, int, int]]:
    """(start, end, axis, step) per sliced axis of a Slice node, as given: attributes before
    opset 10 (unit steps), inputs from then on; axes may be negative, bounds out of range."""
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
    return list(zip(starts, ends, axes, steps))


def one_axis_cut(node: Node, constants: Mapping[str, np.ndarray],
                 shape: Sequence[int]) -> tuple[int, int, int, int] | None:
    """(axis, start, end, step) of a Slice of an input of `shape` that cuts one axis forwards with
    constant bounds, the axis non-negative and the bounds resolved as Python's slicing does (ONNX's
    are the same); None for any other Slice."""
    if node.op_type != "Slice" or any(name and name not in constants for name in node.inputs[1:]):
        return None
    cuts = slice_arguments(node, [None, *(constants.get(name) if name else None for name in node.inputs[1:])])
    if len(cuts) != 1 or cuts[0][3] < 1:
        return None
    start, end, axis, step = cuts[0]
    axis %= len(shape)
    start, end, _ = slice(start, end, step).indices(shape[axis])
    return axis, start, end, step


def one_axis_slice(node: Node, constants: Mapping[str, np.ndarray],
                   shape: Sequence[int]) -> tuple[int, int, int] | None:
    """(axis, start, end) of a one_axis_cut with unit steps; None for any other Slice."""
    cut = one_axis_cut(node, constants, shape)
    return cut[:3] if cut is not None and cut[3] == 1 else None


@_register("Slice")
def _slice(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    index = [slice(None)] * x.ndim
    for start, end, axis, step in slice_arguments(node, inputs):
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
    indices = indices.astype(np.int64)
    # negative indices count from the end; out-of-range ones raise (never wrap silently)
    return [np.take(x, np.where(indices < 0, indices + x.shape[axis], indices), axis=axis)]


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
    grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
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


def pad_arguments(node: Node, inputs: Sequence[Any], ndim: int) -> tuple[list[tuple[int, int]], Any]:
    """Pad's (begin, end) per axis (negative: a crop) and its fill value, from the attributes
    (before opset 11) or the inputs (pads, constant_value, axes); the value is a scalar of the
    constant_value input's kind (numpy or torch) or a float. Shared with the device glue."""
    if "pads" in node.attrs:
        pads, value = _ints(node.attrs["pads"]), _attr(node, "value", 0.0)
        axes = list(range(ndim))
    else:
        pads = _ints(inputs[1])
        constant = _opt(inputs, 2)
        value = 0 if constant is None or 0 in constant.shape else constant.reshape(-1)[0]
        given = _opt(inputs, 3)
        axes = list(range(ndim)) if given is None else [a % ndim for a in _ints(given)]
    width = [(0, 0)] * ndim
    for i, axis in enumerate(axes):
        width[axis] = (pads[i], pads[i + len(axes)])
    return width, value


@_register("Pad")
def _pad(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    width, value = pad_arguments(node, inputs, x.ndim)
    # negative pads crop: pad by the positive part, then slice the negative part away
    grown = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    mode = _attr(node, "mode", "constant")
    if mode == "constant":
        out = np.pad(x, grown, mode="constant", constant_values=value)
    else:
        numpy_mode: Any = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode]
        out = np.pad(x, grown, mode=numpy_mode)
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


def depth_space_plan(node: Node, shape: Sequence[int]
                     ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """DepthToSpace/SpaceToDepth as reshape -> transpose -> reshape: the tiled shape, the axis
    order and the output shape (DCR or CRD). Shared with the device glue."""
    size = _attr(node, "blocksize")
    n, c, h, w = shape
    dcr = _attr(node, "mode", "DCR") == "DCR"
    if node.op_type == "SpaceToDepth":
        order = (0, 3, 5, 1, 2, 4) if dcr else (0, 1, 3, 5, 2, 4)
        return (n, c, h // size, size, w // size, size), order, (n, c * size * size, h // size, w // size)
    depth = c // size**2
    if dcr:
        tiles, order = (n, size, size, depth, h, w), (0, 3, 4, 1, 5, 2)
    else:
        tiles, order = (n, depth, size, size, h, w), (0, 1, 4, 2, 5, 3)
    return tiles, order, (n, depth, h * size, w * size)


@_register("DepthToSpace", "SpaceToDepth")
def _depth_space(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    tiles, order, out_shape = depth_space_plan(node, x.shape)
    return [x.reshape(tiles).transpose(order).reshape(out_shape)]


# --------------------------------------------------------------------------- reductions

def _reduce_axes(node: Node, inputs: Inputs, x: np.ndarray) -> tuple[int, ...] | None:
    """The axes to reduce; None means 'no reduction' (noop_with_empty_axes with no axes)."""
    axes = _axes_of(node, inputs, 1)
    if not axes:
        return None if _attr(node, "noop_with_empty_axes", 0) else tuple(range(x.ndim))
    return tuple(a % x.ndim for a in axes)


def _reduce_identity(op: str, dtype: np.dtype) -> Any:
    """The value an empty reduction yields (ONNX 18 'empty set' semantics)."""
    if dtype == np.bool_:
        return op == "ReduceMin"
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
    # among equal values the lower index comes first (ONNX): a stable ascending sort does that;
    # for descending order sort the reversed axis and map back (negating breaks unsigned types)
    if largest:
        size = x.shape[axis]
        order = size - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
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
    # fp16/bf16 in float32, rounded once at the end, as onnxruntime's CPU provider and cuDNN compute
    # it (BiT's weight standardization, a training-mode BatchNormalization of each float16 weight,
    # rounded at each step, was 7x onnxruntime's float16 error on the model's output)
    work = x.astype(_stash_dtype(x, node))
    if not _attr(node, "training_mode", 0):
        inv = 1 / np.sqrt(var.reshape(shape).astype(work.dtype) + eps)
        out = (work - mean.reshape(shape)) * inv * scale.reshape(shape) + bias.reshape(shape)
        return [out.astype(x.dtype, copy=False)]
    axes = (0,) + tuple(range(2, x.ndim))
    batch_mean, batch_var = work.mean(axis=axes), work.var(axis=axes)
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
    with np.errstate(invalid="ignore", divide="ignore"):
        return [np.where(norm == 0, 0, x / norm).astype(x.dtype, copy=False)]


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

def _contract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b accumulated in the compute dtype, returned in a's dtype."""
    dtype = _compute_dtype(a, b)
    return np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False)).astype(a.dtype)


@_register("MatMul")
def _matmul(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [_contract(a, b)]


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
    # (N, C, *out, *k) -> (N, G, C/G * prod(k), prod(out)): one batched GEMM per group whose
    # result is already NC(spatial); for a 1x1 stride-1 conv the reshape is a view, no copy
    rank = len(kernel)
    cols = cols.reshape((n, groups, c // groups) + cols.shape[2:])
    order = (0, 1, 2) + tuple(range(3 + rank, 3 + 2 * rank)) + tuple(range(3, 3 + rank))
    cols = cols.transpose(order).reshape(n, groups, -1, math.prod(out_shape))
    weights = w.astype(dtype, copy=False).reshape(groups, oc // groups, -1)
    out = np.matmul(weights, cols).reshape([n, oc] + out_shape)
    if bias is not None:
        out = out + bias.astype(dtype, copy=False).reshape([1, oc] + [1] * rank)
    return [np.ascontiguousarray(out).astype(x.dtype, copy=False)]


class ConvTransposeGeometry(NamedTuple):
    strides: list[int]
    dilations: list[int]
    output_padding: list[int]
    full: list[int]  # each spatial size before the pads: every contribution, then output_padding's zeros
    begins: list[int]  # pads cropped off the full output (negative: zeros added)
    ends: list[int]


def conv_transpose_geometry(node: Node, x_shape: Sequence[int], w_shape: Sequence[int]) -> ConvTransposeGeometry:
    """A ConvTranspose's sizes and pads (output_shape and auto_pad resolved), for the executor and
    the device glue alike."""
    rank = len(x_shape) - 2
    kernel = list(w_shape[2:])
    strides = _ints(_attr(node, "strides", [1] * rank))
    dilations = _ints(_attr(node, "dilations", [1] * rank))
    out_pad = _ints(_attr(node, "output_padding", [0] * rank))
    full = [(i - 1) * s + (k - 1) * d + 1 + op
            for i, s, k, d, op in zip(x_shape[2:], strides, kernel, dilations, out_pad)]
    if "output_shape" in node.attrs or _attr(node, "auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER"):
        target = (_ints(node.attrs["output_shape"])[-rank:] if "output_shape" in node.attrs
                  else [i * s for i, s in zip(x_shape[2:], strides)])
        total = [f - t for f, t in zip(full, target)]
        upper = _attr(node, "auto_pad", "NOTSET") == "SAME_UPPER"
        begins = [t // 2 if upper else t - t // 2 for t in total]
        ends = [t - b for t, b in zip(total, begins)]
    else:
        pads = _ints(_attr(node, "pads", [0] * 2 * rank))
        begins, ends = pads[:rank], pads[rank:]
    return ConvTransposeGeometry(strides, dilations, out_pad, full, begins, ends)


@_register("ConvTranspose")
def _conv_transpose(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Scatter-add of each input pixel's kernel-sized contribution, then crop the pads."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    assert x is not None and w is not None
    rank = x.ndim - 2
    kernel = list(w.shape[2:])
    groups = _attr(node, "group", 1)
    strides, dilations, _, full, begins, ends = conv_transpose_geometry(node, x.shape, w.shape)
    n, c = x.shape[:2]
    oc = w.shape[1] * groups
    dtype = _compute_dtype(x, w)
    xg = x.astype(dtype, copy=False).reshape(n, groups, c // groups, -1)
    wg = w.astype(dtype, copy=False).reshape(groups, c // groups, oc // groups, -1)
    # contribution of every input pixel: (N, G, OC/G, *in, *k)
    contrib = np.einsum("ngcp,gcok->ngopk", xg, wg, optimize=True)
    contrib = contrib.reshape((n, groups, oc // groups) + x.shape[2:] + tuple(kernel))
    out = np.zeros((n, groups, oc // groups) + tuple(full), dtype=dtype)
    for offset in np.ndindex(*kernel):
        index = tuple(slice(o * d, o * d + (i - 1) * s + 1, s)
                      for o, d, i, s in zip(offset, dilations, x.shape[2:], strides))
        out[(Ellipsis,) + index] += contrib[(Ellipsis,) + offset]
    out = out.reshape((n, oc) + tuple(full))
    # positive pads crop; negative ones (an output_shape beyond the full size) extend with zeros
    out = np.pad(out, [(0, 0), (0, 0)] + [(max(-b, 0), max(-e, 0)) for b, e in zip(begins, ends)])
    crop = tuple(slice(max(b, 0), size - max(e, 0)) for b, e, size in
                 zip(begins, ends, out.shape[2:]))
    out = out[(slice(None), slice(None)) + crop]
    if bias is not None:
        out = out + bias.astype(dtype).reshape([1, oc] + [1] * rank)
    return [np.ascontiguousarray(out).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- pooling

class _PoolGeometry(NamedTuple):
    kernel: list[int]  # taps a window has, cut to the padded input (a larger kernel reads only ceil room)
    strides: list[int]
    dilations: list[int]
    begins: list[int]  # explicit (or auto_pad) pads
    ends: list[int]
    extra: list[int]  # ceil_mode: room for the last partial window, past the end pads
    out_shape: list[int]

    def padding(self) -> list[tuple[int, int]]:
        return [(0, 0), (0, 0)] + [(b, e + x) for b, e, x in zip(self.begins, self.ends, self.extra)]


def _pool_geometry(node: Node, x: np.ndarray) -> _PoolGeometry:
    kernel = _ints(_attr(node, "kernel_shape"))
    rank = len(kernel)
    strides = _ints(_attr(node, "strides", [1] * rank))
    dilations = _ints(_attr(node, "dilations", [1] * rank))
    pads = _explicit_pads(node, x.shape[2:], kernel, strides, dilations)
    begins, ends = pads[:rank], pads[rank:]
    out_shape, extra, taps = [], [], []
    for size, k, s, d, b, e in zip(x.shape[2:], kernel, strides, dilations, begins, ends):
        span = size + b + e - ((k - 1) * d + 1)
        out = span // s + 1
        if _attr(node, "ceil_mode", 0):
            out = -(-span // s) + 1
            if (out - 1) * s >= size + b:  # a last window that starts in the end padding: drop
                out -= 1
        # taps past the padded input only ever see the ceil room (not counted, never the max), so
        # a window is cut to those that fit: HF EfficientNet pools 7x7 maps with a 2560x2560 kernel
        k = min(k, (size + b + e - 1) // d + 1)
        out_shape.append(out)
        taps.append(k)
        extra.append(max((out - 1) * s + (k - 1) * d + 1 - (size + b + e), 0))
    return _PoolGeometry(taps, strides, dilations, begins, ends, extra, out_shape)


@_register("MaxPool", "AveragePool", "LpPool")
def _pool(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    geometry = _pool_geometry(node, x)
    kernel, strides, dilations, out_shape = (geometry.kernel, geometry.strides,
                                             geometry.dilations, geometry.out_shape)
    spatial = tuple(range(-len(kernel), 0))
    if node.op_type == "MaxPool":
        low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        padded = np.pad(x, geometry.padding(), constant_values=low)
        windows = _windows(padded, kernel, strides, dilations, out_shape)
        out = windows.max(axis=spatial)
        if len(node.outputs) > 1 and node.outputs[1]:
            return [out, _max_pool_indices(node, x, windows, geometry.begins, strides, dilations)]
        return [out]
    windows = _windows(np.pad(x, geometry.padding()), kernel, strides, dilations, out_shape)
    if node.op_type == "LpPool":
        p = _attr(node, "p", 2)
        return [(np.sum(np.abs(windows) ** p, axis=spatial) ** (1 / p)).astype(x.dtype)]
    # the divisor: real elements, plus the explicit pads if count_include_pad (never ceil extra)
    ones = np.ones((1, 1) + x.shape[2:], dtype=x.dtype)
    if _attr(node, "count_include_pad", 0):
        explicit = [(0, 0), (0, 0)] + list(zip(geometry.begins, geometry.ends))
        counted = np.pad(np.pad(ones, explicit, constant_values=1),
                         [(0, 0), (0, 0)] + [(0, extra) for extra in geometry.extra])
    else:
        counted = np.pad(ones, geometry.padding())
    counts = _windows(counted, kernel, strides, dilations, out_shape).sum(axis=spatial)
    return [(windows.sum(axis=spatial) / counts).astype(x.dtype, copy=False)]


def _max_pool_indices(node: Node, x: np.ndarray, windows: np.ndarray, begins: Sequence[int],
                      strides: Sequence[int], dilations: Sequence[int]) -> np.ndarray:
    """Flat indices (row-major, or column-major per storage_order) of each window's maximum."""
    rank = len(begins)
    flat = windows.reshape(windows.shape[:2 + rank] + (-1,))
    best = np.argmax(flat, axis=-1)
    kernel = windows.shape[2 + rank:]
    offsets = np.unravel_index(best, kernel)
    grid: tuple[np.ndarray, ...] = np.indices(windows.shape[2:2 + rank], sparse=True)
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


def _channels_last(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """An NHWC op (layout.py) as its ONNX op on transposed views: it means exactly what ONNX says."""
    (out,) = run_as_nchw(node, inputs, lambda onnx_node, args: OPS[onnx_node.op_type](onnx_node, args, opset),
                         np.transpose)
    return [np.ascontiguousarray(out)]


# --------------------------------------------------------------------------- more activations, scans

@_register("SwiGLU")
def _swiglu(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    gate, value = inputs[0], inputs[1]
    assert gate is not None and value is not None
    return [(_swish(node, gate) * value).astype(gate.dtype, copy=False)]


@_register("CumSum", "CumProd")
def _cumulative(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, axis_value = inputs[0], inputs[1]
    assert x is not None and axis_value is not None
    axis = int(axis_value.reshape(-1)[0]) % max(x.ndim, 1)
    reverse = _attr(node, "reverse", 0)
    data = np.flip(x, axis) if reverse else x
    if _attr(node, "exclusive", 0):  # shift by one, the op's identity entering first
        identity = np.full_like(np.take(data, [0], axis=axis), 0 if node.op_type == "CumSum" else 1)
        data = np.concatenate([identity, np.take(data, np.arange(x.shape[axis] - 1), axis=axis)],
                              axis=axis)
    scan = np.cumsum if node.op_type == "CumSum" else np.cumprod
    out = scan(data, axis=axis, dtype=x.dtype)
    return [np.ascontiguousarray(np.flip(out, axis)) if reverse else out]


@_register("BitCast")
def _bitcast(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    return [np.ascontiguousarray(x).view(_onnx_dtype(_attr(node, "to"))).reshape(x.shape)]


@_register("Det")
def _det(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    return [np.asarray(np.linalg.det(x)).astype(x.dtype)]


@_register("Compress")
def _compress(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, condition = inputs[0], inputs[1]
    assert x is not None and condition is not None
    return [np.compress(condition.astype(bool), x, axis=_attr(node, "axis", None))]


@_register("ReverseSequence")
def _reverse_sequence(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, lengths = inputs[0], inputs[1]
    assert x is not None and lengths is not None
    batch_axis, time_axis = _attr(node, "batch_axis", 1), _attr(node, "time_axis", 0)
    out = x.copy()
    for batch, length in enumerate(_ints(lengths)):
        index: list[Any] = [slice(None)] * x.ndim
        index[batch_axis] = batch
        index[time_axis] = slice(0, length)
        out[tuple(index)] = np.flip(x[tuple(index)], axis=time_axis - (batch_axis < time_axis))
    return [out]


@_register("Unique")
def _unique(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    axis = _attr(node, "axis", None)
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True,
                                               return_counts=True, axis=axis)
    if not _attr(node, "sorted", 1):  # order of first occurrence instead of ascending
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        values = values[order] if axis is None else np.take(values, order, axis=axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return [values, first.astype(np.int64), inverse.reshape(-1).astype(np.int64),
            counts.astype(np.int64)]


@_register("CenterCropPad")
def _center_crop_pad(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, shape = inputs[0], inputs[1]
    assert x is not None and shape is not None
    axes = [a % x.ndim for a in _ints(_attr(node, "axes", list(range(x.ndim))))]
    out = x
    for axis, target in zip(axes, _ints(shape)):
        size = out.shape[axis]
        if size > target:
            start = (size - target) // 2
            out = np.take(out, np.arange(start, start + target), axis=axis)
        elif size < target:
            width = [(0, 0)] * x.ndim
            width[axis] = ((target - size) // 2, target - size - (target - size) // 2)
            out = np.pad(out, width)
    return [np.ascontiguousarray(out)]


@_register("TensorScatter")
def _tensor_scatter(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    cache, update, positions = inputs[0], inputs[1], _opt(inputs, 2)
    assert cache is not None and update is not None
    axis = _attr(node, "axis", -2) % cache.ndim
    circular = _attr(node, "mode", "linear") == "circular"
    out = cache.copy()
    starts = np.zeros(cache.shape[0], np.int64) if positions is None else positions
    for batch, start in enumerate(_ints(starts)):
        slots = start + np.arange(update.shape[axis])
        if circular:
            slots %= cache.shape[axis]
        target = np.moveaxis(out[batch], axis - 1, 0)
        target[slots] = np.moveaxis(update[batch], axis - 1, 0)
    return [out]


# --------------------------------------------------------------------------- quantization

def _quant_param(value: np.ndarray, x: np.ndarray, node: Node) -> np.ndarray:
    """A scale or zero point broadcast to x: per tensor, per axis (1-D) or blocked."""
    axis = _attr(node, "axis", 1) % x.ndim
    block = _attr(node, "block_size", 0)
    if block and value.size > 1:
        return np.take(np.repeat(value, block, axis=axis), np.arange(x.shape[axis]), axis=axis)
    return _along(value, x.ndim, axis)


def _saturate(values: np.ndarray, dtype: np.dtype, saturate: bool = True) -> np.ndarray:
    """Round half to even then clamp to the integer type's range (or cast a float type)."""
    import ml_dtypes

    if dtype.name.startswith("float"):
        if saturate and dtype.name.startswith("float8"):
            limit = float(ml_dtypes.finfo(dtype).max)
            values = np.where(np.isnan(values), values, np.clip(values, -limit, limit))
        return values.astype(dtype)
    info = ml_dtypes.iinfo(dtype) if dtype.name.startswith(("int4", "uint4", "int2", "uint2")) \
        else np.iinfo(dtype)
    return np.clip(np.rint(values), info.min, info.max).astype(dtype)


@_register("QuantizeLinear")
def _quantize(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, scale, zero = inputs[0], inputs[1], _opt(inputs, 2)
    assert x is not None and scale is not None
    if zero is not None:
        dtype = zero.dtype
    elif _attr(node, "output_dtype", 0):
        dtype = _onnx_dtype(_attr(node, "output_dtype"))
    else:
        dtype = np.dtype(np.uint8)
    scaled = x.astype(np.float32) / _quant_param(scale, x, node).astype(np.float32)
    if not dtype.name.startswith("float"):
        scaled = np.rint(scaled)  # round x / scale first, then add the zero point
    if zero is not None:
        scaled = scaled + _quant_param(zero, x, node).astype(np.float32)
    return [_saturate(scaled, dtype, bool(_attr(node, "saturate", 1)))]


@_register("DequantizeLinear")
def _dequantize(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, scale, zero = inputs[0], inputs[1], _opt(inputs, 2)
    assert x is not None and scale is not None
    dtype = _onnx_dtype(_attr(node, "output_dtype")) if _attr(node, "output_dtype", 0) \
        else scale.dtype
    values = x.astype(np.float32)
    if zero is not None:
        values = values - _quant_param(zero, x, node).astype(np.float32)
    return [(values * _quant_param(scale, x, node).astype(np.float32)).astype(dtype)]


@_register("DynamicQuantizeLinear")
def _dynamic_quantize(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((high - low) / 255)
    zero = _saturate(np.asarray(-low / scale if scale else 0.0), np.dtype(np.uint8))
    quantized = _saturate(np.rint(x / scale) + zero.astype(np.float32) if scale else
                          np.zeros_like(x), np.dtype(np.uint8))
    return [quantized, np.asarray(scale, np.float32), zero]


def _along(param: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    """A per-tensor (size 1) or per-axis (1-D) scale or zero point, shaped to broadcast."""
    if param.size == 1:
        return param.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return param.reshape(shape)


def _shifted(value: np.ndarray, zero: np.ndarray | None, axis: int) -> np.ndarray:
    """An integer tensor minus its zero point, widened so the subtraction cannot wrap."""
    wide = value.astype(np.int64)
    return wide if zero is None else wide - _along(zero.astype(np.int64), wide.ndim, axis)


@_register("MatMulInteger")
def _matmul_integer(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """a's zero point per tensor or per row, b's per tensor or per column."""
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    left, right = _shifted(a, _opt(inputs, 2), -2), _shifted(b, _opt(inputs, 3), -1)
    return [np.matmul(left, right).astype(np.int32)]


@_register("ConvInteger")
def _conv_integer(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """The weight's zero point per tensor or per output channel; exact in float64."""
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    x_wide = _shifted(x, _opt(inputs, 2), 1).astype(np.float64)
    w_wide = _shifted(w, _opt(inputs, 3), 0).astype(np.float64)
    (out,) = _conv(node, [x_wide, w_wide], opset)
    return [np.rint(out).astype(np.int32)]


@_register("QLinearMatMul", "QLinearConv")
def _qlinear(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Dequantize, compute exactly in float64, requantize with the output's scale and zero.
    MatMul: a per tensor/row, b per tensor/column; Conv: w per tensor/output channel."""
    a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero = inputs[:8]
    assert a is not None and b is not None and y_scale is not None and y_zero is not None
    assert a_scale is not None and b_scale is not None
    matmul = node.op_type == "QLinearMatMul"
    a_axis, b_axis = (-2, -1) if matmul else (1, 0)
    left = _shifted(a, a_zero, a_axis) * _along(a_scale.astype(np.float64), a.ndim, a_axis)
    right = _shifted(b, b_zero, b_axis) * _along(b_scale.astype(np.float64), b.ndim, b_axis)
    if matmul:
        out = np.matmul(left, right)
    else:
        args: Inputs = [left, right]
        bias = _opt(inputs, 8)
        if bias is not None:  # int32, in units of a_scale * w_scale
            args.append(bias * a_scale.astype(np.float64) * b_scale.astype(np.float64).reshape(-1))
        (out,) = _conv(node, args, opset)
    return [_saturate(out / y_scale.astype(np.float64) + y_zero.astype(np.float64), y_zero.dtype)]


# --------------------------------------------------------------------------- windows, losses

@_register("HannWindow", "HammingWindow", "BlackmanWindow")
def _window(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    size_value = inputs[0]
    assert size_value is not None
    size = int(size_value.reshape(-1)[0])
    period = size if _attr(node, "periodic", 1) else size - 1
    angle = 2 * np.pi * np.arange(size) / period
    if node.op_type == "HannWindow":
        window = 0.5 - 0.5 * np.cos(angle)
    elif node.op_type == "HammingWindow":
        window = 25 / 46 - (1 - 25 / 46) * np.cos(angle)
    else:
        window = 0.42 - 0.5 * np.cos(angle) + 0.08 * np.cos(2 * angle)
    return [window.astype(_onnx_dtype(_attr(node, "output_datatype", 1)))]


def _nll(node: Node, log_prob: np.ndarray, target: np.ndarray, weight: np.ndarray | None
         ) -> np.ndarray:
    """Negative log-likelihood over axis 1 with ignore_index and class weights."""
    ignore = _attr(node, "ignore_index", None)
    keep = np.ones(target.shape, bool) if ignore is None else target != ignore
    safe_target = np.where(keep, target, 0).astype(np.int64)
    picked = np.take_along_axis(log_prob, np.expand_dims(safe_target, 1), axis=1).squeeze(1)
    weights = np.ones(target.shape, log_prob.dtype) if weight is None else weight[safe_target]
    weights = np.where(keep, weights, 0).astype(log_prob.dtype)
    loss = -picked * weights
    reduction = _attr(node, "reduction", "mean")
    if reduction == "none":
        return loss.astype(log_prob.dtype)
    if reduction == "sum":
        return np.asarray(loss.sum(), dtype=log_prob.dtype)
    return np.asarray(loss.sum() / weights.sum(), dtype=log_prob.dtype)


@_register("NegativeLogLikelihoodLoss")
def _nll_op(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    log_prob, target = inputs[0], inputs[1]
    assert log_prob is not None and target is not None
    return [_nll(node, log_prob, target, _opt(inputs, 2))]


@_register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    scores, target = inputs[0], inputs[1]
    assert scores is not None and target is not None
    shifted = scores - scores.max(axis=1, keepdims=True)
    log_prob = (shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))).astype(scores.dtype)
    return [_nll(node, log_prob, target, _opt(inputs, 2)), log_prob]


@_register("MaxUnpool")
def _max_unpool(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, indices = inputs[0], inputs[1]
    assert x is not None and indices is not None
    kernel = _ints(_attr(node, "kernel_shape"))
    rank = len(kernel)
    strides = _ints(_attr(node, "strides", [1] * rank))
    pads = _ints(_attr(node, "pads", [0] * 2 * rank))
    # the indices address the pooled input's shape; an explicit output_shape may be larger
    pooled = list(x.shape[:2]) + [(size - 1) * s + k - pads[i] - pads[i + rank] for i, (size, s, k)
                                  in enumerate(zip(x.shape[2:], strides, kernel))]
    shape_value = _opt(inputs, 2)
    shape = pooled if shape_value is None else _ints(shape_value)
    coords = np.unravel_index(indices.reshape(-1), pooled)
    out = np.zeros(shape, dtype=x.dtype)
    out[coords] = x.reshape(-1)
    return [out]


@_register("Col2Im")
def _col2im(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Sum each column block back onto the (padded) image, then drop the pads."""
    cols, image_shape, block_shape = inputs[:3]
    assert cols is not None and image_shape is not None and block_shape is not None
    image, block = _ints(image_shape), _ints(block_shape)
    rank = len(image)
    strides = _ints(_attr(node, "strides", [1] * rank))
    dilations = _ints(_attr(node, "dilations", [1] * rank))
    pads = _ints(_attr(node, "pads", [0] * 2 * rank))
    padded = [size + pads[i] + pads[i + rank] for i, size in enumerate(image)]
    positions = [(p - ((b - 1) * d + 1)) // s + 1
                 for p, b, d, s in zip(padded, block, dilations, strides)]
    n = cols.shape[0]
    channels = cols.shape[1] // math.prod(block)
    blocks = cols.reshape([n, channels] + block + positions)
    out = np.zeros([n, channels] + padded, dtype=cols.dtype)
    for offset in np.ndindex(*block):
        index = tuple(slice(o * d, o * d + (count - 1) * s + 1, s)
                      for o, d, count, s in zip(offset, dilations, positions, strides))
        out[(slice(None), slice(None)) + index] += blocks[(slice(None), slice(None)) + offset]
    crop = tuple(slice(pads[i], pads[i] + size) for i, size in enumerate(image))
    return [np.ascontiguousarray(out[(slice(None), slice(None)) + crop])]


# --------------------------------------------------------------------------- RMSNorm

@_register("RMSNormalization")
def _rms_norm(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    axes = tuple(range(_attr(node, "axis", -1) % x.ndim, x.ndim))
    work = x.astype(_stash_dtype(x, node))
    rms = np.sqrt(np.mean(work * work, axis=axes, keepdims=True) + _attr(node, "epsilon", 1e-5))
    return [((work / rms).astype(x.dtype) * scale).astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- resize

def _source_coords(mode: str, out_len: int, in_len: int, scale: float,
                   roi: tuple[float, float]) -> np.ndarray:
    """x_original for every output index (coordinate_transformation_mode)."""
    x = np.arange(out_len, dtype=np.float64)
    if mode == "half_pixel":
        return (x + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        adjustment = out_len / (in_len * scale)
        return in_len / 2 * (1 - adjustment) + (x + 0.5) / scale - 0.5
    if mode == "pytorch_half_pixel":
        return (x + 0.5) / scale - 0.5 if out_len > 1 else np.zeros_like(x)
    if mode == "align_corners":  # over the fractional output width when a scale is given
        width = in_len * scale
        return x * (in_len - 1) / (width - 1) if out_len > 1 else np.zeros_like(x)
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_crop_and_resize":
        start, end = roi
        if out_len > 1:
            return start * (in_len - 1) + x * (end - start) * (in_len - 1) / (out_len - 1)
        return np.full_like(x, 0.5 * (start + end) * (in_len - 1))
    raise ValueError(f"coordinate_transformation_mode '{mode}' is not supported")


def _cubic_kernel(t: np.ndarray, a: float) -> np.ndarray:
    t = np.abs(t)
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, near, np.where(t < 2, far, 0.0))


NEAREST: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "round_prefer_floor": lambda v: np.ceil(v - 0.5), "round_prefer_ceil": lambda v: np.floor(v + 0.5),
    "floor": np.floor, "ceil": np.ceil,
}


def _resize_matrix(node: Node, coords: np.ndarray, in_len: int, scale: float,
                   mode: str, nearest_mode: str) -> np.ndarray:
    """(out_len, in_len) weights: output = matrix @ input along one axis (separable resize)."""
    matrix = np.zeros((len(coords), in_len))
    rows = np.arange(len(coords))
    if mode == "nearest":
        matrix[rows, np.clip(NEAREST[nearest_mode](coords), 0, in_len - 1).astype(np.int64)] = 1
        return matrix
    # linear (triangle) or cubic (Keys) filter; antialias stretches it by 1/scale when shrinking
    stretch = 1 / scale if _attr(node, "antialias", 0) and scale < 1 else 1.0
    radius = (1 if mode == "linear" else 2) * stretch
    offsets = np.arange(-math.ceil(radius), math.ceil(radius) + 1)
    taps = np.floor(coords)[:, None] + offsets[None, :]
    distance = (taps - coords[:, None]) / stretch
    if mode == "linear":
        weights = np.maximum(0.0, 1 - np.abs(distance))
    else:
        weights = _cubic_kernel(distance, _attr(node, "cubic_coeff_a", -0.75))
    inside = (taps >= 0) & (taps <= in_len - 1)
    if _attr(node, "exclude_outside", 0):
        weights = np.where(inside, weights, 0.0)
    weights = weights / weights.sum(axis=1, keepdims=True)
    np.add.at(matrix, (np.repeat(rows, len(offsets)),
                       np.clip(taps, 0, in_len - 1).astype(np.int64).reshape(-1)),
              weights.reshape(-1))
    return matrix


def _resize_plan(node: Node, inputs: Inputs, x: np.ndarray, opset: int
                 ) -> tuple[list[int], list[int], list[float], list[tuple[float, float]]]:
    """The resized axes with their output sizes, scales and rois."""
    legacy = node.op_type == "Upsample" or opset < 11  # inputs (X, scales), no roi or sizes
    scales_value = _opt(inputs, 1 if legacy else 2)
    sizes_value = None if legacy else _opt(inputs, 3)
    roi_value = None if legacy else _opt(inputs, 1)
    axes = [a % x.ndim for a in _ints(_attr(node, "axes", list(range(x.ndim))))]
    roi = [(0.0, 1.0)] * len(axes)
    if roi_value is not None and roi_value.size:
        values = roi_value.astype(np.float64).reshape(-1)
        roi = [(float(values[i]), float(values[i + len(axes)])) for i in range(len(axes))]
    lengths = [x.shape[a] for a in axes]
    if sizes_value is not None and sizes_value.size:
        sizes = _ints(sizes_value)
        policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
        if policy == "stretch":
            return axes, sizes, [s / n for s, n in zip(sizes, lengths)], roi
        pick = min if policy == "not_larger" else max
        common = pick(s / n for s, n in zip(sizes, lengths))
        outs = [int(math.floor(common * n + 0.5)) for n in lengths]
        return axes, outs, [common] * len(axes), roi
    assert scales_value is not None
    scales = [float(s) for s in scales_value.astype(np.float64).reshape(-1)]
    outs = [int(math.floor(n * (end - start) * s + 1e-9))
            for n, s, (start, end) in zip(lengths, scales, roi)]
    return axes, outs, scales, roi


def resize_transform(node: Node, opset: int) -> str:
    """A Resize's coordinate_transformation_mode (Upsample's and opset 10's: asymmetric)."""
    if node.op_type == "Upsample" or opset < 11:
        return "asymmetric"
    return _attr(node, "coordinate_transformation_mode", "half_pixel")


def resize_matrices(node: Node, inputs: Inputs, x: np.ndarray, opset: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per resized axis of x (only its shape is read): (the axis, its interpolation matrix (out,
    in), the source coordinates): a Resize is these applied one axis after another (the device glue
    applies the same matrices)."""
    legacy = node.op_type == "Upsample" or opset < 11
    mode = _attr(node, "mode", "nearest")
    mode = "linear" if mode in ("bilinear", "trilinear") else mode
    transform = resize_transform(node, opset)
    nearest_mode = "floor" if legacy else _attr(node, "nearest_mode", "round_prefer_floor")
    plans = []
    for axis, size, scale, roi in zip(*_resize_plan(node, inputs, x, opset)):
        coords = _source_coords(transform, size, x.shape[axis], scale, roi)
        plans.append((axis, _resize_matrix(node, coords, x.shape[axis], scale, mode, nearest_mode), coords))
    return plans


@_register("Resize", "Upsample")
def _resize(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Separable: one interpolation matrix per resized axis, applied with a tensordot."""
    x = inputs[0]
    assert x is not None
    out = x.astype(np.float64)
    outside: np.ndarray | None = None  # tf_crop_and_resize: where a coordinate left the input
    cropped = resize_transform(node, opset) == "tf_crop_and_resize"
    for axis, matrix, coords in resize_matrices(node, inputs, x, opset):
        out = np.moveaxis(np.tensordot(matrix, out, axes=([1], [axis])), 0, axis)
        if cropped:
            beyond = (coords < 0) | (coords > x.shape[axis] - 1)
            shape = [1] * x.ndim
            shape[axis] = len(coords)
            beyond = beyond.reshape(shape)
            outside = beyond if outside is None else outside | beyond
    if outside is not None:
        out = np.where(outside, _attr(node, "extrapolation_value", 0.0), out)
    if x.dtype.kind in "iu":
        out = np.rint(out)
    return [np.ascontiguousarray(out).astype(x.dtype)]


# --------------------------------------------------------------------------- attention, RoPE

def _heads_first(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, heads*D) -> (B, heads, S, D); 4-D inputs are already heads-first."""
    if x.ndim == 4:
        return x
    return x.reshape(x.shape[0], x.shape[1], heads, -1).transpose(0, 2, 1, 3)


def _attention_allowed(node: Node, batch: int, queries: int, total: int, past: int,
                       kv_lengths: np.ndarray | None) -> np.ndarray:
    """(B, 1, S, T) booleans: causal frontier, sliding window and padding, offset-aware."""
    if past:
        offset = np.full(batch, past)
    elif kv_lengths is not None:
        offset = kv_lengths.astype(np.int64).reshape(-1) - queries
    else:
        offset = np.zeros(batch, np.int64)
    position = offset[:, None, None, None] + np.arange(queries)[None, None, :, None]
    key = np.arange(total)[None, None, None, :]
    allowed = np.ones((batch, 1, queries, total), bool)
    if _attr(node, "is_causal", 0):
        allowed &= key <= position
    left, right = _attr(node, "left_window_size", -1), _attr(node, "right_window_size", -1)
    if left >= 0:
        allowed &= key >= position - left
    if right >= 0:
        allowed &= key <= position + right
    if kv_lengths is not None:
        allowed &= key < kv_lengths.astype(np.int64).reshape(-1, 1, 1, 1)
    return allowed


@_register("Attention")
def _attention(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """softmax(scale * Q K^T [softcap] + bias) V with GQA, KV cache and fully-masked rows -> 0."""
    q, k, v = inputs[:3]
    assert q is not None and k is not None and v is not None
    mask, past_key, past_value, kv_lengths = (_opt(inputs, i) for i in range(3, 7))
    dtype = q.dtype  # elementwise steps round like the graph would; the two matmuls widen
    query = _heads_first(q, _attr(node, "q_num_heads", 0)).astype(dtype)
    key = _heads_first(k, _attr(node, "kv_num_heads", 0)).astype(dtype)
    value = _heads_first(v, _attr(node, "kv_num_heads", 0)).astype(dtype)
    past = 0
    if past_key is not None and past_value is not None:
        past = past_key.shape[2]
        key = np.concatenate([past_key.astype(dtype), key], axis=2)
        value = np.concatenate([past_value.astype(dtype), value], axis=2)
    present_key, present_value = key.astype(k.dtype), value.astype(v.dtype)
    groups = query.shape[1] // key.shape[1]  # grouped-query: each KV head serves `groups` heads
    key, value = np.repeat(key, groups, axis=1), np.repeat(value, groups, axis=1)
    scale = _attr(node, "scale", None)
    root = math.sqrt(scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    raw = _contract(query * dtype.type(root), np.swapaxes(key * dtype.type(root), -1, -2))
    softcap = _attr(node, "softcap", 0.0)
    capped = softcap * np.tanh(raw / softcap) if softcap > 0 else raw
    batch, _, queries, total = raw.shape
    allowed = _attention_allowed(node, batch, queries, total, past, kv_lengths)
    bias = np.zeros((1,), dtype)
    if mask is not None:
        width = total - mask.shape[-1]  # a short mask is padded as 'not attended'
        if width > 0:
            padding = [(0, 0)] * (mask.ndim - 1) + [(0, width)]
            mask = np.pad(mask, padding, constant_values=False if mask.dtype == np.bool_ else -np.inf)
        if mask.dtype == np.bool_:
            allowed = allowed & mask
        else:
            bias = mask.astype(dtype)
    biased = np.where(allowed, capped + bias, -np.inf).astype(dtype)
    precision = _attr(node, "softmax_precision", None)
    logits = biased.astype(_onnx_dtype(precision)) if precision else biased
    peak = logits.max(axis=-1, keepdims=True)
    empty = ~np.isfinite(peak)  # a row with no attended key gives zeros, not NaN
    weights = np.exp(logits - np.where(empty, 0, peak))
    total_weight = weights.sum(axis=-1, keepdims=True)
    probs = np.where(empty, 0, weights / np.where(empty, 1, total_weight)).astype(dtype)
    out = _contract(probs, value)
    if q.ndim == 3:
        out = out.transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], -1)
    mode = _attr(node, "qk_matmul_output_mode", 0)
    qk_output = (raw, capped, biased, probs)[mode]
    return [out.astype(q.dtype), present_key, present_value, qk_output.astype(q.dtype)]


@_register("RotaryEmbedding")
def _rotary(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Rotate (pairs of) the first rotary_embedding_dim features by position-dependent angles."""
    x, cos, sin, positions = inputs[0], inputs[1], inputs[2], _opt(inputs, 3)
    assert x is not None and cos is not None and sin is not None
    heads = _heads_first(x, _attr(node, "num_heads", 0))
    if positions is not None:
        cos, sin = cos[positions], sin[positions]
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, S, R/2): the same angles for every head
    width = _attr(node, "rotary_embedding_dim", 0) or heads.shape[-1]
    rotated, kept = heads[..., :width], heads[..., width:]
    if _attr(node, "interleaved", 0):
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    else:
        first, second = np.split(rotated, 2, axis=-1)
    real, imag = cos * first - sin * second, sin * first + cos * second
    if _attr(node, "interleaved", 0):
        rotated = np.stack([real, imag], axis=-1).reshape(rotated.shape)
    else:
        rotated = np.concatenate([real, imag], axis=-1)
    out = np.concatenate([rotated, kept], axis=-1)
    if x.ndim == 3:
        out = out.transpose(0, 2, 1, 3).reshape(x.shape)
    return [out.astype(x.dtype, copy=False)]


# --------------------------------------------------------------------------- recurrent

RNN_ACTIVATIONS: dict[str, Callable[[np.ndarray, float, float], np.ndarray]] = {
    "Tanh": lambda x, a, b: np.tanh(x), "Sigmoid": lambda x, a, b: _sigmoid(x),
    "Relu": lambda x, a, b: np.maximum(x, 0), "Affine": lambda x, a, b: a * x + b,
    "LeakyRelu": lambda x, a, b: np.where(x >= 0, x, a * x),
    "ThresholdedRelu": lambda x, a, b: np.where(x > a, x, 0),
    "ScaledTanh": lambda x, a, b: a * np.tanh(b * x),
    "HardSigmoid": lambda x, a, b: np.clip(a * x + b, 0, 1),
    "Elu": lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))),
    "Softsign": lambda x, a, b: x / (1 + np.abs(x)), "Softplus": lambda x, a, b: np.logaddexp(0, x),
}
_ACTIVATION_DEFAULT_ALPHA = {"LeakyRelu": 0.01, "HardSigmoid": 0.2, "Elu": 1.0,
                             "ThresholdedRelu": 1.0, "ScaledTanh": 1.0, "Affine": 1.0}


def _bound_activation(fn: Callable[[np.ndarray, float, float], np.ndarray], alpha: float,
                      beta: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: fn(x, alpha, beta)


def _rnn_activations(node: Node, directions: int) -> list[list[Callable[[np.ndarray], np.ndarray]]]:
    """Per direction, the activation functions with their alpha/beta bound."""
    _, default, _ = RNN_KINDS[node.op_type]
    names = list(_attr(node, "activations", list(default) * directions))
    alphas, betas = list(_attr(node, "activation_alpha", [])), list(_attr(node, "activation_beta", []))
    bound: list[Callable[[np.ndarray], np.ndarray]] = []
    for i, name in enumerate(names):
        alpha = alphas[i] if i < len(alphas) else _ACTIVATION_DEFAULT_ALPHA.get(name, 0.0)
        beta = betas[i] if i < len(betas) else (0.5 if name == "HardSigmoid" else 0.0)
        bound.append(_bound_activation(RNN_ACTIVATIONS[name], alpha, beta))
    per = len(default)
    return [bound[d * per:(d + 1) * per] for d in range(directions)]


Cell = Callable[[Node, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                  "np.ndarray | None", list[Callable[[np.ndarray], np.ndarray]]],
                 tuple[np.ndarray, np.ndarray]]


def _clipped(node: Node, value: np.ndarray) -> np.ndarray:
    clip = _attr(node, "clip", None)
    return np.clip(value, -clip, clip) if clip is not None else value


def _rnn_cell(node: Node, gates_x: np.ndarray, hidden: np.ndarray, cell: np.ndarray,
              r: np.ndarray, rb: np.ndarray, peep: np.ndarray | None,
              act: list[Callable[[np.ndarray], np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return act[0](_clipped(node, gates_x + hidden @ r.T + rb)), cell


def _gru_cell(node: Node, gates_x: np.ndarray, hidden: np.ndarray, cell: np.ndarray,
              r: np.ndarray, rb: np.ndarray, peep: np.ndarray | None,
              act: list[Callable[[np.ndarray], np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Gates update (z), reset (r), candidate (h) in that order."""
    size = hidden.shape[-1]
    z_r = _clipped(node, gates_x[:, :2 * size] + hidden @ r[:2 * size].T + rb[:2 * size])
    update, reset = act[0](z_r[:, :size]), act[0](z_r[:, size:])
    r_h, rb_h = r[2 * size:], rb[2 * size:]
    if _attr(node, "linear_before_reset", 0):
        candidate = gates_x[:, 2 * size:] + reset * (hidden @ r_h.T + rb_h)
    else:
        candidate = gates_x[:, 2 * size:] + (reset * hidden) @ r_h.T + rb_h
    new = act[1](_clipped(node, candidate))
    return (1 - update) * new + update * hidden, cell


def _lstm_cell(node: Node, gates_x: np.ndarray, hidden: np.ndarray, cell: np.ndarray,
               r: np.ndarray, rb: np.ndarray, peep: np.ndarray | None,
               act: list[Callable[[np.ndarray], np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Gates input, output, forget, cell in that order; peepholes input, output, forget."""
    size = hidden.shape[-1]
    gates = gates_x + hidden @ r.T + rb
    i_pre, o_pre, f_pre, c_pre = (gates[:, k * size:(k + 1) * size] for k in range(4))
    if peep is not None:
        i_pre = i_pre + peep[:size] * cell
        f_pre = f_pre + peep[2 * size:] * cell
    i_gate, f_gate = act[0](_clipped(node, i_pre)), act[0](_clipped(node, f_pre))
    if _attr(node, "input_forget", 0):
        f_gate = 1 - i_gate
    new_cell = f_gate * cell + i_gate * act[1](_clipped(node, c_pre))
    if peep is not None:
        o_pre = o_pre + peep[size:2 * size] * new_cell
    return act[0](_clipped(node, o_pre)) * act[2](new_cell), new_cell


# per op: gates per hidden unit (rows of W), default activations of one direction, the cell
RNN_KINDS: dict[str, tuple[int, tuple[str, ...], Cell]] = {
    "RNN": (1, ("Tanh",), _rnn_cell),
    "GRU": (3, ("Sigmoid", "Tanh"), _gru_cell),
    "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"), _lstm_cell),
}


@_register("RNN", "GRU", "LSTM")
def _recurrent(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """The whole sequence, step by step, per direction; padded steps keep the state and emit 0."""
    x, w, r = inputs[0], inputs[1], inputs[2]
    assert x is not None and w is not None and r is not None
    bias, lengths, init_h, init_c, peep = (_opt(inputs, i) for i in range(3, 8))
    batchwise = _attr(node, "layout", 0) == 1
    seq = np.swapaxes(x, 0, 1) if batchwise else x  # (S, B, I)
    steps, batch = seq.shape[:2]
    directions, size = w.shape[0], r.shape[-1]
    gates, _, cell_step = RNN_KINDS[node.op_type]
    lengths_array = np.full(batch, steps) if lengths is None else lengths.astype(np.int64)
    activations = _rnn_activations(node, directions)
    reverse_only = _attr(node, "direction", "forward") == "reverse"
    ys, last_h, last_c = [], [], []
    for d in range(directions):
        wb = np.zeros(gates * size, x.dtype) if bias is None else bias[d, :gates * size]
        rb = np.zeros(gates * size, x.dtype) if bias is None else bias[d, gates * size:]
        h = np.zeros((batch, size), x.dtype) if init_h is None else (
            np.swapaxes(init_h, 0, 1) if batchwise else init_h)[d]
        c = np.zeros((batch, size), x.dtype) if init_c is None else (
            np.swapaxes(init_c, 0, 1) if batchwise else init_c)[d]
        out = np.zeros((steps, batch, size), x.dtype)
        backward = reverse_only or d == 1
        for t in range(steps):
            live = (t < lengths_array)[:, None]
            # a backward pass walks each sequence from its own last valid step
            index = np.where(lengths_array > t, lengths_array - 1 - t, 0) if backward \
                else np.full(batch, t)
            step_x = seq[index, np.arange(batch)] @ w[d].T + wb
            new_h, new_c = cell_step(node, step_x, h, c, r[d], rb,
                                     None if peep is None else peep[d], activations[d])
            h, c = np.where(live, new_h, h), np.where(live, new_c, c)
            out[index, np.arange(batch)] = np.where(live, h, out[index, np.arange(batch)])
        ys.append(out)
        last_h.append(h)
        last_c.append(c)
    y = np.stack(ys, axis=1)  # (S, D, B, H)
    y_h, y_c = np.stack(last_h), np.stack(last_c)
    if batchwise:
        y, y_h, y_c = y.transpose(2, 0, 1, 3), np.swapaxes(y_h, 0, 1), np.swapaxes(y_c, 0, 1)
    return [y.astype(x.dtype), y_h.astype(x.dtype), y_c.astype(x.dtype)]


# --------------------------------------------------------------------------- spectral

def _as_complex(x: np.ndarray) -> np.ndarray:
    """ONNX's [..., 1] real or [..., 2] (real, imag) layout as a numpy complex array."""
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def _from_complex(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    return np.stack([values.real, values.imag], axis=-1).astype(dtype)


@_register("DFT")
def _dft(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x = inputs[0]
    assert x is not None
    length_value, axis_value = _opt(inputs, 1), _opt(inputs, 2)
    axis = int(axis_value.reshape(-1)[0]) if axis_value is not None else _attr(node, "axis", 1)
    axis = axis % x.ndim  # counted on the input, whose last dim holds (real, imag)
    length = None if length_value is None else int(length_value.reshape(-1)[0])
    signal = _as_complex(x.astype(_compute_dtype(x)))  # numpy's FFT keeps single precision
    inverse, onesided = _attr(node, "inverse", 0), _attr(node, "onesided", 0)
    if inverse and onesided:
        real = np.fft.irfft(signal, n=length, axis=axis)
        return [real[..., None].astype(x.dtype)]
    if onesided:
        return [_from_complex(np.fft.rfft(signal.real, n=length, axis=axis), x.dtype)]
    transform = np.fft.ifft if inverse else np.fft.fft
    return [_from_complex(transform(signal, n=length, axis=axis), x.dtype)]


@_register("STFT")
def _stft(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    signal, step_value = inputs[0], inputs[1]
    assert signal is not None and step_value is not None
    window, length_value = _opt(inputs, 2), _opt(inputs, 3)
    samples = _as_complex(signal.astype(_compute_dtype(signal)))  # (B, L)
    if length_value is not None:
        frame = int(length_value.reshape(-1)[0])
    else:
        frame = samples.shape[1] if window is None else window.shape[0]
    step = int(step_value.reshape(-1)[0])
    count = (samples.shape[1] - frame) // step + 1
    starts = np.arange(count) * step
    frames = samples[:, starts[:, None] + np.arange(frame)[None, :]]  # (B, frames, frame)
    if window is not None:
        frames = frames * window.astype(samples.real.dtype)
    onesided = _attr(node, "onesided", 1) and signal.shape[-1] == 1
    spectrum = np.fft.rfft(frames.real, axis=-1) if onesided else np.fft.fft(frames, axis=-1)
    return [_from_complex(spectrum, signal.dtype)]


# --------------------------------------------------------------------------- sampling grids

def _normalized_positions(size: int, align_corners: bool) -> np.ndarray:
    """Pixel positions in [-1, 1]: pixel centres at the ends (align_corners) or pixel edges."""
    if align_corners:
        return np.linspace(-1, 1, size) if size > 1 else np.zeros(1)
    return (np.arange(size) * 2 + 1) / size - 1


@_register("AffineGrid")
def _affine_grid(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    theta, size_value = inputs[0], inputs[1]
    assert theta is not None and size_value is not None
    spatial = _ints(size_value)[2:]  # (H, W) or (D, H, W)
    align = bool(_attr(node, "align_corners", 0))
    axes = [_normalized_positions(n, align) for n in spatial]
    # homogeneous positions ordered (x, y[, z], 1): x runs along the last spatial dim
    mesh = np.meshgrid(*axes, indexing="ij")
    points = np.stack(list(mesh[::-1]) + [np.ones_like(mesh[0])], axis=-1)
    grid = np.einsum("...k,nik->n...i", points, theta.astype(np.float64))
    return [grid.astype(theta.dtype)]


def _reflect(coord: np.ndarray, low: float, high: float) -> np.ndarray:
    """Fold coordinates back into [low, high] by repeated reflection at the borders."""
    span = high - low
    if span <= 0:
        return np.zeros_like(coord)
    folded = np.abs(coord - low) % (2 * span)
    return low + np.where(folded > span, 2 * span - folded, folded)


def _grid_taps(node: Node, coord: np.ndarray, size: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """For one spatial dim: (index, weight) pairs whose weighted sum interpolates at coord."""
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(_attr(node, "mode", "linear"),
                                                          _attr(node, "mode", "linear"))
    padding = _attr(node, "padding_mode", "zeros")
    align = _attr(node, "align_corners", 0)
    low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)

    def bounded(position: np.ndarray) -> np.ndarray:
        if padding == "border":
            return np.clip(position, 0, size - 1)
        if padding == "reflection":
            return np.clip(_reflect(position, low, high), 0, size - 1)
        return position

    if mode == "nearest":
        return [(np.rint(bounded(coord)), np.ones_like(coord))]
    if mode == "linear":
        coord = bounded(coord)
        base = np.floor(coord)
        return [(base, 1 - (coord - base)), (base + 1, coord - base)]
    base = np.floor(coord)  # cubic: each of the four taps is bounded on its own
    return [(bounded(base + k), _cubic_kernel(coord - (base + k), -0.75)) for k in (-1, 0, 1, 2)]


@_register("GridSample")
def _grid_sample(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Sum over every combination of per-dim taps; taps outside the input read zero."""
    x, grid = inputs[0], inputs[1]
    assert x is not None and grid is not None
    spatial = x.shape[2:]
    align = _attr(node, "align_corners", 0)
    per_dim = []
    for dim, size in enumerate(spatial):
        normalized = grid[..., len(spatial) - 1 - dim].astype(np.float64)  # grid is (x, y, ...)
        coord = (normalized + 1) / 2 * (size - 1) if align else ((normalized + 1) * size - 1) / 2
        per_dim.append(_grid_taps(node, coord, size))
    n, c = x.shape[:2]
    out = np.zeros((n, c) + grid.shape[1:-1])
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    channels_last = np.moveaxis(x.astype(np.float64), 1, -1)  # (N, *spatial, C)
    for combo in itertools.product(*per_dim):
        weight = np.prod([w for _, w in combo], axis=0)
        valid = np.all([(i >= 0) & (i <= size - 1) for (i, _), size in zip(combo, spatial)], axis=0)
        index = tuple(np.clip(i, 0, size - 1).astype(np.int64) for (i, _), size in zip(combo, spatial))
        picked = np.moveaxis(channels_last[(batch,) + index], -1, 1)  # (N, C, *out)
        out += picked * np.where(valid, weight, 0)[:, None]
    return [out.astype(x.dtype)]


# --------------------------------------------------------------------------- detection, sequence mixers

def _corners(boxes: np.ndarray, center_point: bool) -> np.ndarray:
    """(..., 4) boxes as (y_min, x_min, y_max, x_max)."""
    if center_point:
        x, y, w, h = (boxes[..., i] for i in range(4))
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=-1)
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2),
                     np.maximum(x1, x2)], axis=-1)


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    low = np.maximum(box[:2], others[:, :2])
    high = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(high - low, 0, None), axis=1)
    area = np.prod(box[2:] - box[:2])
    areas = np.prod(others[:, 2:] - others[:, :2], axis=1)
    union = area + areas - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0)


@_register("NonMaxSuppression")
def _nms(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Greedy per batch and class: best score first, drop boxes with IoU > threshold."""
    boxes, scores = inputs[0], inputs[1]
    assert boxes is not None and scores is not None
    limit_value, iou_value, score_value = (_opt(inputs, i) for i in (2, 3, 4))
    limit = 0 if limit_value is None or limit_value.size == 0 else int(limit_value.reshape(-1)[0])
    iou_limit = 0.0 if iou_value is None or iou_value.size == 0 else float(iou_value.reshape(-1)[0])
    floor = None if score_value is None or score_value.size == 0 else float(score_value.reshape(-1)[0])
    corners = _corners(boxes.astype(np.float64), bool(_attr(node, "center_point_box", 0)))
    selected: list[tuple[int, int, int]] = []
    for batch, klass in itertools.product(range(scores.shape[0]), range(scores.shape[1])):
        class_scores = scores[batch, klass]
        order = [int(i) for i in np.argsort(-class_scores, kind="stable")
                 if floor is None or class_scores[i] > floor]
        kept: list[int] = []
        for candidate in order:
            if len(kept) >= limit:
                break
            if not kept or np.all(_iou(corners[batch, candidate], corners[batch, kept]) <= iou_limit):
                kept.append(candidate)
        selected += [(batch, klass, box) for box in kept]
    return [np.array(selected, dtype=np.int64).reshape(-1, 3)]


@_register("CausalConvWithState")
def _causal_conv(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """Depthwise causal 1-D conv over [carried state | input]; returns output and new state."""
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    bias, past = _opt(inputs, 2), _opt(inputs, 3)
    taps = w.shape[-1]
    carry = np.zeros(x.shape[:2] + (taps - 1,), x.dtype) if past is None else past
    padded = np.concatenate([carry, x], axis=-1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, taps, axis=-1)  # (B, C, L, k)
    out = np.einsum("bclk,ck->bcl", windows, w[:, 0])
    if bias is not None:
        out = out + bias[:, None]
    if _attr(node, "activation", "none") in ("silu", "swish"):
        out = out * _sigmoid(out)
    return [out.astype(x.dtype), np.ascontiguousarray(padded[..., padded.shape[-1] - (taps - 1):])]


@_register("LinearAttention")
def _linear_attention(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """The recurrence token by token: state (B, H_kv, d_k, d_v), read by every query head."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    assert q is not None and k is not None and v is not None
    past, decay, beta = _opt(inputs, 3), _opt(inputs, 4), _opt(inputs, 5)
    q_heads, kv_heads = _attr(node, "q_num_heads"), _attr(node, "kv_num_heads")
    batch, steps = q.shape[:2]
    work = _compute_dtype(q, k, v)
    queries = q.reshape(batch, steps, q_heads, -1).astype(work)
    keys = k.reshape(batch, steps, kv_heads, -1).astype(work)
    values = v.reshape(batch, steps, kv_heads, -1).astype(work)
    d_k, d_v = keys.shape[-1], values.shape[-1]
    scale = _attr(node, "scale", 0.0) or 1 / math.sqrt(d_k)
    state = (np.zeros((batch, kv_heads, d_k, d_v), work) if past is None else past.astype(work))
    rule = _attr(node, "update_rule", "gated_delta")
    outputs = []
    for t in range(steps):
        if rule in ("gated", "gated_delta"):
            assert decay is not None
            gate = np.exp(decay[:, t].astype(work)).reshape(batch, kv_heads, -1, 1)
            state = gate * state
        outer_value = values[:, t]
        if rule in ("delta", "gated_delta"):
            assert beta is not None
            rate = np.broadcast_to(beta[:, t].astype(work), (batch, kv_heads))[..., None]
            recalled = np.einsum("bhkv,bhk->bhv", state, keys[:, t])
            outer_value = rate * (outer_value - recalled)
        state = state + np.einsum("bhk,bhv->bhkv", keys[:, t], outer_value)
        shared = np.repeat(state, q_heads // kv_heads, axis=1)
        outputs.append(scale * np.einsum("bhk,bhkv->bhv", queries[:, t], shared))
    out = np.stack(outputs, axis=1).reshape(batch, steps, -1)
    return [out.astype(q.dtype), state.astype(q.dtype)]


# --------------------------------------------------------------------------- RoI align, deformable conv

def _roi_samples(start: float, length: float, bins: int, grid: int, size: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sample points of one RoI axis (bins x grid) as (low index, high index, low weight,
    high weight), with the RoiAlign edge rules: beyond one pixel outside -> weight 0."""
    step = length / bins
    points = start + np.arange(bins)[:, None] * step + (np.arange(grid)[None, :] + 0.5) * step / grid
    points = points.reshape(-1)
    outside = (points < -1) | (points > size)
    points = np.clip(points, 0, None)
    low = np.minimum(np.floor(points), size - 1).astype(np.int64)
    points = np.where(low >= size - 1, low, points)
    high = np.minimum(low + 1, size - 1)
    frac = points - low
    return low, high, np.where(outside, 0, 1 - frac), np.where(outside, 0, frac)


@_register("RoiAlign")
def _roi_align(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    x, rois, batch_indices = inputs[:3]
    assert x is not None and rois is not None and batch_indices is not None
    out_h, out_w = _attr(node, "output_height", 1), _attr(node, "output_width", 1)
    ratio = _attr(node, "sampling_ratio", 0)
    half_pixel = _attr(node, "coordinate_transformation_mode", "half_pixel") == "half_pixel"
    height, width = x.shape[2:]
    results = []
    for roi, batch in zip(rois.astype(np.float64) * _attr(node, "spatial_scale", 1.0),
                          _ints(batch_indices)):
        x1, y1, x2, y2 = roi - (0.5 if half_pixel else 0.0)
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:  # the legacy mode never lets a RoI shrink below one pixel
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        grid_h = ratio or math.ceil(roi_h / out_h)
        grid_w = ratio or math.ceil(roi_w / out_w)
        y_lo, y_hi, wy_lo, wy_hi = _roi_samples(y1, roi_h, out_h, grid_h, height)
        x_lo, x_hi, wx_lo, wx_hi = _roi_samples(x1, roi_w, out_w, grid_w, width)
        image = x[batch].astype(np.float64)
        corners = [image[:, ys][:, :, xs] * (wy[:, None] * wx[None, :])
                   for ys, wy in ((y_lo, wy_lo), (y_hi, wy_hi))
                   for xs, wx in ((x_lo, wx_lo), (x_hi, wx_hi))]
        if _attr(node, "mode", "avg") == "max":  # max over the weighted corner values
            samples = np.max(corners, axis=0)
        else:
            samples = np.sum(corners, axis=0)
        samples = samples.reshape(x.shape[1], out_h, grid_h, out_w, grid_w)
        pooled = samples.max(axis=(2, 4)) if _attr(node, "mode", "avg") == "max" \
            else samples.mean(axis=(2, 4))
        results.append(pooled)
    return [np.array(results, dtype=x.dtype).reshape(len(results), x.shape[1], out_h, out_w)]


def _bilinear_2d(image: np.ndarray, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """image (C, H, W) sampled at float positions ys, xs (same shape); outside reads zero."""
    height, width = image.shape[1:]
    y0, x0 = np.floor(ys), np.floor(xs)
    total = np.zeros(image.shape[:1] + ys.shape)
    for dy, dx in itertools.product((0, 1), (0, 1)):
        yy, xx = y0 + dy, x0 + dx
        weight = (1 - np.abs(ys - yy)) * (1 - np.abs(xs - xx))
        valid = (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
        picked = image[:, np.clip(yy, 0, height - 1).astype(np.int64),
                       np.clip(xx, 0, width - 1).astype(np.int64)]
        total += picked * np.where(valid, weight, 0)
    return total


@_register("DeformConv")
def _deform_conv(node: Node, inputs: Inputs, opset: int) -> list[np.ndarray]:
    """2-D: each kernel tap samples the input at its offset position (bilinear), times the
    mask; the sampled columns then meet the weights in one GEMM per group."""
    x, w, offset = inputs[0], inputs[1], inputs[2]
    assert x is not None and w is not None and offset is not None
    bias, mask = _opt(inputs, 3), _opt(inputs, 4)
    if x.ndim != 4:
        raise UnsupportedOpError("DeformConv", node.name, "only 2-D deformable conv is supported")
    n, c, _, _ = x.shape
    oc, _, kh, kw = w.shape
    strides = _ints(_attr(node, "strides", [1, 1]))
    dilations = _ints(_attr(node, "dilations", [1, 1]))
    pads = _ints(_attr(node, "pads", [0, 0, 0, 0]))
    groups, offset_groups = _attr(node, "group", 1), _attr(node, "offset_group", 1)
    out_h, out_w = offset.shape[2:]
    taps = kh * kw
    offsets = offset.astype(np.float64).reshape(n, offset_groups, taps, 2, out_h, out_w)
    masks = (np.ones((n, offset_groups, taps, out_h, out_w)) if mask is None
             else mask.astype(np.float64).reshape(n, offset_groups, taps, out_h, out_w))
    base_y = (np.arange(out_h) * strides[0] - pads[0])[:, None]
    base_x = (np.arange(out_w) * strides[1] - pads[1])[None, :]
    cols = np.zeros((n, c, taps, out_h, out_w))
    per_group = c // offset_groups
    for batch, group, tap in itertools.product(range(n), range(offset_groups), range(taps)):
        ty, tx = divmod(tap, kw)
        ys = base_y + ty * dilations[0] + offsets[batch, group, tap, 0]
        xs = base_x + tx * dilations[1] + offsets[batch, group, tap, 1]
        channels = slice(group * per_group, (group + 1) * per_group)
        sampled = _bilinear_2d(x[batch, channels].astype(np.float64), ys, xs)
        cols[batch, channels, tap] = sampled * masks[batch, group, tap]
    cols = cols.reshape(n, groups, (c // groups) * taps, out_h * out_w)
    weights = w.astype(np.float64).reshape(groups, oc // groups, -1)
    out = np.matmul(weights, cols).reshape(n, oc, out_h, out_w)
    if bias is not None:
        out = out + bias.astype(np.float64).reshape(1, oc, 1, 1)
    return [out.astype(x.dtype)]


# --------------------------------------------------------------------------- running

SUPPORTED_OPS: frozenset[str] = frozenset(OPS)


def run_nodes(nodes: Sequence[Node], env: dict[str, np.ndarray], opset: int) -> None:
    """Run nodes in order, reading inputs from env and writing their outputs into it."""
    for node in nodes:
        impl = OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if is_channels_last(node):
            impl = _channels_last
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


def check_feeds(graph: Graph, feeds: Mapping[str, Any], spec_of: Callable[[Any], TensorSpec] | None = None) -> None:
    """Every graph input present with its bound shape and dtype: else a ModelError naming it.
    spec_of: a feed's spec, for feeds that are not arrays (device buffers)."""
    for name in graph.inputs:
        if name not in feeds:
            raise ModelError(f"missing input '{name}' (expects {graph.values[name]})")
        spec = graph.values[name]
        got = (spec_of or array_spec)(feeds[name])
        if got != spec:
            shown = f"{'x'.join(map(str, got.shape)) or 'scalar'}:{got.dtype}"
            raise ModelError(f"input '{name}' is {shown}, the model is bound to {spec}")
    unknown = sorted(set(feeds) - set(graph.inputs))
    if unknown:
        raise ModelError(f"unknown input(s) {', '.join(unknown)}; inputs: {', '.join(graph.inputs)}")


def array_spec(value: Any) -> TensorSpec:
    """An array-like's shape and dtype."""
    array = np.asarray(value)
    return TensorSpec(tuple(array.shape), array.dtype.name)


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


# --------------------------------------------------------------------------- ONNX conformance

@dataclass(frozen=True)
class CaseResult:
    """One onnx.backend.test node case run through this executor."""

    op: str  # the op the case tests (expanded function cases count for their op)
    case: str
    status: str  # pass | fail | error
    detail: str = ""


def conformance_results(ops: Iterable[str] | None = None) -> list[CaseResult]:
    """Run onnx.backend.test's node cases of `ops` (default: every supported op), including
    their function-expanded variants."""
    from onnx.backend.test.case.node import collect_testcases

    wanted = SUPPORTED_OPS if ops is None else set(ops)
    with warnings.catch_warnings():  # the generators' own overflow/divide notes
        warnings.simplefilter("ignore")
        cases = collect_testcases()  # generated once per process by the onnx package
    tested_op = {case.name: _tested_op(case.model) for case in cases if "_expanded" not in case.name}
    results = []
    for case in cases:
        op = tested_op.get(case.name.split("_expanded")[0], "")
        if op in wanted:
            results.append(_run_case(op, case))
    return results


def _tested_op(model: Any) -> str:
    ops = [n.op_type for n in model.graph.node if n.op_type != "Constant"]
    return ops[0] if ops else "Constant"


def _case_array(value: Any) -> np.ndarray:
    from onnx import TensorProto, numpy_helper

    if isinstance(value, TensorProto):
        return numpy_helper.to_array(value)
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    raise TypeError(f"a {type(value).__name__} input or output (only tensors are supported)")


def _run_case(op: str, case: Any) -> CaseResult:
    from .onnx_import import node_from_proto

    graph = case.model.graph
    opset = next(o.version for o in case.model.opset_import if o.domain in ("", "ai.onnx"))
    inputs, expected = case.data_sets[0]
    try:
        nodes = [node_from_proto(n, n.name or f"{n.op_type}_{i}") for i, n in enumerate(graph.node)]
        env = {vi.name: _case_array(v) for vi, v in zip(graph.input, inputs)}
        with np.errstate(all="ignore"):
            run_nodes(nodes, env, opset)
        for vi, want in zip(graph.output, expected):
            problem = _mismatch(env[vi.name], _case_array(want), case.rtol, case.atol)
            if problem:
                return CaseResult(op, case.name, "fail", f"{vi.name}: {problem}")
    except Exception as exc:  # a case that crashes is a result to report, not a crash
        first_line = (str(exc).splitlines() or [""])[0][:160]
        return CaseResult(op, case.name, "error", f"{type(exc).__name__}: {first_line}")
    return CaseResult(op, case.name, "pass")


def _mismatch(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    """Why `got` is not `want` (dtype, shape, values within the case's tolerances), or ''."""
    got = np.asarray(got)
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind in "fc" or want.dtype.name.startswith(("float", "bfloat")):
        wide_got, wide_want = got.astype(np.float64), want.astype(np.float64)
        close = np.isclose(wide_got, wide_want, rtol=rtol, atol=atol, equal_nan=True)
    else:
        close = got == want
    if not np.all(close):
        return f"{int(np.size(close) - np.count_nonzero(close))} of {np.size(close)} values differ"
    return ""


def conformance_markdown(results: Sequence[CaseResult]) -> str:
    """The per-op pass/fail table of docs/conformance.md, failures listed with their reason."""
    import onnx

    by_op: dict[str, list[CaseResult]] = {}
    for result in results:
        by_op.setdefault(result.op, []).append(result)
    passed = sum(r.status == "pass" for r in results)
    lines = [
        "# ONNX node conformance of the numpy executor",
        "",
        "Generated by `python -m portkern.executor --conformance docs/conformance.md --with-models`.",
        "",
        f"Node cases of onnx {onnx.__version__} (onnx.backend.test.case.node, function-expanded",
        "variants included) for every op in `SUPPORTED_OPS`, run by `run_nodes`; outputs compared",
        "with each case's own rtol/atol, dtypes and shapes exactly. The cases that do not pass are",
        "listed at the end; tests/test_conformance.py keeps that list and a reason for each.",
        "",
        f"**{passed} of {len(results)} cases pass** over {len(by_op)} ops with cases "
        f"({len(SUPPORTED_OPS)} ops supported; supported ops without cases: "
        f"{', '.join(sorted(SUPPORTED_OPS - set(by_op))) or 'none'}).",
        "",
        "| op | pass | fail | total |",
        "|---|---:|---:|---:|",
    ]
    for op in sorted(by_op):
        ok = sum(r.status == "pass" for r in by_op[op])
        lines.append(f"| {op} | {ok} | {len(by_op[op]) - ok} | {len(by_op[op])} |")
    failures = [r for r in results if r.status != "pass"]
    if failures:
        lines += ["", "## Cases that do not pass", "", "| op | case | status | detail |",
                  "|---|---|---|---|"]
        lines += [f"| {r.op} | {r.case} | {r.status} | {r.detail.replace('|', '/')} |"
                  for r in failures]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m portkern.executor --conformance [OUT.md]`: run the node cases, write the report."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m portkern.executor")
    parser.add_argument("--conformance", metavar="OUT.md", nargs="?", const="-", required=True,
                        help="run onnx's node conformance cases; write markdown to OUT.md or stdout")
    parser.add_argument("--with-models", action="store_true",
                        help="also run the nine zoo models and a BERT export against onnxruntime")
    args = parser.parse_args(argv)
    report = conformance_markdown(conformance_results())
    if args.with_models:
        from .models import check_models

        report += "\n" + check_models()
    if args.conformance == "-":
        sys.stdout.write(report)
    else:
        Path(args.conformance).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
