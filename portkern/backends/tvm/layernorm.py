"""LayerNorm over the last axis on the CPU: two vectorized passes for the statistics, one to write.

mean = sum(x) / N, var = sum((x - mean)^2) / N (two passes: exact for rows with a large mean,
where sum(x^2) - N mean^2 cancels), out = (x - mean) / sqrt(var + eps) * gamma + beta.
lane_reduce keeps vector_lanes partial sums in one vector register while walking the row.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from tvm import s_tir, te

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

KIND = "layernorm"
PRECISION = "fp32"
SPACE = {
    "rows_per_task": [1, 2, 4, 8, 16, 32],
    "vector_lanes": [4, 8, 16],
    "lane_reduce": [True, False],
    "parallel": [True, False],
}
DEFAULT = {"rows_per_task": 4, "vector_lanes": 16, "lane_reduce": True, "parallel": True}


def dims(task: Task) -> tuple[int, int]:
    shape = task.inputs[0].shape
    return math.prod(shape[:-1]), shape[-1]


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    if tuple(task.inputs[1].shape) != (task.inputs[0].shape[-1],):
        return f"gamma {task.inputs[1]} is not one value per column: this template normalizes the last axis"
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
    eps = float(task.attr("eps", 1e-5))
    x = te.placeholder((rows, n), "float32", name="x")
    gamma = te.placeholder((n,), "float32", name="gamma")
    beta = te.placeholder((n,), "float32", name="beta")
    total = row_reduce(lambda r, j: x[r, j], rows, n, lanes, "sum", "row_sum")

    def centered(r: Any, j: Any) -> Any:
        return x[r, j] - total[r] * (1.0 / n)

    squares = row_reduce(lambda r, j: centered(r, j) * centered(r, j), rows, n, lanes, "sum", "row_sq")
    out = te.compute((rows, n), lambda r, j: centered(r, j) / te.sqrt(squares[r] * (1.0 / n) + eps)
                     * gamma[j] + beta[j], name="out")

    sch = s_tir.Schedule(te.create_prim_func([x, gamma, beta, out]))
    stages = ["row_sum_lanes", "row_sum", "row_sq_lanes", "row_sq"]
    inline_elementwise(sch, keep=[*stages, "out"])
    schedule_rows(sch, config, stages)
    return Kernel(sch.mod, ((rows, n), (n,), (n,), (rows, n)))
