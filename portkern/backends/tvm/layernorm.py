"""LayerNorm over the last axis on the CPU: two vectorized passes for the statistics, one to write.

mean = sum(x) / N, var = sum((x - mean)^2) / N (two passes: exact for rows with a large mean,
where sum(x^2) - N mean^2 cancels), out = (x - mean) / sqrt(var + eps) * gamma + beta.
lane_reduce keeps vector_lanes partial sums in one vector register while walking the row.
computation() and rmsnorm_computation() are shared with the CUDA family (cuda/layernorm.py,
cuda/rmsnorm.py); rmsnorm.py schedules RMSNorm on the CPU with this space and schedule_norm().
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from tvm import s_tir, te

from ...hwprofile import Target
from ...tasks import Task
from .common import (
    Computation,
    Kernel,
    check_float32,
    check_gamma,
    check_row_lanes,
    check_space,
    inline_elementwise,
    row_reduce,
    row_view,
    schedule_rows,
)

KIND = "layernorm"
PRECISION = "fp32"
SPACE = {
    "rows_per_task": [1, 2, 4, 8, 16, 32],
    "vector_lanes": [4, 8, 16],
    "lane_reduce": [True, False],
    "parallel": [True, False],
}
DEFAULT = {"rows_per_task": 4, "vector_lanes": 16, "lane_reduce": True, "parallel": True}


dims = row_view  # (rows, N), also for the CUDA family's templates


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    return (check_float32(task) or check_space(config, SPACE) or check_gamma(task)
            or check_row_lanes(config, dims(task)[1], target, "row length"))


STANDARDIZED_STAGES = ("row_sum_lanes", "row_sum", "row_sq_lanes", "row_sq")  # standardized()'s reductions


def standardized(rows: int, n: int, eps: float, lanes: int) -> tuple[te.Tensor, Callable[[Any, Any], Any]]:
    """x (rows, n) and (x - mean) / sqrt(var + eps) of each row at (r, j), the statistics in two
    passes (lanes as in common.row_reduce): LayerNorm's and GroupNorm's (groupnorm.py) normalization."""
    x = te.placeholder((rows, n), "float32", name="x")
    total = row_reduce(lambda r, j: x[r, j], rows, n, lanes, "sum", "row_sum")

    def centered(r: Any, j: Any) -> Any:
        return x[r, j] - total[r] * (1.0 / n)

    squares = row_reduce(lambda r, j: centered(r, j) * centered(r, j), rows, n, lanes, "sum", "row_sq")
    return x, lambda r, j: centered(r, j) / te.sqrt(squares[r] * (1.0 / n) + eps)


def computation(task: Task, lanes: int) -> Computation:
    """The two-pass LayerNorm over the task's (rows, N) view; lanes as in common.row_reduce."""
    rows, n = dims(task)
    x, normed = standardized(rows, n, float(task.attr("eps", 1e-5)), lanes)
    gamma = te.placeholder((n,), "float32", name="gamma")
    beta = te.placeholder((n,), "float32", name="beta")
    residual = _residual(task, rows, n)
    out = te.compute((rows, n), lambda r, j: _plus(residual, r, j, normed(r, j) * gamma[j] + beta[j]), name="out")
    return _with_residual(Computation((x, gamma, beta, out), ((rows, n), (n,), (n,), (rows, n)), STANDARDIZED_STAGES),
                          residual)


def rmsnorm_computation(task: Task, lanes: int) -> Computation:
    """x / sqrt(mean(x^2) + eps) * gamma over the task's (rows, N) view."""
    rows, n = dims(task)
    eps = float(task.attr("eps", 1e-6))
    x = te.placeholder((rows, n), "float32", name="x")
    gamma = te.placeholder((n,), "float32", name="gamma")
    squares = row_reduce(lambda r, j: x[r, j] * x[r, j], rows, n, lanes, "sum", "row_sq")
    residual = _residual(task, rows, n)
    out = te.compute((rows, n), lambda r, j: _plus(
        residual, r, j, x[r, j] / te.sqrt(squares[r] * (1.0 / n) + eps) * gamma[j]), name="out")
    return _with_residual(Computation((x, gamma, out), ((rows, n), (n,), (rows, n)), ("row_sq_lanes", "row_sq")),
                          residual)


def _residual(task: Task, rows: int, n: int) -> te.Tensor | None:
    """The residual a post-norm block adds after the norm (the task's last input), or None."""
    return te.placeholder((rows, n), "float32", name="residual") if task.attr("residual", False) else None


def _plus(residual: te.Tensor | None, r: Any, j: Any, value: Any) -> Any:
    return value if residual is None else value + residual[r, j]


def _with_residual(computed: Computation, residual: te.Tensor | None) -> Computation:
    """The computation with the residual as an argument before the output (the task's input order)."""
    if residual is None:
        return computed
    *inputs, out = computed.tensors
    *input_shapes, out_shape = computed.arg_shapes
    return Computation((*inputs, residual, out), (*input_shapes, out_shape, out_shape), computed.stages)


def reduce_lanes(config: Mapping[str, Any]) -> int:
    """Partial sums a row's reduction keeps (common.row_reduce): a vector of them, or one."""
    return config["vector_lanes"] if config["lane_reduce"] else 1


def schedule_norm(computed: Computation, config: Mapping[str, Any]) -> Kernel:
    """Both norms' CPU schedule: the row statistics and the output row by row (common.schedule_rows)."""
    sch = s_tir.Schedule(computed.prim_func())
    inline_elementwise(sch, keep=[*computed.stages, "out"])
    schedule_rows(sch, config, computed.stages)
    return Kernel(sch.mod, computed.arg_shapes)


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    return schedule_norm(computation(task, reduce_lanes(config)), config)
