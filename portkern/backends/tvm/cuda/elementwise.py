"""Elementwise chains on CUDA GPUs: the whole expression in one pass over the output, each thread
handling vector_width consecutive elements at a time, items_per_thread times.

The computation is ../elementwise.py's. The flat output is cut into vectors first (whole, since
vector_width divides the output's size), then vectors into blocks of items_per_thread x threads:
consecutive threads take consecutive vectors, so every access of a warp is one contiguous run
(coalesced); the tail block's out-of-range vectors are skipped. Each step's vector is kept in
registers ("local") under its thread, so a step reads its operands once, however often its math
uses them.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from tvm import s_tir

from ....hwprofile import Target
from ....tasks import Task
from .. import elementwise
from ..common import Kernel, check_space, inline_elementwise, own_loops
from .common import GpuFacts, ThreadAxes, check_threads, check_vector

KIND = "elementwise"
PRECISION = "fp32"
SPACE = {
    "threads": [64, 128, 256, 512, 1024],
    "vector_width": [1, 2, 4],
    "items_per_thread": [1, 2, 4, 8],
}
DEFAULT = {"threads": 256, "vector_width": 4, "items_per_thread": 1}


def threads(config: Mapping[str, Any]) -> int:
    return config["threads"]


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = elementwise.check_expression(task) or check_space(config, SPACE)
    if reason:
        return reason
    size = math.prod(task.outputs[0].shape)
    return (check_threads(threads(config), GpuFacts.of(target))
            or check_vector(config["vector_width"], {"the output's size": size}))


def schedule(task: Task, config: Mapping[str, Any], target: Target, on_device: bool = True) -> Kernel:
    computed = elementwise.computation(task)
    sch = s_tir.Schedule(computed.prim_func())
    axes = ThreadAxes(sch, on_device)
    inline_elementwise(sch, keep=("out", *computed.stages))
    out = sch.get_sblock("out")
    vectors, lanes = sch.split(sch.fuse(*sch.get_loops(out)), [None, config["vector_width"]])
    block, item, thread = sch.split(vectors, [None, config["items_per_thread"], config["threads"]])
    axes.bind(block, "blockIdx.x")
    axes.bind(thread, "threadIdx.x")
    sch.unroll(item)
    sch.vectorize(lanes)
    for name in reversed(computed.stages):
        step = sch.get_sblock(name)
        sch.compute_at(step, thread, preserve_unit_loops=True)
        sch.set_scope(step, 0, "local")
        sch.vectorize(sch.fuse(*own_loops(sch, step)))
    return Kernel(sch.mod, computed.arg_shapes)
