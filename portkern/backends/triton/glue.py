"""Glue on the device: the ONNX nodes between kernel tasks (Reshape, Transpose, Gather, Add, ...)
as torch ops on the tensors kernels read and write, so a model's values stay on the GPU.

One registry, GLUE: op type -> fn(node, inputs, context) -> outputs. The semantics are the numpy
executor's (executor.py, the ground truth), and so is the attribute handling: its helpers read
axes, pads and pool geometry, and the order-keeping shape ops (Reshape, Flatten, Squeeze,
Unsqueeze, Split) run the executor's own op on a zero-byte stand-in of the input to learn the
output shape. Inputs the importer requires to be constants (onnx_import.VALUE_SHAPED_INPUTS:
shapes, axes, starts, sizes) and the few more glue reads as ints (HOST_INPUTS: CumSum's axis)
arrive as host numpy arrays, every other input as a tensor on the device, read there (Pad's fill
value, Trilu's diagonal) so no op waits on a device-to-host copy; outputs are made contiguous, as
the executor's are. Contractions in fp16/bf16 accumulate in fp32 (cuBLAS, cuDNN), which is how
the executor computes them too, and fp32 ones run without TF32 (modules.float32_contractions).
Weights move to the device when the piece is built and no op copies from the host while it runs
(a CUDA graph capture forbids that), except the ops computed on the host, which the importer
folds away in practice.

A node whose op is not here, or whose form is not (LIMITS), runs in the executor on the host,
device -> host -> device (base.ExecutorStretch); the piece lists it and the runtime reports it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F

from ...errors import UnsupportedOpError
from ...executor import (OPS, _attr, _coerced_2d, _conv_geometry, _ints, _onnx_dtype, _opt, _pool_geometry,
                         _reduce_axes, _stash_dtype, conv_transpose_geometry, depth_space_plan, pad_arguments,
                         resize_matrices, slice_arguments)
from ...ir import Node
from ...layout import ONNX_OF, is_channels_last, nchw_node, run_as_nchw
from ...onnx_import import VALUE_SHAPED_INPUTS
from ..base import ExecutorStretch, StretchPiece
from .modules import float32_contractions, torch_dtype

if TYPE_CHECKING:
    from .backend import TritonBackend


@dataclass(frozen=True)
class GlueContext:
    """What an op needs besides its node and inputs."""

    opset: int
    backend: TritonBackend  # its device, and its host <-> device copies for values made on the host


GlueOp = Callable[[Node, list[Any], GlueContext], list[torch.Tensor]]
# inputs glue reads on the host besides the importer's VALUE_SHAPED_INPUTS: an axis torch takes as an int
HOST_INPUTS: dict[str, tuple[int, ...]] = {"CumSum": (1,), "CumProd": (1,)}
GLUE: dict[str, GlueOp] = {}


def _register(*op_types: str) -> Callable[[GlueOp], GlueOp]:
    def wrap(fn: GlueOp) -> GlueOp:
        for op_type in op_types:
            GLUE[op_type] = fn
        return fn
    return wrap


def _stand_in(x: torch.Tensor) -> np.ndarray:
    """A zero-byte numpy array with x's shape and dtype, for the executor's ops and helpers that
    decide shapes, axes and dtypes (numpy knows bfloat16 through ml_dtypes)."""
    name = str(x.dtype).removeprefix("torch.")
    dtype = np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)
    return np.broadcast_to(np.zeros((), dtype), tuple(x.shape))


def _torch_pads(begins: Sequence[int], ends: Sequence[int]) -> list[int]:
    """ONNX begin/end pads per spatial axis -> F.pad's order (last axis first)."""
    return [pad for begin, end in reversed(list(zip(begins, ends))) for pad in (begin, end)]


# --------------------------------------------------------------------------- elementwise

def _widened(x: torch.Tensor) -> torch.Tensor:
    """Integers as float64, where numpy's math (sqrt, log, exp, a float attribute) promotes them."""
    return x if x.is_floating_point() else x.double()


def _softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x) as logaddexp(0, x), the executor's: exact at large x, unlike F.softplus's cutoff."""
    return torch.logaddexp(x, x.new_zeros(()))


UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Abs": torch.abs, "Neg": torch.neg, "Exp": torch.exp, "Log": torch.log, "Sqrt": torch.sqrt,
    "Reciprocal": torch.reciprocal, "Sin": torch.sin, "Cos": torch.cos, "Tanh": torch.tanh,
    "Erf": torch.erf, "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Floor": torch.floor,
    "Ceil": torch.ceil, "Sign": torch.sign, "Round": torch.round, "Not": torch.logical_not,
    "IsNaN": torch.isnan, "Softplus": _softplus, "Softsign": lambda x: x / (1 + torch.abs(x)),
    "HardSwish": lambda x: x * torch.clamp(x / 6 + 0.5, 0, 1), "Mish": lambda x: x * torch.tanh(_softplus(x)),
    "Tan": torch.tan, "Asin": torch.asin, "Acos": torch.acos, "Atan": torch.atan, "Sinh": torch.sinh,
    "Cosh": torch.cosh, "Asinh": torch.asinh, "Acosh": torch.acosh, "Atanh": torch.atanh,
    "BitwiseNot": torch.bitwise_not,
}


@_register(*UNARY)
def _unary(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    return [UNARY[node.op_type](inputs[0])]


def _negative_part_expm1(x: torch.Tensor, alpha: float) -> torch.Tensor:
    """Elu's and Selu's alpha * (e^x - 1) for x <= 0, x above (expm1 of min(x, 0): no overflow)."""
    return torch.where(x > 0, x, alpha * torch.expm1(torch.clamp(x, max=0)))


def _celu(node: Node, x: torch.Tensor) -> torch.Tensor:
    alpha = _attr(node, "alpha", 1.0)
    return torch.clamp(x, min=0) + torch.clamp(alpha * torch.expm1(x / alpha), max=0)


def _shrink(node: Node, x: torch.Tensor) -> torch.Tensor:
    bias, lambd = _attr(node, "bias", 0.0), _attr(node, "lambd", 0.5)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, 0))


def _gelu(node: Node, x: torch.Tensor) -> torch.Tensor:
    """approximate='tanh' is the tanh form; any other value is the erf form, as in the executor."""
    return F.gelu(x, approximate="tanh" if _attr(node, "approximate", "none") == "tanh" else "none")


# unary ops with attributes, fn(node, x), defaults as the executor's
PARAM_UNARY: dict[str, Callable[[Node, torch.Tensor], torch.Tensor]] = {
    "LeakyRelu": lambda node, x: torch.where(x >= 0, x, x * _attr(node, "alpha", 0.01)),
    "Elu": lambda node, x: _negative_part_expm1(x, _attr(node, "alpha", 1.0)),
    "Selu": lambda node, x: _attr(node, "gamma", 1.05070102214813232421875) * _negative_part_expm1(
        x, _attr(node, "alpha", 1.67326319217681884765625)),
    "HardSigmoid": lambda node, x: torch.clamp(_attr(node, "alpha", 0.2) * x + _attr(node, "beta", 0.5), 0, 1),
    "ThresholdedRelu": lambda node, x: torch.where(x > _attr(node, "alpha", 1.0), x, 0),
    "Celu": _celu, "Shrink": _shrink, "Gelu": _gelu,
    "Swish": lambda node, x: x * torch.sigmoid(_attr(node, "alpha", 1.0) * x),
}


@_register(*PARAM_UNARY)
def _param_unary(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Integer inputs (Shrink's) compute in float64, as numpy's do with a float attribute."""
    x = inputs[0]
    return [PARAM_UNARY[node.op_type](node, _widened(x)).to(x.dtype)]


VARIADIC: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Sum": torch.add, "Mean": torch.add, "Max": torch.maximum, "Min": torch.minimum,
}


@_register(*VARIADIC)
def _variadic(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Folded left to right with broadcasting, in the first input's dtype."""
    tensors = [x for x in inputs if x is not None]
    result = functools.reduce(VARIADIC[node.op_type], tensors)
    return [(result / len(tensors) if node.op_type == "Mean" else result).to(tensors[0].dtype)]


def _divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Integer division truncates toward zero, as onnxruntime (and the executor) compute it."""
    if a.is_floating_point() or b.is_floating_point():
        return torch.div(a, b)
    return torch.div(a, b, rounding_mode="trunc")


def _power(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The base's type, whatever the exponent's (ONNX); integer bases go through float64."""
    if a.is_floating_point():
        return torch.pow(a, b.to(a.dtype))
    return torch.pow(a.double(), b)


BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": _divide, "Pow": _power,
    "Equal": torch.eq, "Less": torch.lt, "Greater": torch.gt, "LessOrEqual": torch.le,
    "GreaterOrEqual": torch.ge, "And": torch.logical_and, "Or": torch.logical_or,
    "Xor": torch.logical_xor, "PRelu": lambda a, b: torch.where(a < 0, a * b, a),
    "BitwiseAnd": torch.bitwise_and, "BitwiseOr": torch.bitwise_or, "BitwiseXor": torch.bitwise_xor,
}


@_register(*BINARY, "Mod")
def _binary(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """The result keeps the first input's dtype unless it is boolean (the executor's rule). Mod:
    fmod=1 takes the dividend's sign (C's fmod), fmod=0 the divisor's (Python's %)."""
    a, b = inputs[0], inputs[1]
    if node.op_type == "Mod":
        out = torch.fmod(a, b) if _attr(node, "fmod", 0) else torch.remainder(a, b)
    else:
        out = BINARY[node.op_type](a, b)
    return [out if out.dtype == torch.bool else out.to(a.dtype)]


@_register("IsInf")
def _isinf(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x = inputs[0]
    positive = torch.isposinf(x) if _attr(node, "detect_positive", 1) else torch.zeros_like(x, dtype=torch.bool)
    negative = torch.isneginf(x) if _attr(node, "detect_negative", 1) else torch.zeros_like(x, dtype=torch.bool)
    return [positive | negative]


@_register("Where")
def _where(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    cond, a, b = inputs[:3]
    return [torch.where(cond, a, b).to(a.dtype)]


@_register("Clip")
def _clip(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Bounds from attributes (before opset 11) or inputs, in x's dtype."""
    x = inputs[0]
    low = node.attrs["min"] if "min" in node.attrs else _opt(inputs, 1)
    high = node.attrs["max"] if "max" in node.attrs else _opt(inputs, 2)
    if low is None and high is None:
        return [x]

    def bound(value: Any) -> Any:
        return value.to(x.dtype) if isinstance(value, torch.Tensor) else value
    return [torch.clamp(x, min=bound(low), max=bound(high))]


@_register("Cast", "CastLike")
def _cast(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Float to integer truncates toward zero in torch as in the executor."""
    x = inputs[0]
    target = inputs[1].dtype if node.op_type == "CastLike" else torch_dtype(_onnx_dtype(_attr(node, "to")).name)
    return [x.to(target)]


@_register("Identity", "Dropout")
def _identity(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Dropout is inference-only (LIMITS sends a training_mode input to the executor)."""
    x = inputs[0]
    if len(node.outputs) > 1 and node.outputs[1]:
        return [x, torch.ones(x.shape, dtype=torch.bool, device=x.device)]
    return [x]


# --------------------------------------------------------------------------- shapes and data movement

@_register("Constant", "ConstantOfShape", "Range", "Shape", "Size")
def _computed_on_host(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Ops whose output follows from host values and shapes alone (the importer folds them when
    their inputs are constants): the executor computes them, the result moves to the device (a
    host-to-device copy: a run holding one stays out of a CUDA graph)."""
    host = [_stand_in(value) if isinstance(value, torch.Tensor) else value for value in inputs]
    return [context.backend.to_device(np.asarray(out)) for out in OPS[node.op_type](node, host, context.opset)]


@_register("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Order-keeping shape ops: the executor's own op on a stand-in of x gives the output shape
    (opset forms, negative axes, allowzero, Squeeze without axes); torch only reshapes."""
    x = inputs[0]
    shape = OPS[node.op_type](node, [_stand_in(x), *inputs[1:]], context.opset)[0].shape
    return [x.reshape(shape)]


@_register("Split")
def _split(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """The executor splits a stand-in of x (sizes from the attribute, the input or num_outputs);
    torch splits x into parts of the same sizes."""
    x = inputs[0]
    axis = _attr(node, "axis", 0) % x.ndim
    parts = OPS["Split"](node, [_stand_in(x), *inputs[1:]], context.opset)
    return list(torch.split(x, [part.shape[axis] for part in parts], dim=axis))


@_register("Transpose")
def _transpose(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x = inputs[0]
    perm = _attr(node, "perm", None)
    return [x.permute(tuple(perm) if perm is not None else tuple(reversed(range(x.ndim))))]


@_register("Expand")
def _expand(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x = inputs[0]
    return [x.expand(torch.broadcast_shapes(tuple(x.shape), tuple(_ints(inputs[1]))))]


@_register("Tile")
def _tile(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    return [inputs[0].repeat(*_ints(inputs[1]))]


@_register("Concat")
def _concat(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    return [torch.cat([x for x in inputs if x is not None], dim=_attr(node, "axis"))]


@_register("Slice")
def _slice(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Bounds clamped as Python slicing clamps them (the INT64 sentinels included); torch has no
    negative step, so a reversed axis is gathered."""
    x = inputs[0]
    out = x
    for start, end, axis, step in slice_arguments(node, inputs):
        axis %= x.ndim
        first, stop, step = slice(start, end, step).indices(x.shape[axis])
        if step > 0:
            out = out[(slice(None),) * axis + (slice(first, stop, step),)]
        else:
            out = out.index_select(axis, torch.arange(first, stop, step, device=x.device))
    return [out]


@_register("Gather")
def _gather(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Negative indices count from the end."""
    x, indices = inputs[0], inputs[1]
    axis = _attr(node, "axis", 0) % x.ndim
    indices = torch.where(indices < 0, indices + x.shape[axis], indices)
    picked = x.index_select(axis, indices.reshape(-1).long())
    return [picked.reshape(x.shape[:axis] + indices.shape + x.shape[axis + 1:])]


def _reflected(positions: torch.Tensor, size: int) -> torch.Tensor:
    """numpy's reflect padding, any width: the mirror image repeats with period 2 (size - 1)."""
    if size == 1:
        return torch.zeros_like(positions)
    period = 2 * (size - 1)
    folded = torch.remainder(positions, period)
    return torch.where(folded < size, folded, period - folded)


# Pad's non-constant modes: source index along an axis for each output position (x's index space)
PAD_SOURCES: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "edge": lambda positions, size: torch.clamp(positions, 0, size - 1),
    "reflect": _reflected,
    "wrap": lambda positions, size: torch.remainder(positions, size),
}


@_register("Pad")
def _pad(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Negative pads crop. Constant mode fills, then places x cropped (the fill value a device
    tensor when it is an input); the other modes gather each padded axis at the source index of
    every output position, which for a crop beside a pad is the executor's pad-then-crop."""
    x = inputs[0]
    width, value = pad_arguments(node, inputs, x.ndim)
    mode = _attr(node, "mode", "constant")
    if mode == "constant":
        fill = value.to(x.dtype) if isinstance(value, torch.Tensor) else x.new_full((), value)
        out = fill.expand([size + lo + hi for size, (lo, hi) in zip(x.shape, width)]).contiguous()
        kept = tuple(slice(max(-lo, 0), size - max(-hi, 0)) for size, (lo, hi) in zip(x.shape, width))
        cropped = x[kept]
        out[tuple(slice(max(lo, 0), max(lo, 0) + size) for size, (lo, _) in zip(cropped.shape, width))] = cropped
        return [out]
    out = x
    for axis, (size, (lo, hi)) in enumerate(zip(x.shape, width)):
        if lo or hi:
            positions = torch.arange(-lo, size + hi, device=x.device)
            out = out.index_select(axis, PAD_SOURCES[mode](positions, size))
    return [out]


@_register("Trilu")
def _trilu(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """A mask of the last two axes against the diagonal k, read on the device (no host sync)."""
    x, k = inputs[0], _opt(inputs, 1)
    rows, cols = x.shape[-2:]
    offset = torch.arange(cols, device=x.device) - torch.arange(rows, device=x.device).unsqueeze(1)
    diagonal = 0 if k is None else k.reshape(())
    keep = offset >= diagonal if _attr(node, "upper", 1) else offset <= diagonal
    return [torch.where(keep, x, x.new_zeros(()))]


@_register("DepthToSpace", "SpaceToDepth")
def _depth_space(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x = inputs[0]
    tiles, order, out_shape = depth_space_plan(node, x.shape)
    return [x.reshape(tiles).permute(order).reshape(out_shape)]


@_register("CumSum", "CumProd")
def _cumulative(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """The axis is a host value (HOST_INPUTS); exclusive shifts by one, the op's identity first."""
    x = inputs[0]
    axis = int(inputs[1].reshape(-1)[0]) % max(x.ndim, 1)
    reverse = _attr(node, "reverse", 0)
    data = torch.flip(x, (axis,)) if reverse else x
    if _attr(node, "exclusive", 0):
        identity = torch.full_like(data.narrow(axis, 0, 1), 0 if node.op_type == "CumSum" else 1)
        data = torch.cat([identity, data.narrow(axis, 0, x.shape[axis] - 1)], dim=axis)
    scan = torch.cumsum if node.op_type == "CumSum" else torch.cumprod
    out = scan(data, dim=axis, dtype=x.dtype)
    return [torch.flip(out, (axis,)) if reverse else out]


# --------------------------------------------------------------------------- reductions, normalization

def _product(x: torch.Tensor, dim: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    """torch.prod takes one axis: the axes one at a time, the last first (earlier indices hold)."""
    for axis in sorted(dim, reverse=True):
        x = torch.prod(x, dim=axis, keepdim=keepdim)
    return x


def _sum_of_squares(x: torch.Tensor, dim: tuple[int, ...], keepdim: bool) -> torch.Tensor:
    return torch.sum(torch.square(x), dim=dim, keepdim=keepdim)


# fn(x, dim, keepdim); the result is cast to x's dtype
REDUCERS: dict[str, Callable[..., torch.Tensor]] = {
    "ReduceMean": torch.mean, "ReduceSum": torch.sum, "ReduceMax": torch.amax, "ReduceMin": torch.amin,
    "ReduceProd": _product, "ReduceSumSquare": _sum_of_squares,
    "ReduceL1": lambda x, dim, keepdim: torch.sum(torch.abs(x), dim=dim, keepdim=keepdim),
    "ReduceL2": lambda x, dim, keepdim: torch.sqrt(_widened(_sum_of_squares(x, dim, keepdim))),
    "ReduceLogSum": lambda x, dim, keepdim: torch.log(_widened(torch.sum(x, dim=dim, keepdim=keepdim))),
    "ReduceLogSumExp": lambda x, dim, keepdim: torch.logsumexp(_widened(x), dim=dim, keepdim=keepdim),
}


@_register(*REDUCERS)
def _reduce(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x = inputs[0]
    axes = _reduce_axes(node, inputs, x)  # None: noop_with_empty_axes and no axes
    if axes is None:
        return [x]
    out = REDUCERS[node.op_type](x, dim=axes, keepdim=bool(_attr(node, "keepdims", 1)))
    return [out.to(x.dtype)]


@_register("ArgMax", "ArgMin")
def _arg_extreme(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """torch, like numpy, picks the first of equal extremes (and a NaN as the extreme);
    select_last_index searches the flipped axis."""
    x = inputs[0]
    axis = _attr(node, "axis", 0) % x.ndim
    keepdim = bool(_attr(node, "keepdims", 1))
    find = torch.argmax if node.op_type == "ArgMax" else torch.argmin
    if _attr(node, "select_last_index", 0):
        return [x.shape[axis] - 1 - find(torch.flip(x, (axis,)), dim=axis, keepdim=keepdim)]
    return [find(x, dim=axis, keepdim=keepdim)]


def _stashed(x: torch.Tensor, node: Node) -> torch.Tensor:
    """x in the dtype the executor computes the node's statistics in (float32 for fp16/bf16: stash_type)."""
    return x.to(torch_dtype(_stash_dtype(_stand_in(x), node).name))


@_register("Softmax", "LogSoftmax", "Hardmax")
def _softmax(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Hardmax: 1 at the first maximum along the axis (argmax's tie rule), 0 elsewhere."""
    x = inputs[0]
    view, axis = _coerced_2d(node, x, context.opset)  # the 2-D coercion before opset 13
    if node.op_type == "Hardmax":
        hot = F.one_hot(torch.argmax(view, dim=axis), view.shape[axis]).movedim(-1, axis)
        return [hot.to(x.dtype).reshape(x.shape)]
    normalize = torch.softmax if node.op_type == "Softmax" else torch.log_softmax
    return [normalize(view, dim=axis).reshape(x.shape)]


@_register("RMSNormalization")
def _rms_normalization(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Over the axes from `axis` on, in the executor's stash dtype, rounded to x's before the scale."""
    x, scale = inputs[0], inputs[1]
    axis = _attr(node, "axis", -1) % x.ndim
    work = _stashed(x, node)
    normed = F.rms_norm(work, tuple(x.shape[axis:]), None, float(_attr(node, "epsilon", 1e-5))).to(x.dtype)
    return [(normed * scale).to(x.dtype)]


@_register("LpNormalization")
def _lp_normalization(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """x over its Lp norm along the axis; 0 where the norm is 0."""
    x = inputs[0]
    norm = torch.linalg.vector_norm(x, ord=_attr(node, "p", 2), dim=_attr(node, "axis", -1), keepdim=True)
    return [torch.where(norm == 0, 0, x / norm).to(x.dtype)]


@_register("MeanVarianceNormalization")
def _mean_variance_normalization(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """(x - mean) / (std + 1e-9) over the axes (default 0, 2, 3), statistics in the executor's stash dtype."""
    x = inputs[0]
    axes = tuple(_ints(_attr(node, "axes", [0, 2, 3])))
    work = _stashed(x, node)
    var, mean = torch.var_mean(work, dim=axes, keepdim=True, correction=0)
    return [((work - mean) / (torch.sqrt(var) + 1e-9)).to(x.dtype)]


@_register("Einsum")
def _einsum(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """What partition's two-operand rewrite leaves (three operands, ellipses, traces): torch's
    einsum takes ONNX's equation, in the operands' widest float (float32 contractions)."""
    operands = [x for x in inputs if x is not None]
    work = functools.reduce(torch.promote_types, [x.dtype for x in operands])
    with float32_contractions():
        out = torch.einsum(_attr(node, "equation").replace(" ", ""), *[x.to(work) for x in operands])
    return [out.to(operands[0].dtype)]


@_register("OneHot")
def _one_hot(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """values[1] where the (negative: from the end) index names the position on the new axis, values[0] elsewhere."""
    indices, depth, values = inputs[0].long(), int(np.asarray(inputs[1]).reshape(-1)[0]), inputs[2]
    hot = F.one_hot(torch.where(indices < 0, indices + depth, indices), depth).bool()
    hot = hot.movedim(-1, _attr(node, "axis", -1) % (indices.ndim + 1))
    return [torch.where(hot, values[1], values[0])]


@_register("LayerNormalization")
def _layer_norm(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """F.layer_norm keeps fp16/bf16 statistics in fp32 (stash_type 1); the optional Mean and
    InvStdDev outputs are computed in the executor's stash dtype when the graph reads them."""
    x, scale, bias = inputs[0], inputs[1], _opt(inputs, 2)
    axis = _attr(node, "axis", -1) % x.ndim
    eps = float(_attr(node, "epsilon", 1e-5))
    shape = x.shape[axis:]
    out = F.layer_norm(x, shape, scale.expand(shape), None if bias is None else bias.expand(shape), eps)
    if not any(node.outputs[1:]):
        return [out]
    work = _stashed(x, node)
    var, mean = torch.var_mean(work, dim=tuple(range(axis, x.ndim)), keepdim=True, correction=0)
    return [out, mean, torch.rsqrt(var + eps)]


@_register("BatchNormalization")
def _batch_norm(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Inference form (LIMITS sends training_mode=1 to the executor)."""
    x, scale, bias, mean, var = inputs[:5]
    return [F.batch_norm(x, mean, var, scale, bias, training=False, eps=float(_attr(node, "epsilon", 1e-5)))]


@_register("InstanceNormalization", "GroupNormalization")
def _group_norm(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Statistics per sample and group (InstanceNormalization: a group per channel) in the
    executor's stash dtype (fp32 for fp16/bf16), cast back after the affine step; an opset-18
    GroupNormalization's per-group scale and bias spread over each group's channels."""
    x, scale, bias = inputs[:3]
    channels = x.shape[1]
    groups = _attr(node, "num_groups", channels)
    work = _stashed(x, node).reshape(x.shape[0], groups, -1)
    var, mean = torch.var_mean(work, dim=2, keepdim=True, correction=0)
    normed = ((work - mean) / torch.sqrt(var + _attr(node, "epsilon", 1e-5))).reshape(x.shape)
    if scale.shape[0] != channels:
        scale, bias = (p.reshape(-1, 1).expand(-1, channels // groups).reshape(-1) for p in (scale, bias))
    shape = (1, channels) + (1,) * (x.ndim - 2)
    return [(normed * scale.reshape(shape) + bias.reshape(shape)).to(x.dtype)]


_RESIZE_MATRICES: dict[tuple[Any, ...], list[tuple[int, torch.Tensor]]] = {}


def _is_identity(matrix: np.ndarray) -> bool:
    return matrix.shape[0] == matrix.shape[1] and np.array_equal(matrix, np.eye(len(matrix)))


@_register("Resize", "Upsample")
def _resize(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Separable, by the executor's own interpolation matrices (resize_matrices: every mode and
    coordinate transform, from shapes and the node alone), applied on the device one axis after
    another in float32 (float64 for the gate's reference; integers rounded back, as the executor
    does). The matrices are made once per node and shape, so a run replays in a CUDA graph; an axis
    left as it is costs nothing. UNets' and FPNs' upsampling ran on the host before: a round trip."""
    x = inputs[0]
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    key = (node.name, node.op_type, repr(sorted(node.attrs.items())), tuple(x.shape), context.opset, str(x.device),
           work, *(None if value is None else np.asarray(value).tobytes() for value in inputs[1:]))
    if key not in _RESIZE_MATRICES:
        plans = resize_matrices(node, [_stand_in(x), *inputs[1:]], _stand_in(x), context.opset)
        _RESIZE_MATRICES[key] = [(axis, torch.as_tensor(matrix, dtype=work, device=x.device))
                                 for axis, matrix, _ in plans if not _is_identity(matrix)]
    out = x.to(work)
    with float32_contractions():
        for axis, matrix in _RESIZE_MATRICES[key]:
            out = torch.movedim(torch.tensordot(matrix, out, dims=([1], [axis])), 0, axis)
    return [out.to(x.dtype) if x.is_floating_point() else torch.round(out).to(x.dtype)]


@_register("GatherElements")
def _gather_elements(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x, indices = inputs[0], inputs[1].long()
    axis = _attr(node, "axis", 0) % x.ndim
    return [torch.gather(x, axis, torch.where(indices < 0, indices + x.shape[axis], indices))]


@_register("GatherND")
def _gather_nd(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Each batch's rows picked by the last axis of indices (batch_dims leading axes shared)."""
    x, indices = inputs[0], inputs[1].long()
    batch = _attr(node, "batch_dims", 0)
    depth = indices.shape[-1]
    batches = math.prod(x.shape[:batch])
    flat_x = x.reshape((batches,) + tuple(x.shape[batch:]))
    flat_indices = indices.reshape(batches, -1, depth)
    rows = torch.arange(batches, device=x.device)[:, None]
    picked = flat_x[(rows, *flat_indices.unbind(-1))]
    return [picked.reshape(tuple(indices.shape[:-1]) + tuple(x.shape[batch + depth:]))]


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@_register("ScatterElements", "Scatter")
def _scatter_elements(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x, indices, updates = inputs[0], inputs[1].long(), inputs[2]
    axis = _attr(node, "axis", 0) % x.ndim
    indices = torch.where(indices < 0, indices + x.shape[axis], indices)
    reduction = _attr(node, "reduction", "none")
    if reduction == "none":
        return [x.scatter(axis, indices, updates)]
    return [x.scatter_reduce(axis, indices, updates, _SCATTER_REDUCE[reduction], include_self=True)]


@_register("ScatterND")
def _scatter_nd(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """x with the slices the last axis of indices names replaced (or added to: reduction "add"; a KV
    cache's update in some decoder exports)."""
    x, indices, updates = inputs[0], inputs[1].long(), inputs[2]
    return [x.index_put(tuple(indices.unbind(-1)), updates, accumulate=_attr(node, "reduction", "none") == "add")]


@_register("TopK")
def _topk(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """A stable sort (among equal values the lower index first, as ONNX orders them), cut to k."""
    x = inputs[0]
    k = int(np.asarray(inputs[1]).reshape(-1)[0]) if _opt(inputs, 1) is not None else _attr(node, "k")
    axis = _attr(node, "axis", -1) % x.ndim
    values, indices = torch.sort(x, dim=axis, descending=bool(_attr(node, "largest", 1)), stable=True)
    return [values.narrow(axis, 0, k), indices.narrow(axis, 0, k)]


def _per_axis(value: torch.Tensor, x: torch.Tensor, node: Node) -> torch.Tensor:
    """A quantization scale or zero point per tensor, or per axis (1-D), shaped to broadcast against x."""
    if value.numel() == 1:
        return value.reshape(())
    shape = [1] * x.ndim
    shape[_attr(node, "axis", 1) % x.ndim] = -1
    return value.reshape(shape)


@_register("DequantizeLinear")
def _dequantize(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """(x - zero point) * scale in float32, in the scale's dtype (or output_dtype): a QDQ model's
    weights and activations back to float on the device."""
    x, scale, zero = inputs[0], inputs[1], _opt(inputs, 2)
    values = x.float() if zero is None else x.float() - _per_axis(zero, x, node).float()
    dtype = _output_dtype(node, scale.dtype)
    return [(values * _per_axis(scale, x, node).float()).to(dtype)]


def _output_dtype(node: Node, default: torch.dtype) -> torch.dtype:
    """The quantization ops' output_dtype attribute as a torch dtype, or `default` without one."""
    return torch_dtype(_onnx_dtype(_attr(node, "output_dtype")).name) if _attr(node, "output_dtype", 0) else default


@_register("QuantizeLinear")
def _quantize(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """x / scale rounded half to even, plus the zero point, clamped to the integer type (uint8
    without a zero point), as the executor quantizes."""
    x, scale, zero = inputs[0], inputs[1], _opt(inputs, 2)
    dtype = zero.dtype if zero is not None else _output_dtype(node, torch.uint8)
    scaled = torch.round(x.float() / _per_axis(scale, x, node).float())
    if zero is not None:
        scaled = scaled + _per_axis(zero, x, node).float()
    info = torch.iinfo(dtype)
    return [scaled.clamp(info.min, info.max).to(dtype)]


def _quantization_limit(node: Node) -> str | None:
    """Blocked scales, and float8 or 4-bit types (QuantizeLinear's output_dtype), stay in the executor."""
    if _attr(node, "block_size", 0):
        return "blocked scales"
    if node.op_type == "QuantizeLinear" and _attr(node, "output_dtype", 0) \
            and _onnx_dtype(_attr(node, "output_dtype")).name not in ("int8", "uint8", "int16", "uint16", "int32"):
        return f"output_dtype {_onnx_dtype(_attr(node, 'output_dtype')).name}"
    return None


@_register("LRN")
def _lrn(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Each channel's window is the (size - 1) // 2 channels before it and the rest after (ONNX;
    F.local_response_norm centres an even window the other way): the squares padded so, then
    averaged over size channels by one pooling pass."""
    x = inputs[0]
    size = _attr(node, "size")
    alpha, beta, bias = _attr(node, "alpha", 1e-4), _attr(node, "beta", 0.75), _attr(node, "bias", 1.0)
    before = (size - 1) // 2
    squares = torch.square(x).reshape(x.shape[0], 1, x.shape[1], -1)  # (N, 1, C, rest)
    padded = F.pad(squares, (0, 0, before, size - 1 - before))
    window_mean = F.avg_pool2d(padded, (size, 1), stride=1).reshape(x.shape)
    return [x / (bias + alpha * window_mean) ** beta]


# --------------------------------------------------------------------------- contractions, pooling

@_register("MatMul")
def _matmul(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    with float32_contractions():
        return [torch.matmul(inputs[0], inputs[1])]


@_register("Gemm")
def _gemm(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """alpha * A' @ B' + beta * C, C added in the GEMM's epilogue (torch.addmm)."""
    a, b, c = inputs[0], inputs[1], _opt(inputs, 2)
    a = a.T if _attr(node, "transA", 0) else a
    b = b.T if _attr(node, "transB", 0) else b
    alpha, beta = float(_attr(node, "alpha", 1.0)), float(_attr(node, "beta", 1.0))
    with float32_contractions():
        if c is None:
            product = a @ b
            return [product * alpha if alpha != 1.0 else product]
        return [torch.addmm(c, a, b, beta=beta, alpha=alpha)]


_CONV: dict[int, Callable[..., torch.Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_TRANSPOSE: dict[int, Callable[..., torch.Tensor]] = {1: F.conv_transpose1d, 2: F.conv_transpose2d,
                                                          3: F.conv_transpose3d}
_MAX_POOL: dict[int, Callable[..., torch.Tensor]] = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL: dict[int, Callable[..., torch.Tensor]] = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


@_register("Conv")
def _conv(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Pads (auto_pad resolved) by the executor's geometry; asymmetric ones padded explicitly."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    strides, dilations, begins, ends = _conv_geometry(node, x, list(w.shape[2:]))
    if begins != ends:
        x, begins = F.pad(x, _torch_pads(begins, ends)), [0] * len(begins)
    with float32_contractions():
        return [_CONV[x.ndim - 2](x, w, bias, stride=strides, padding=begins, dilation=dilations,
                                  groups=_attr(node, "group", 1))]


@_register("ConvTranspose")
def _conv_transpose(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """By the executor's geometry (conv_transpose_geometry: output_shape and auto_pad resolved):
    the full transposed conv, output_padding's zeros after it, the pads cropped (or, negative,
    added as zeros), then the bias, as the executor orders them."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    geometry = conv_transpose_geometry(node, tuple(x.shape), tuple(w.shape))
    with float32_contractions():
        out = _CONV_TRANSPOSE[x.ndim - 2](x, w, stride=geometry.strides, dilation=geometry.dilations,
                                          groups=_attr(node, "group", 1))
    out = F.pad(out, [pad for extra in reversed(geometry.output_padding) for pad in (0, extra)])
    out = F.pad(out, [pad for begin, end in zip(reversed(geometry.begins), reversed(geometry.ends))
                      for pad in (-begin, -end)])  # negative pads crop
    if bias is not None:
        out = out + bias.reshape([1, -1] + [1] * (x.ndim - 2)).to(out.dtype)
    return [out]


@_register("MaxPool", "AveragePool")
def _pool(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """Windows over x padded by the executor's geometry (explicit pads, then room for ceil_mode's
    last window), cut to its output shape. Averages divide by the elements each window counts:
    real ones, plus the explicit pads under count_include_pad, never the ceil_mode room."""
    x = inputs[0]
    geometry = _pool_geometry(node, x)
    rank, kernel, strides = len(geometry.kernel), geometry.kernel, geometry.strides
    room = [end + extra for end, extra in zip(geometry.ends, geometry.extra)]
    pads = _torch_pads(geometry.begins, room)
    window = (slice(None), slice(None)) + tuple(slice(0, size) for size in geometry.out_shape)
    if node.op_type == "MaxPool":
        padded = F.pad(x, pads, value=-math.inf)
        return [_MAX_POOL[rank](padded, kernel, strides, dilation=geometry.dilations)[window]]
    sums = _AVG_POOL[rank](F.pad(x, pads), kernel, strides) * math.prod(kernel)
    if _attr(node, "count_include_pad", 0):
        explicit = [size + begin + end for size, begin, end in zip(x.shape[2:], geometry.begins, geometry.ends)]
        counted = F.pad(torch.ones((1, 1, *explicit), dtype=x.dtype, device=x.device),
                        _torch_pads([0] * rank, geometry.extra))
    else:
        counted = F.pad(torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype, device=x.device), pads)
    counts = _AVG_POOL[rank](counted, kernel, strides) * math.prod(kernel)
    return [(sums / counts)[window]]


@_register("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    x = inputs[0]
    axes = tuple(range(2, x.ndim))
    if node.op_type == "GlobalAveragePool":
        return [torch.mean(x, dim=axes, keepdim=True)]
    return [torch.amax(x, dim=axes, keepdim=True)]


@_register(*ONNX_OF)
def _channels_last(node: Node, inputs: list[Any], context: GlueContext) -> list[torch.Tensor]:
    """An NHWC op (layout.py) as its ONNX op's glue on permuted views: on a GPU torch then runs
    cuDNN's channels-last kernels, and their output permutes back to a contiguous NHWC tensor."""
    return run_as_nchw(node, inputs, lambda onnx_node, args: GLUE[onnx_node.op_type](onnx_node, args, context),
                       lambda x, perm: x.permute(*perm))


# --------------------------------------------------------------------------- what glue does not cover

def _cast_limit(node: Node) -> str | None:
    if node.op_type == "CastLike":
        return None
    target = _onnx_dtype(_attr(node, "to")).name
    try:
        torch_dtype(target)
    except ValueError:
        return f"a cast to {target}"
    return None


LIMITS: dict[str, Callable[[Node], str | None]] = {
    "BatchNormalization": lambda node: "training_mode=1" if _attr(node, "training_mode", 0) else None,
    "MaxPool": lambda node: "the Indices output" if len(node.outputs) > 1 and node.outputs[1] else None,
    "AveragePool": lambda node: ("dilations" if any(d != 1 for d in _ints(_attr(node, "dilations", [1])))
                                 else None),
    "Dropout": lambda node: "a training_mode input" if len(node.inputs) > 2 and node.inputs[2] else None,
    "Cast": _cast_limit,
    "QuantizeLinear": _quantization_limit, "DequantizeLinear": _quantization_limit,
    "ScatterND": lambda node: (f"reduction {_attr(node, 'reduction', 'none')}"
                               if _attr(node, "reduction", "none") not in ("none", "add") else None),
    "Resize": lambda node: ("tf_crop_and_resize's extrapolation"
                            if _attr(node, "coordinate_transformation_mode", "") == "tf_crop_and_resize" else None),
}


def unsupported_reason(node: Node) -> str | None:
    """Why a node cannot run as device glue (it then runs in the executor), or None."""
    if is_channels_last(node):
        node = nchw_node(node)
    elif node.domain not in ("", "ai.onnx") or node.op_type not in GLUE:
        return f"no device glue for {node.op_type}"
    limit = LIMITS.get(node.op_type)
    problem = limit(node) if limit is not None else None
    return f"device glue for {node.op_type} does not cover {problem}" if problem else None


# --------------------------------------------------------------------------- the stretch runner

class _GlueCall:
    """One node as device glue: constants bound once (host arrays where the op reads them as
    shapes or axes, device tensors elsewhere), the rest read from the piece's values."""

    def __init__(self, node: Node, constants: Mapping[str, np.ndarray], device_constant: Callable[[str], torch.Tensor],
                 context: GlueContext) -> None:
        self.node, self.context, self.op = node, context, GLUE[node.op_type]
        onnx_type = nchw_node(node).op_type if is_channels_last(node) else node.op_type  # NhwcResize reads Resize's
        self.host_slots = frozenset(VALUE_SHAPED_INPUTS.get(onnx_type, ()) + HOST_INPUTS.get(onnx_type, ()))
        self.bound: dict[int, Any] = {}
        for slot, name in enumerate(node.inputs):
            if name in constants:
                self.bound[slot] = constants[name] if slot in self.host_slots else device_constant(name)

    def __call__(self, env: dict[str, Any]) -> None:
        node, to_host = self.node, self.context.backend.to_host
        inputs: list[Any] = []
        for slot, name in enumerate(node.inputs):
            if slot in self.bound or not name:
                inputs.append(self.bound.get(slot))
            elif slot in self.host_slots:  # computed at run time (folded in practice): read on the host
                inputs.append(to_host(env[name]))
            else:
                inputs.append(env[name])
        outputs = self.op(node, inputs, self.context)
        for index, name in enumerate(node.outputs):
            if not name:
                continue
            if index >= len(outputs):
                raise UnsupportedOpError(node.op_type, node.name, f"output {index} is not computed on the device")
            env[name] = outputs[index].contiguous()


def stretch_piece(backend: TritonBackend, nodes: Sequence[Node], inputs: Sequence[str], outputs: Sequence[str],
                  constants: Mapping[str, np.ndarray], opset: int) -> StretchPiece:
    """The stretch as device glue, node by node in graph order, reading `inputs` (constants aside)
    and returning `outputs`; a node glue does not cover runs in the executor on the host (listed
    on the piece). A constant that is also an input is read as an input: a task's folded weights
    are its constants and its inputs, and the gate feeds them values of its own."""
    fed = set(inputs)
    constants = {name: value for name, value in constants.items() if name not in fed}
    context = GlueContext(opset, backend)
    on_device: dict[str, torch.Tensor] = {}

    def device_constant(name: str) -> torch.Tensor:  # each weight moves to the device once
        if name not in on_device:
            on_device[name] = backend.to_device(constants[name])
        return on_device[name]

    calls: list[Callable[[dict[str, Any]], None]] = []
    host_nodes: list[tuple[Node, str]] = []
    for node in nodes:
        reason = unsupported_reason(node)
        if reason is None:
            calls.append(_GlueCall(node, constants, device_constant, context))
            continue
        host_nodes.append((node, reason))
        on_host = ExecutorStretch([node], [name for name in node.outputs if name], constants, opset,
                                  backend.to_host, backend.to_device)
        calls.append(lambda env, on_host=on_host: env.update(on_host(env)))
    read, wanted = list(inputs), list(outputs)

    def run(values: Mapping[str, Any]) -> dict[str, Any]:
        env = {name: values[name] for name in read}
        for call in calls:
            call(env)
        return {name: env[name] for name in wanted}
    return StretchPiece(run, tuple(host_nodes))


__all__ = ["GLUE", "LIMITS", "GlueContext", "stretch_piece", "unsupported_reason"]
