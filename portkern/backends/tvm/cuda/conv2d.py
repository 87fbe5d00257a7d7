"""Direct NCHW convolution on CUDA GPUs: a block computes block_oc output channels x block_w output
columns of one output row, each thread a thread_oc x thread_w register tile, the channel
reduction walked in block_c steps; the epilogue is fused into the store.

The computation is the CPU template's (../conv2d.py: act(conv + bias + residual)) without its
tile padding: a block that runs past the output channels or columns, or a channel step past the
channels, is cut short by a predicate; the zero-padded input frame is read through a bounds test
instead of a copy. stage picks what each channel step copies into shared memory first:
"weights" (block_oc x block_c x KH x KW), "both" also the input window the block's outputs read
(block_c channels x the window's rows x its columns), "none" reads global memory directly.
unroll_window unrolls the KH x KW window loops.
"""
from __future__ import annotations

from typing import Any, Mapping

from tvm import s_tir

from ....hwprofile import Target
from ....tasks import Task
from .. import conv2d
from ..common import Kernel, check_float32, check_space, inline_elementwise, own_loops
from .common import (
    REGISTER_OVERHEAD,
    GpuFacts,
    ThreadAxes,
    check_registers,
    check_shared,
    check_threads,
    shared_array,
    stage_in_shared,
)

KIND = "conv2d"
PRECISION = "fp32"
SPACE = {
    "block_oc": [8, 16, 32, 64],
    "block_w": [8, 16, 32, 64],
    "thread_oc": [1, 2, 4, 8],
    "thread_w": [1, 2, 4],
    "block_c": [1, 2, 4, 8, 16, 32],
    "stage": ["none", "weights", "both"],
    "unroll_window": [True, False],
}
DEFAULT = {"block_oc": 32, "block_w": 32, "thread_oc": 4, "thread_w": 2, "block_c": 8, "stage": "both",
           "unroll_window": True}


def thread_grid(config: Mapping[str, Any]) -> tuple[int, int]:
    """(threadIdx.y, threadIdx.x) extents: output channels, output columns."""
    return config["block_oc"] // config["thread_oc"], config["block_w"] // config["thread_w"]


def threads(config: Mapping[str, Any]) -> int:
    rows, cols = thread_grid(config)
    return rows * cols


def shared_bytes(task: Task, config: Mapping[str, Any]) -> int:
    """What one channel step stages: the weights tile and, for "both", the input window."""
    _, _, kh, kw = task.inputs[1].shape
    sh, sw = task.attr("strides", (1, 1))
    dh, dw = task.attr("dilations", (1, 1))
    weights = shared_array(config["block_oc"] * config["block_c"] * kh * kw)
    window = shared_array(config["block_c"] * ((kh - 1) * dh + 1) * ((config["block_w"] - 1) * sw + (kw - 1) * dw + 1))
    return {"none": 0, "weights": weights, "both": weights + window}[config["stage"]]


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    if task.attr("residual") and task.inputs[-1].shape != task.outputs[0].shape:
        return f"residual {task.inputs[-1]} broadcasts; this template adds a full {task.outputs[0]}"
    facts = GpuFacts.of(target)
    if config["thread_oc"] > config["block_oc"] or config["thread_w"] > config["block_w"]:
        return "a thread's register tile is larger than the block tile"
    reason = check_threads(threads(config), facts)
    if reason:
        return reason
    tile = config["thread_oc"] * config["thread_w"]
    reason = check_registers(tile + config["thread_oc"] + config["thread_w"] + REGISTER_OVERHEAD, threads(config),
                             facts)
    if reason:
        return reason
    group_c = task.inputs[1].shape[1]
    if group_c % config["block_c"]:
        return f"block_c={config['block_c']} does not divide the {group_c} channels per group"
    if config["stage"] == "both" and int(task.attr("group", 1)) > 1:
        return "stage=both needs group=1: a grouped block's input channels depend on its output channel"
    out_w = task.outputs[0].shape[3]
    if config["block_w"] > 2 * out_w:
        return f"block_w={config['block_w']} is over twice the output row ({out_w}): mostly padding"
    return check_shared(shared_bytes(task, config), facts)


def schedule(task: Task, config: Mapping[str, Any], target: Target, on_device: bool = True) -> Kernel:
    # no tile padding: predicates cut the edge blocks short
    computed = conv2d.computation(task, conv2d.task_geometry(task), 1, 1, pack_w=False)
    sch = s_tir.Schedule(computed.prim_func())
    axes = ThreadAxes(sch, on_device)
    inline_elementwise(sch, keep=("acc", "out"))
    acc = sch.get_sblock("acc")
    n, oc, i, j, c, ki, kj = sch.get_loops(acc)
    rows, cols = thread_grid(config)
    block_oc, thread_oc, tile_oc = sch.split(oc, [None, rows, config["thread_oc"]])
    block_w, thread_w, tile_w = sch.split(j, [None, cols, config["thread_w"]])
    c_step, c_inner = sch.split(c, [None, config["block_c"]])
    sch.reorder(n, i, block_w, block_oc, thread_oc, thread_w, c_step, c_inner, ki, kj, tile_oc, tile_w)
    axes.bind(sch.fuse(n, i, block_w), "blockIdx.x")
    axes.bind(block_oc, "blockIdx.y")
    axes.bind(thread_oc, "threadIdx.y")
    axes.bind(thread_w, "threadIdx.x")
    for loop in (tile_oc, tile_w, *((ki, kj) if config["unroll_window"] else ())):
        sch.unroll(loop)
    sch.set_scope(acc, 0, "local")
    out = sch.get_sblock("out")
    sch.reverse_compute_at(out, thread_w, preserve_unit_loops=True)
    for loop in own_loops(sch, out):
        sch.unroll(loop)
    staged = {"none": (), "weights": ("w",), "both": ("w", "x")}[config["stage"]]
    for operand in staged:
        stage_in_shared(sch, axes, acc, operand, c_step, (rows, cols), 1)
    sch.decompose_reduction(acc, c_step)
    return Kernel(sch.mod, computed.arg_shapes)
