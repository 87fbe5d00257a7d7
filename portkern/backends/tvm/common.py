"""What every TVM schedule template shares: the host facts it tiles for, the epilogue, the checks.

A template module (gemm.py, conv2d.py, ...) follows the kernel-module header contract (KIND,
PRECISION, SPACE, DEFAULT as literals) and defines two functions:

    constraints(task, config, target) -> str | None   why a config cannot work here, before building
    schedule(task, config, target) -> Kernel          the scheduled TensorIR and the argument shapes

The backend builds `Kernel.module` with LLVM for the host and calls it on buffers viewed with
`Kernel.arg_shapes` (a GEMM's (B, S, K) input is a (B*S, K) matrix to the kernel).
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import tvm
from tvm import s_tir, te, topi

from ...hwprofile import Target
from ...tasks import Task

# Activations as TVM computes them. erf/exp/tanh use TVM's vectorizable polynomial forms
# (measured relative L2 error ~6e-8 vs float64, 30-60x faster than the libm calls they replace).
_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


def _gelu(x: te.Tensor) -> te.Tensor:
    scaled = te.compute(x.shape, lambda *i: x(*i) * _SQRT_HALF, name="gelu_scale")
    erf = topi.fast_erf(scaled)
    return te.compute(x.shape, lambda *i: 0.5 * x(*i) * (1.0 + erf(*i)), name="gelu")


def _gelu_tanh(x: te.Tensor) -> te.Tensor:
    inner = te.compute(x.shape, lambda *i: _SQRT_2_OVER_PI * (x(*i) + 0.044715 * x(*i) * x(*i) * x(*i)),
                       name="gelu_tanh_inner")
    tanh = topi.fast_tanh(inner)
    return te.compute(x.shape, lambda *i: 0.5 * x(*i) * (1.0 + tanh(*i)), name="gelu_tanh")


def _sigmoid(x: te.Tensor) -> te.Tensor:
    exp = topi.fast_exp(te.compute(x.shape, lambda *i: -x(*i), name="sigmoid_neg"))
    return te.compute(x.shape, lambda *i: 1.0 / (1.0 + exp(*i)), name="sigmoid")


def _silu(x: te.Tensor) -> te.Tensor:
    sig = _sigmoid(x)
    return te.compute(x.shape, lambda *i: x(*i) * sig(*i), name="silu")


def _relu(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: te.max(x(*i), tvm.tirx.const(0.0, x.dtype)), name="relu")


def _relu6(x: te.Tensor) -> te.Tensor:
    zero, six = tvm.tirx.const(0.0, x.dtype), tvm.tirx.const(6.0, x.dtype)
    return te.compute(x.shape, lambda *i: te.min(te.max(x(*i), zero), six), name="relu6")


def _hardswish(x: te.Tensor) -> te.Tensor:
    zero, one, half, sixth = (tvm.tirx.const(value, x.dtype) for value in (0.0, 1.0, 0.5, 1.0 / 6.0))
    return te.compute(x.shape, lambda *i: x(*i) * te.min(te.max(x(*i) * sixth + half, zero), one), name="hardswish")


def _relu_squared(x: te.Tensor) -> te.Tensor:
    relu = _relu(x)
    return te.compute(x.shape, lambda *i: relu(*i) * relu(*i), name="relu_squared")


ACTIVATIONS: dict[str, Callable[[te.Tensor], te.Tensor]] = {
    "none": lambda x: x,
    "relu": _relu,
    "relu6": _relu6,
    "hardswish": _hardswish,
    "relu_squared": _relu_squared,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "silu": _silu,
    "sigmoid": _sigmoid,
    "tanh": topi.fast_tanh,
}


@dataclass(frozen=True)
class HostFacts:
    """The numbers of the CPU hwprofile a schedule is shaped by."""

    lanes: int  # fp32 lanes of one vector register
    vector_registers: int
    cores: int
    l1_bytes: int
    l2_bytes: int

    @classmethod
    def of(cls, target: Target) -> HostFacts:
        profile = target.profile
        vector_bytes = int(profile.limits.get("vector_bytes", 16))
        return cls(
            lanes=max(1, vector_bytes // 4),
            vector_registers=32 if vector_bytes >= 64 else 16,  # AVX-512 has 32 zmm; AVX2/SSE 16
            cores=max(1, profile.cores),
            l1_bytes=int(profile.limits.get("l1_bytes", 32 * 1024)),
            l2_bytes=int(profile.limits.get("l2_bytes", 1024 * 1024)),
        )


@dataclass(frozen=True)
class Computation:
    """What a task computes, as TE tensors (inputs, then outputs): defined once per task kind and
    scheduled by both template families (CPU here, CUDA in cuda/). Its padding parameters are the
    only thing a family chooses; `arg_shapes` is how the kernel views each argument."""

    tensors: tuple[te.Tensor, ...]
    arg_shapes: tuple[tuple[int, ...], ...]
    stages: tuple[str, ...] = ()  # row kernels: the reductions (and stored rows), in dataflow order

    def prim_func(self) -> tvm.tirx.PrimFunc:
        return te.create_prim_func(list(self.tensors))


@dataclass(frozen=True)
class Kernel:
    """A scheduled kernel: TensorIR ready to build and the shape of each argument it takes."""

    module: tvm.IRModule
    arg_shapes: tuple[tuple[int, ...], ...]  # inputs then outputs, in the task's order


def ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def clamp(index: Any, limit: int) -> Any:
    """An index kept inside [0, limit): padded tile rows read a real row and are discarded."""
    return te.min(index, limit - 1)


def padded_input(x: te.Tensor, pad_top: int, pad_left: int, rows: int, cols: int, fill: float) -> te.Tensor:
    """x (N, C, H, W) in a (N, C, rows, cols) frame at (pad_top, pad_left), `fill` around it: a
    window kernel then reads every position without a bounds test (and so vectorizes)."""
    _, _, height, width = x.shape

    def at(n: Any, c: Any, i: Any, j: Any) -> Any:
        inside = te.all(i >= pad_top, i < height + pad_top, j >= pad_left, j < width + pad_left)
        return te.if_then_else(inside, x[n, c, i - pad_top, j - pad_left], tvm.tirx.const(fill, x.dtype))

    return te.compute((x.shape[0], x.shape[1], rows, cols), at, name="x_padded")


def needs_padding(x_shape: Sequence[int], pad_top: int, pad_left: int, rows: int, cols: int) -> bool:
    return bool(pad_top or pad_left or rows > x_shape[2] or cols > x_shape[3])


def check_space(config: Mapping[str, Any], space: Mapping[str, Any]) -> str | None:
    """The config names exactly the space's parameters, each with one of its choices."""
    if set(config) != set(space):
        return f"config parameters {sorted(config)} differ from the space's {sorted(space)}"
    for name, value in config.items():
        if value not in space[name]:
            return f"{name}={value!r} is not one of {list(space[name])}"
    return None


def check_float32(task: Task) -> str | None:
    if any(spec.dtype != "float32" for spec in (*task.inputs, *task.outputs)):
        return f"the TVM CPU templates compute float32 only (task is {task.dtype})"
    return None


def check_gamma(task: Task) -> str | None:
    """A norm's gamma (and beta) hold one value per column of x."""
    if tuple(task.inputs[1].shape) != (task.inputs[0].shape[-1],):
        return f"gamma {task.inputs[1]} is not one value per column: this template normalizes the last axis"
    return None


def check_lanes(lanes: int, facts: HostFacts) -> str | None:
    if lanes > facts.lanes:
        return f"vector_lanes={lanes} exceeds the host's {facts.lanes} fp32 lanes"
    return None


def row_view(task: Task) -> tuple[int, int]:
    """(rows, N): a row-wise task's first input as rows of its last axis."""
    shape = task.inputs[0].shape
    return math.prod(shape[:-1]), shape[-1]


def check_row_lanes(config: Mapping[str, Any], length: int, target: Target, what: str) -> str | None:
    """A row reduction in vector_lanes-wide host vectors; lane_reduce keeps that many partials while
    walking a row, so the row's `length` must split into them."""
    lanes = config["vector_lanes"]
    reason = check_lanes(lanes, HostFacts.of(target))
    if reason:
        return reason
    if config["lane_reduce"] and length % lanes:
        return f"lane_reduce needs the {what} {length} divisible by vector_lanes={lanes}"
    return None


def check_vector(lanes: int, width: int, facts: HostFacts, what: str) -> str | None:
    """A vectorized loop of `width` elements is split in `lanes`-wide host vectors."""
    reason = check_lanes(lanes, facts)
    if reason:
        return reason
    if width % lanes:
        return f"{what}={width} is not a multiple of vector_lanes={lanes}"
    return None


def check_registers(rows: int, width: int, lanes: int, facts: HostFacts) -> str | None:
    """The accumulator tile plus one operand vector must stay in vector registers (no spills)."""
    needed = rows * (width // lanes) + width // lanes + 1
    if needed > facts.vector_registers:
        return (f"register tile {rows}x{width} needs {needed} vector registers "
                f"(host has {facts.vector_registers})")
    return None


def epilogue(acc: te.Tensor, shape: Sequence[int], activation: str, bias: Callable[..., Any] | None,
             residual: te.Tensor | None, residual_first: bool, residual_op: str = "add") -> te.Tensor:
    """The fused elementwise tail on the accumulator, in the order the task's subgraph computes it.

    `bias(*index)` is the bias value at an output index; the residual is added, or multiplied where
    `residual_op` is "mul" (a gate); stages are inlined by `schedule_epilogue`.
    """
    def add_bias(*index: Any) -> Any:
        value = acc(*index)
        return value + bias(*index) if bias is not None else value

    def joined(value: te.Tensor, op: str) -> te.Tensor:
        def join(*index: Any) -> Any:
            return value(*index) * residual(*index) if op == "mul" else value(*index) + residual(*index)
        return te.compute(value.shape, join, name=f"residual_{op}")

    value = te.compute(tuple(shape), add_bias, name="biased")
    if residual is not None and residual_first:
        value = joined(value, "add")
    value = ACTIVATIONS[activation](value)
    if residual is not None and not residual_first:
        value = joined(value, residual_op)
    return te.compute(value.shape, lambda *i: value(*i), name="out")


def inline_elementwise(sch: s_tir.Schedule, keep: Sequence[str]) -> None:
    """Inline every injective stage except the named ones (producers first, so chains collapse)."""
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in keep:
            sch.compute_inline(block)


def own_loops(sch: s_tir.Schedule, block: Any) -> list[Any]:
    """The loops compute_at(..., preserve_unit_loops=True) made for `block`: one per axis."""
    return sch.get_loops(block)[-len(sch.get(block).iter_vars):]


def schedule_epilogue(sch: s_tir.Schedule, at: Any, lanes: int) -> None:
    """Move the output stage under the tile loop `at` and vectorize its innermost loop, if it has
    one of its own: an output one element wide (a 7x7 average pool of a 7x7 map) leaves none
    under `at`, and vectorizing `at` itself would wrap the tile's other vectorized loops."""
    out = sch.get_sblock("out")
    sch.reverse_compute_at(out, at)
    innermost = sch.get_loops(out)[-1]
    if sch.get(innermost).same_as(sch.get(at)):
        return
    _, vector = sch.split(innermost, [None, lanes])
    sch.vectorize(vector)


def configs(space: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every configuration of a space, in a fixed order (for grid search and fallbacks)."""
    names = sorted(space)
    return [dict(zip(names, values)) for values in itertools.product(*(space[n] for n in names))]


def sample_valid(space: Mapping[str, Any], count: int, seed: int,
                 valid: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Up to `count` distinct valid configurations drawn at random (a seeded random search)."""
    rng = random.Random(seed)
    chosen: list[dict[str, Any]] = []
    seen: set[tuple[tuple[str, Any], ...]] = set()
    for _ in range(200 * count):
        if len(chosen) >= count:
            break
        config = {name: rng.choice(list(choices)) for name, choices in space.items()}
        key = tuple(sorted(config.items()))
        if key not in seen:
            seen.add(key)
            if valid(config):
                chosen.append(config)
    return chosen


def nearest_valid(default: Mapping[str, Any], space: Mapping[str, Any],
                  valid: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The valid configuration that differs from `default` in the fewest parameters."""
    def distance(config: dict[str, Any]) -> int:
        return sum(config[name] != default[name] for name in config)

    best = min((c for c in configs(space) if valid(c)), key=distance, default=None)
    return best


def row_reduce(value: Callable[[Any, Any], Any], rows: int, n: int, lanes: int, combine: str,
               name: str) -> te.Tensor:
    """A reduction over each row of `value(r, j)`; with lanes > 1, first into `lanes` partials
    (one vector accumulator, j strided by lanes) and then across them as a balanced tree, so the
    long loop vectorizes and the final fold is log2(lanes) dependent steps, not `lanes`."""
    reducer = te.sum if combine == "sum" else te.max
    if lanes == 1:
        j = te.reduce_axis((0, n), name=f"{name}_j")
        return te.compute((rows,), lambda r: reducer(value(r, j), axis=j), name=name)
    step = te.reduce_axis((0, n // lanes), name=f"{name}_step")
    partial = te.compute((rows, lanes), lambda r, lane: reducer(value(r, step * lanes + lane), axis=step),
                         name=f"{name}_lanes")
    pair = (lambda a, b: a + b) if combine == "sum" else te.max

    def tree(r: Any, first: int, count: int) -> Any:
        if count == 1:
            return partial[r, first]
        half = count // 2
        return pair(tree(r, first, half), tree(r, first + half, count - half))

    return te.compute((rows,), lambda r: tree(r, 0, lanes), name=name)


def schedule_rows(sch: s_tir.Schedule, config: Mapping[str, Any], row_stages: Sequence[str]) -> None:
    """Row-wise kernels: blocks of rows_per_task rows per thread; every stage of a row (named in
    dataflow order) computed under that row's loop, its innermost loop vectorized."""
    lanes = config["vector_lanes"]
    out = sch.get_sblock("out")
    rows, cols = sch.get_loops(out)
    task_rows, row = sch.split(rows, [None, config["rows_per_task"]])
    if config["parallel"]:
        sch.parallel(task_rows)
    sch.vectorize(sch.split(cols, [None, lanes])[1])
    present = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    for name in reversed([s for s in row_stages if s in present]):
        sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
    for name in row_stages:
        if name not in present:
            continue
        block = sch.get_sblock(name)
        loops = sch.get_loops(block)
        if name.endswith("_lanes"):  # (..., lane, step): step outside, the lane vector inside
            lane, step = loops[-2:]
            sch.reorder(step, lane)
            sch.vectorize(lane)
        elif _is_row_elementwise(sch, block):
            sch.vectorize(sch.split(loops[-1], [None, lanes])[1])


def _is_row_elementwise(sch: s_tir.Schedule, block: Any) -> bool:
    """A (rows, columns) stage with no reduction: its column loop vectorizes."""
    iter_vars = sch.get(block).iter_vars
    return len(iter_vars) == 2 and all(var.iter_type == var.DataPar for var in iter_vars)
