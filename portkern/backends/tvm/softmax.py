"""Softmax over the last axis on the CPU: one row per step, three passes over a row held in cache.

max -> exp(x - max) and its sum -> divide. lane_reduce keeps vector_lanes partial maxima / sums in
one vector register while walking the row (then folds them), so the reductions vectorize like the
elementwise passes do. store_exp writes exp(x - max) to a row buffer once; without it the
exponential is computed twice (for the sum and for the output) and nothing is stored. exp is
TVM's polynomial fast_exp (relative error ~6e-8, vectorizable).
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from tvm import s_tir, te, topi

from ...hwprofile import Target
from ...tasks import Task
from .common import (
    HostFacts,
    Kernel,
    check_float32,
    check_lanes,
    check_space,
    inline_elementwise,
    row_reduce,
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


def dims(task: Task) -> tuple[int, int]:
    shape = task.inputs[0].shape
    return math.prod(shape[:-1]), shape[-1]


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    lanes = config["vector_lanes"]
    reason = check_lanes(lanes, HostFacts.of(target))
    if reason:
        return reason
    _, n = dims(task)
    if config["lane_reduce"] and n % lanes:
        return f"lane_reduce needs the row length {n} divisible by vector_lanes={lanes}"
    return None


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    rows, n = dims(task)
    lanes = config["vector_lanes"] if config["lane_reduce"] else 1
    x = te.placeholder((rows, n), "float32", name="x")
    row_max = row_reduce(lambda r, j: x[r, j], rows, n, lanes, "max", "row_max")
    shifted = te.compute((rows, n), lambda r, j: x[r, j] - row_max[r], name="shifted")
    exp = topi.fast_exp(shifted)
    row_sum = row_reduce(lambda r, j: exp[r, j], rows, n, lanes, "sum", "row_sum")
    out = te.compute((rows, n), lambda r, j: exp[r, j] / row_sum[r], name="out")

    sch = s_tir.Schedule(te.create_prim_func([x, out]))
    exp_name = exp.op.name
    stages = ["row_max_lanes", "row_max", exp_name, "row_sum_lanes", "row_sum"]
    keep = [*stages, "out"] if config["store_exp"] else [s for s in stages if s != exp_name] + ["out"]
    inline_elementwise(sch, keep=keep)
    schedule_rows(sch, config, stages)
    return Kernel(sch.mod, ((rows, n), (rows, n)))
