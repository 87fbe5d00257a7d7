"""Global average pooling (NCHW) on the CPU: one row reduction per (n, c) plane.

Each H*W plane is a row; lane_reduce keeps vector_lanes partial sums in one vector register while
walking it, rows_per_task planes go to a thread at a time.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from tvm import s_tir, te

from ...hwprofile import Target
from ...tasks import Task
from .common import Kernel, check_float32, check_row_lanes, check_space, row_reduce

KIND = "pool"
PRECISION = "fp32"
SPACE = {
    "rows_per_task": [1, 4, 16, 64],
    "vector_lanes": [4, 8, 16],
    "lane_reduce": [True, False],
    "parallel": [True, False],
}
DEFAULT = {"rows_per_task": 16, "vector_lanes": 16, "lane_reduce": True, "parallel": True}


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    if task.attr("op") != "global_avg":
        return f"pool op {task.attr('op')} is not global_avg (windowed pools: tvm_pool)"
    return (check_float32(task) or check_space(config, SPACE)
            or check_row_lanes(config, math.prod(task.inputs[0].shape[2:]), target, "plane size"))


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    n, c, h, w = task.inputs[0].shape
    rows, plane = n * c, h * w
    lanes = config["vector_lanes"] if config["lane_reduce"] else 1
    x = te.placeholder((rows, plane), "float32", name="x")
    total = row_reduce(lambda r, j: x[r, j], rows, plane, lanes, "sum", "plane_sum")
    out = te.compute((rows, 1), lambda r, _: total[r] * (1.0 / plane), name="out")

    sch = s_tir.Schedule(te.create_prim_func([x, out]))
    block = sch.get_sblock("out")
    row_block, row = sch.split(sch.get_loops(block)[0], [None, config["rows_per_task"]])
    if config["parallel"]:
        sch.parallel(row_block)
    for name in ("plane_sum", "plane_sum_lanes")[: 2 if lanes > 1 else 1]:
        sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
    if lanes > 1:
        lane, step = sch.get_loops(sch.get_sblock("plane_sum_lanes"))[-2:]
        sch.reorder(step, lane)
        sch.vectorize(lane)
    return Kernel(sch.mod, ((rows, plane), (rows, 1)))
