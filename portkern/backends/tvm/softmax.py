"""Softmax over the last axis on the CPU: one row per step, three passes over a row held in cache.

max -> exp(x - max) and its sum -> divide. lane_reduce keeps vector_lanes partial maxima / sums in
one vector register while walking the row (then folds them), so the reductions vectorize like the
elementwise passes do. store_exp writes exp(x - max) to a row buffer once; without it the
exponential is computed twice (for the sum and for the output) and nothing is stored. exp is
TVM's polynomial fast_exp (relative error ~6e-8, vectorizable). computation() is shared with
cuda/softmax.py.
"""
from __future__ import annotations

from typing import Any, Mapping

from tvm import s_tir, te, topi

from ...hwprofile import Target
from ...tasks import Task
from .common import (
    Computation,
    Kernel,
    check_float32,
    check_row_lanes,
    check_space,
    inline_elementwise,
    row_reduce,
    row_view,
    schedule_rows,
)

KIND = "softmax"
PRECISION = "fp32"
SPACE = {
    "rows_per_task": [1, 2, 4, 8, 16, 32],
    "vector_lanes": [4, 8, 16],
    "lane_reduce": [True, False],
    "store_exp": [True, False],
    "parallel": [True, False],
}
DEFAULT = {"rows_per_task": 4, "vector_lanes": 16, "lane_reduce": True, "store_exp": True, "parallel": True}


dims = row_view  # (rows, N), also for the CUDA family's templates


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    return (check_float32(task) or check_space(config, SPACE)
            or check_row_lanes(config, dims(task)[1], target, "row length"))


def computation(task: Task, lanes: int) -> Computation:
    """max -> exp(x - max) and its sum -> divide, over the task's (rows, N) view; lanes > 1 reduces
    into that many partials first (common.row_reduce)."""
    rows, n = dims(task)
    x = te.placeholder((rows, n), "float32", name="x")
    row_max = row_reduce(lambda r, j: x[r, j], rows, n, lanes, "max", "row_max")
    shifted = te.compute((rows, n), lambda r, j: x[r, j] - row_max[r], name="shifted")
    exp = topi.fast_exp(shifted)
    row_sum = row_reduce(lambda r, j: exp[r, j], rows, n, lanes, "sum", "row_sum")
    out = te.compute((rows, n), lambda r, j: exp[r, j] / row_sum[r], name="out")
    stages = ("row_max_lanes", "row_max", exp.op.name, "row_sum_lanes", "row_sum")
    return Computation((x, out), ((rows, n), (rows, n)), stages)


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    computed = computation(task, config["vector_lanes"] if config["lane_reduce"] else 1)
    sch = s_tir.Schedule(computed.prim_func())
    exp_name = computed.stages[2]
    stages = list(computed.stages)
    keep = [*stages, "out"] if config["store_exp"] else [s for s in stages if s != exp_name] + ["out"]
    inline_elementwise(sch, keep=keep)
    schedule_rows(sch, config, stages)
    return Kernel(sch.mod, computed.arg_shapes)
