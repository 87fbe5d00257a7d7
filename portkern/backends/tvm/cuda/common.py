"""What the CUDA schedule templates share: the GPU limits they are checked against, thread binding,
the row-kernel schedule.

A CUDA template module follows the CPU templates' contract (KIND, PRECISION, SPACE, DEFAULT,
constraints(task, config, target)), says how many threads a configuration launches per block
(threads(config)), and schedules the CPU family's computation of its kind (one TE definition per
kind, ../gemm.py etc.) with

    schedule(task, config, target, on_device=True) -> Kernel

on_device=False applies the very same schedule but leaves every thread-axis loop serial: the
kernel then builds with LLVM and runs on a CPU, one "thread" after another. That is how the
schedule's arithmetic (index maps, edge predicates, staging copies, the epilogue) is checked where
there is no GPU; it cannot show races, missing barriers or codegen faults.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from tvm import s_tir

from ....hwprofile import Target
from ....tasks import Task
from ..common import Kernel, check_float32, check_space, inline_elementwise, own_loops

# A kernel's static __shared__ arrays may total 48 KiB (CUDA C Programming Guide, "Shared Memory");
# a profile's larger opt-in figure needs dynamic shared memory, which these schedules do not use.
STATIC_SHARED_BYTES = 48 * 1024
# registers a thread needs beyond its accumulators and operand fragments (indices, pointers,
# loop counters): an estimate; ptxas's real count is recorded with every artifact built with nvcc
REGISTER_OVERHEAD = 24
FLOAT_BYTES = 4
SHARED_ALIGNMENT = 64  # TVM's CUDA codegen aligns every __shared__ array to 64 bytes


@dataclass(frozen=True)
class GpuFacts:
    """The limits of a CUDA hwprofile that decide whether a configuration can launch at all."""

    warp: int
    max_threads: int
    shared_bytes: int  # per block, as these schedules declare it (static)
    profile_shared_bytes: int
    registers_per_thread: int
    registers_per_block: int  # a block must fit on one SM

    @classmethod
    def of(cls, target: Target) -> GpuFacts:
        profile = target.profile
        shared = int(profile.limit("shared_mem_per_block"))
        return cls(
            warp=profile.warp_size,
            max_threads=int(profile.limit("max_threads_per_block")),
            shared_bytes=min(shared, STATIC_SHARED_BYTES),
            profile_shared_bytes=shared,
            registers_per_thread=int(profile.limit("registers_per_thread")),
            registers_per_block=int(profile.limit("registers_per_sm")),
        )


def check_threads(threads: int, facts: GpuFacts) -> str | None:
    if threads > facts.max_threads:
        return f"{threads} threads per block exceed the target's {facts.max_threads}"
    if threads % facts.warp:
        return f"{threads} threads per block are not whole {facts.warp}-thread warps"
    return None


def shared_array(floats: int) -> int:
    """Bytes one __shared__ array of `floats` floats takes, alignment included."""
    return -(-floats * FLOAT_BYTES // SHARED_ALIGNMENT) * SHARED_ALIGNMENT


def check_shared(nbytes: int, facts: GpuFacts) -> str | None:
    if nbytes > facts.shared_bytes:
        return (f"{nbytes} bytes of shared memory per block exceed the {facts.shared_bytes} a kernel can "
                f"declare statically (target: {facts.profile_shared_bytes} opt-in; CUDA: "
                f"{STATIC_SHARED_BYTES} static)")
    return None


def check_registers(per_thread: int, threads: int, facts: GpuFacts) -> str | None:
    """`per_thread` is an estimate (REGISTER_OVERHEAD plus the tile a thread keeps)."""
    if per_thread > facts.registers_per_thread:
        return f"about {per_thread} registers per thread exceed the target's {facts.registers_per_thread}"
    if per_thread * threads > facts.registers_per_block:
        return (f"about {per_thread} registers x {threads} threads exceed the {facts.registers_per_block} "
                f"registers of one SM: ptxas would spill to fit the block")
    return None


def check_vector(width: int, extents: Mapping[str, int]) -> str | None:
    """A vector of `width` floats must not cross the end of any of these contiguous runs (so
    every vector access starts `width`-aligned)."""
    for what, extent in extents.items():
        if extent % width:
            return f"vector_width={width} does not divide {what} ({extent})"
    return None


class ThreadAxes:
    """Binds loops to CUDA thread axes, or (the CPU twin) leaves them serial."""

    def __init__(self, sch: s_tir.Schedule, on_device: bool) -> None:
        self.sch = sch
        self.on_device = on_device

    def bind(self, loop: Any, axis: str) -> None:
        if self.on_device:
            self.sch.bind(loop, axis)


def stage_in_shared(sch: s_tir.Schedule, axes: ThreadAxes, block: Any, buffer: str, at: Any,
                    thread_counts: Sequence[int], vector: int) -> None:
    """Copy what `block` reads of `buffer` in one iteration of loop `at` into shared memory,
    every thread of the block taking its share (`vector` consecutive floats at a time)."""
    cache = sch.cache_read(block, buffer, "shared")
    sch.compute_at(cache, at, preserve_unit_loops=True)
    copy = sch.fuse(*own_loops(sch, cache))
    _, *thread_loops, lanes = sch.split(copy, [None, *thread_counts, vector])
    for loop, axis in zip(thread_loops, ("threadIdx.y", "threadIdx.x")[-len(thread_loops):]):
        axes.bind(loop, axis)
    sch.vectorize(lanes)


# the row kernels (softmax, layernorm, rmsnorm) share one space: the same schedule_rows tunes them
ROW_SPACE = {
    "threads_per_row": [32, 64, 128, 256, 512, 1024],
    "rows_per_block": [1, 2, 4, 8],
    "vector_width": [1, 2, 4],
    "cache_row": [True, False],
}
ROW_DEFAULT = {"threads_per_row": 128, "rows_per_block": 1, "vector_width": 4, "cache_row": True}


def schedule_rows(sch: s_tir.Schedule, axes: ThreadAxes, config: Mapping[str, Any],
                  stages: Sequence[str]) -> None:
    """Row kernels: rows_per_block rows per block (threadIdx.y), threads_per_row threads along a
    row (threadIdx.x). Each reduction stage is computed under its row, its column loop split
    across the row's threads (a cross-thread reduction); the output stores vector_width
    consecutive floats per thread and step. cache_row first copies the block's rows of x into
    shared memory, so x is read from global memory once instead of once per pass."""
    per_row, vector = config["threads_per_row"], config["vector_width"]
    out = sch.get_sblock("out")
    rows, cols = sch.get_loops(out)
    block_rows, row = sch.split(rows, [None, config["rows_per_block"]])
    axes.bind(block_rows, "blockIdx.x")
    axes.bind(row, "threadIdx.y")
    _, column_thread, lanes = sch.split(cols, [None, per_row, vector])
    axes.bind(column_thread, "threadIdx.x")
    sch.vectorize(lanes)
    present = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}
    kept = [name for name in stages if name in present]
    for name in reversed(kept):
        sch.compute_at(sch.get_sblock(name), row, preserve_unit_loops=True)
    for name in kept:
        block = sch.get_sblock(name)
        # local: the cross-thread reduction leaves the row's value in every thread of the row
        # (a warp shuffle broadcast, or a shared result behind a barrier): nothing to wait for
        sch.set_scope(block, 0, "local")
        axes.bind(sch.split(sch.get_loops(block)[-1], [None, per_row])[1], "threadIdx.x")
    if config["cache_row"]:
        first = sch.get_sblock(kept[0])
        cache = sch.cache_read(first, "x", "shared")
        sch.compute_at(cache, row, preserve_unit_loops=True)
        cache_row, cache_column = sch.get_loops(cache)[-2:]
        axes.bind(cache_row, "threadIdx.y")
        _, copy_thread, copy_lanes = sch.split(cache_column, [None, per_row, vector])
        axes.bind(copy_thread, "threadIdx.x")
        sch.vectorize(copy_lanes)


def row_threads(config: Mapping[str, Any]) -> int:
    """ThreadAxes per block of a row kernel."""
    return config["threads_per_row"] * config["rows_per_block"]


def row_shared_bytes(config: Mapping[str, Any], n: int, reductions: int, facts: GpuFacts) -> int:
    """The cached rows, and per reduction what TVM's cross-warp reduction stages in shared memory
    when a row spans several warps: one partial per warp of the block, one result per row."""
    cached = shared_array(config["rows_per_block"] * n) if config["cache_row"] else 0
    if config["threads_per_row"] <= facts.warp:
        return cached
    warps = row_threads(config) // facts.warp
    return cached + reductions * (shared_array(warps) + shared_array(config["rows_per_block"]))


def check_rows(config: Mapping[str, Any], rows: int, n: int, reductions: int, facts: GpuFacts) -> str | None:
    """The row-kernel configuration fits the task's (rows, N) view and the target."""
    reason = check_threads(row_threads(config), facts)
    if reason:
        return reason
    if rows % config["rows_per_block"]:
        return f"rows_per_block={config['rows_per_block']} does not divide the {rows} rows"
    return (check_vector(config["vector_width"], {"the row length": n})
            or check_shared(row_shared_bytes(config, n, reductions, facts), facts))


def row_template(computation: Callable[..., Any], dims: Callable[[Task], tuple[int, int]], keep: Sequence[str],
                 reductions: int, check_task: Callable[[Task], str | None] = lambda task: None,
                 ) -> tuple[Callable[..., str | None], Callable[..., Kernel]]:
    """constraints and schedule of a row kernel: the kind's TE computation (lanes=1 reductions),
    its elementwise stages inlined but for `keep`, scheduled by schedule_rows."""

    def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
        reason = check_float32(task) or check_space(config, ROW_SPACE) or check_task(task)
        return reason or check_rows(config, *dims(task), reductions, GpuFacts.of(target))

    def schedule(task: Task, config: Mapping[str, Any], target: Target, on_device: bool = True) -> Kernel:
        computed = computation(task, lanes=1)
        sch = s_tir.Schedule(computed.prim_func())
        inline_elementwise(sch, keep=tuple(keep))
        schedule_rows(sch, ThreadAxes(sch, on_device), config, computed.stages)
        return Kernel(sch.mod, computed.arg_shapes)
    return constraints, schedule
