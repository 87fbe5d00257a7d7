"""GEMM on CUDA GPUs: block tiles of block_m x block_n outputs, each thread a thread_m x thread_n
register tile, K walked in block_k steps, the epilogue fused into the store.

The computation is the CPU template's (../gemm.py: out = act(a @ b + bias) + residual), without
its padding: a block or K step that runs past M, N or K is cut short by a predicate, so nothing
is read past the operands and the shared tiles stay block-sized. The accumulator tile lives in
registers ("local"); with stage_shared, each K step first copies the block's a and b tiles into
shared memory, all threads taking a share of vector_width consecutive floats each, so a value
read from global memory serves block_n (or block_m) threads instead of one. unroll_k unrolls the
inner K loop by that factor; the register tile loops are always unrolled (a register array
indexed by a loop counter would live in local memory).
"""
from __future__ import annotations

from typing import Any, Mapping

from tvm import s_tir

from ....hwprofile import Target
from ....tasks import Task
from .. import gemm
from ..common import Kernel, check_float32, check_space, inline_elementwise, own_loops
from .common import (
    REGISTER_OVERHEAD,
    GpuFacts,
    ThreadAxes,
    check_registers,
    check_shared,
    check_threads,
    check_vector,
    shared_array,
    stage_in_shared,
)

KIND = "gemm"
PRECISION = "fp32"
SPACE = {
    "block_m": [16, 32, 64, 128],
    "block_n": [16, 32, 64, 128],
    "block_k": [8, 16, 32],
    "thread_m": [1, 2, 4, 8],
    "thread_n": [1, 2, 4, 8],
    "stage_shared": [True, False],
    "vector_width": [1, 2, 4],
    "unroll_k": [1, 4, 8],
}
DEFAULT = {"block_m": 64, "block_n": 64, "block_k": 16, "thread_m": 4, "thread_n": 4,
           "stage_shared": True, "vector_width": 4, "unroll_k": 4}


def thread_grid(config: Mapping[str, Any]) -> tuple[int, int]:
    """(threadIdx.y, threadIdx.x) extents: one thread per register tile of the block tile."""
    return config["block_m"] // config["thread_m"], config["block_n"] // config["thread_n"]


def threads(config: Mapping[str, Any]) -> int:
    rows, cols = thread_grid(config)
    return rows * cols


def shared_bytes(config: Mapping[str, Any]) -> int:
    """The a and b tiles of one K step, when staged."""
    if not config["stage_shared"]:
        return 0
    return shared_array(config["block_m"] * config["block_k"]) + shared_array(config["block_k"] * config["block_n"])


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    if task.attr("residual") and task.inputs[-1].shape != task.outputs[0].shape:
        return f"residual {task.inputs[-1]} broadcasts; this template adds a full {task.outputs[0]}"
    facts = GpuFacts.of(target)
    _, n, k = gemm.dims(task)
    block_m, block_n, block_k = config["block_m"], config["block_n"], config["block_k"]
    if config["thread_m"] > block_m or config["thread_n"] > block_n:
        return "a thread's register tile is larger than the block tile"
    reason = check_threads(threads(config), facts)
    if reason:
        return reason
    if block_k % config["unroll_k"]:
        return f"unroll_k={config['unroll_k']} does not divide block_k={block_k}"
    tile = config["thread_m"] * config["thread_n"]
    reason = check_registers(tile + config["thread_m"] + config["thread_n"] + REGISTER_OVERHEAD, threads(config),
                             facts)
    if reason:
        return reason
    vector = config["vector_width"]
    if not config["stage_shared"]:
        return "vector_width applies to the shared-memory copies: use 1 without stage_shared" if vector > 1 else None
    b_row = ("K", k) if task.attr("trans_b") else ("N", n)
    reason = check_vector(vector, {"block_k": block_k, "K (a's rows)": k, f"{b_row[0]} (b's rows)": b_row[1]})
    return reason or check_shared(shared_bytes(config), facts)


def schedule(task: Task, config: Mapping[str, Any], target: Target, on_device: bool = True) -> Kernel:
    block_k = config["block_k"]
    computed = gemm.computation(task, 1, 1)  # no padding: predicates cut the edge blocks short
    sch = s_tir.Schedule(computed.prim_func())
    axes = ThreadAxes(sch, on_device)
    inline_elementwise(sch, keep=("acc", "out"))
    acc = sch.get_sblock("acc")
    i, j, k = sch.get_loops(acc)
    rows, cols = thread_grid(config)
    block_i, thread_i, tile_i = sch.split(i, [None, rows, config["thread_m"]])
    block_j, thread_j, tile_j = sch.split(j, [None, cols, config["thread_n"]])
    k_step, k_inner, k_unrolled = sch.split(k, [None, block_k // config["unroll_k"], config["unroll_k"]])
    sch.reorder(block_i, block_j, thread_i, thread_j, k_step, k_inner, k_unrolled, tile_i, tile_j)
    axes.bind(block_i, "blockIdx.y")
    axes.bind(block_j, "blockIdx.x")
    axes.bind(thread_i, "threadIdx.y")
    axes.bind(thread_j, "threadIdx.x")
    for loop in (k_unrolled, tile_i, tile_j):
        sch.unroll(loop)
    sch.set_scope(acc, 0, "local")
    out = sch.get_sblock("out")
    sch.reverse_compute_at(out, thread_j, preserve_unit_loops=True)
    for loop in own_loops(sch, out):
        sch.unroll(loop)
    if config["stage_shared"]:
        for operand in ("a", "b"):
            stage_in_shared(sch, axes, acc, operand, k_step, (rows, cols), config["vector_width"])
    sch.decompose_reduction(acc, k_step)
    return Kernel(sch.mod, computed.arg_shapes)
