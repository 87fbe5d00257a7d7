"""GEMM on the CPU: a register-tiled, vectorized, parallel matmul with a fused epilogue.

out = act(a @ b + bias) + residual, with a (..., K) viewed as an (M, K) matrix and b (K, N), or
(N, K) when trans_b. Each thread walks `row_tiles` register tiles of tile_m x tile_n outputs that
share one panel of b; a tile's accumulator lives in vector registers across the whole K loop and
the epilogue runs on it before it is stored. With pack_b, b is first copied (in the kernel, every
call) into [N/tile_n, K, tile_n] panels: contiguous vector loads for any b layout, and N padded to
whole tiles. M is padded by clamping row indices, so no tile needs a boundary test in its K loop.
computation() is the GEMM's one TE definition; cuda/gemm.py schedules it for GPUs.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

import tvm
from tvm import s_tir, te

from ...hwprofile import Target
from ...tasks import Task, residual_join
from .common import (
    Computation,
    HostFacts,
    Kernel,
    ceil_to,
    check_float32,
    check_registers,
    check_space,
    check_vector,
    clamp,
    epilogue,
    inline_elementwise,
    schedule_epilogue,
)

KIND = "gemm"
PRECISION = "fp32"
SPACE = {
    "tile_m": [1, 2, 4, 6, 8, 12, 16],
    "tile_n": [8, 16, 32, 48, 64],
    "vector_lanes": [4, 8, 16],
    "row_tiles": [1, 2, 4, 8],
    "unroll_k": [1, 2, 4, 8],
    "pack_b": [True, False],
    "order": ["mn", "nm"],
    "parallel": [True, False],
}
DEFAULT = {"tile_m": 6, "tile_n": 64, "vector_lanes": 16, "row_tiles": 4, "unroll_k": 2,
           "pack_b": True, "order": "mn", "parallel": True}


def dims(task: Task) -> tuple[int, int, int]:
    """(M, N, K) of the task: every leading axis of a is a row."""
    a_shape = task.inputs[0].shape
    n = task.outputs[0].shape[-1]
    return math.prod(a_shape[:-1]), n, a_shape[-1]


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    reason = check_float32(task) or check_space(config, SPACE)
    if reason:
        return reason
    facts = HostFacts.of(target)
    _, n, k = dims(task)
    tile_m, tile_n, lanes = config["tile_m"], config["tile_n"], config["vector_lanes"]
    reason = (check_vector(lanes, tile_n, facts, "tile_n")
              or check_registers(tile_m, tile_n, lanes, facts))
    if reason:
        return reason
    if task.attr("residual") and task.inputs[-1].shape != task.outputs[0].shape:
        return f"residual {task.inputs[-1]} broadcasts; this template adds a full {task.outputs[0]}"
    if k % config["unroll_k"]:
        return f"unroll_k={config['unroll_k']} does not divide K={k}"
    if not config["pack_b"]:
        if task.attr("trans_b"):
            return "pack_b=False with trans_b would gather b along N: pack it"
        if n % tile_n:
            return f"pack_b=False needs N={n} divisible by tile_n={tile_n} (packing pads N)"
    panel = k * tile_n * 4
    if panel > facts.l2_bytes:
        return f"a b panel of K x tile_n ({panel} bytes) does not fit L2 ({facts.l2_bytes} bytes)"
    return None


def computation(task: Task, tile_m: int, tile_n: int, b_panels: bool = False) -> Computation:
    """out = act(a @ b + bias) + residual over (M, N) padded to whole tile_m x tile_n tiles ("acc").

    Padded rows of a and columns of b read a real row / column (clamped) and land in the padding
    of acc, which the (M, N) "out" stage never reads. b_panels packs b into [N/tile_n, K, tile_n]
    panels ("b_packed"): contiguous tile_n-wide rows for any b layout, N padded with zeros.
    """
    m, n, k = dims(task)
    padded_m, padded_n = ceil_to(m, tile_m), ceil_to(n, tile_n)
    trans_b = bool(task.attr("trans_b"))

    a = te.placeholder((m, k), "float32", name="a")
    b = te.placeholder(task.inputs[1].shape, "float32", name="b")
    inputs = [a, b]
    bias = te.placeholder((n,), "float32", name="bias") if task.attr("bias") else None
    residual = te.placeholder((m, n), "float32", name="residual") if task.attr("residual") else None
    inputs += [t for t in (bias, residual) if t is not None]

    def b_at(kk: Any, j: Any) -> Any:
        return b[j, kk] if trans_b else b[kk, j]

    if b_panels:
        def pack(jo: Any, kk: Any, ji: Any) -> Any:
            j = jo * tile_n + ji
            if padded_n == n:
                return b_at(kk, j)
            return te.if_then_else(j < n, b_at(kk, clamp(j, n)), tvm.tirx.const(0.0, "float32"))

        packed = te.compute((padded_n // tile_n, k, tile_n), pack, name="b_packed")

        def b_read(kk: Any, j: Any) -> Any:
            return packed[j // tile_n, kk, j % tile_n]
    else:
        b_read = b_at

    r = te.reduce_axis((0, k), name="k")
    acc = te.compute((padded_m, padded_n), lambda i, j: te.sum(a[clamp(i, m), r] * b_read(r, j), axis=r),
                     name="acc")
    out = epilogue(acc, (m, n), task.attr("activation", "none"),
                   (lambda i, j: bias[j]) if bias is not None else None, residual, residual_first=False,
                   residual_op=residual_join(task))
    shapes = [(m, k), tuple(task.inputs[1].shape)] + [(n,)] * (bias is not None) + [(m, n)] * (residual is not None)
    return Computation((*inputs, out), (*shapes, (m, n)))


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    tile_m, tile_n, lanes = config["tile_m"], config["tile_n"], config["vector_lanes"]
    computed = computation(task, tile_m, tile_n, b_panels=config["pack_b"])

    sch = s_tir.Schedule(computed.prim_func())
    inline_elementwise(sch, keep=("acc", "out", "b_packed"))
    block = sch.get_sblock("acc")
    i, j, kk = sch.get_loops(block)
    i_tile, i_reg = sch.split(i, [None, tile_m])
    j_tile, j_reg = sch.split(j, [None, tile_n])
    j_unrolled, j_vector = sch.split(j_reg, [None, lanes])
    i_task, i_walk = sch.split(i_tile, [None, config["row_tiles"]])
    k_outer, k_unrolled = sch.split(kk, [None, config["unroll_k"]])
    outer = (i_task, j_tile) if config["order"] == "mn" else (j_tile, i_task)
    sch.reorder(*outer, i_walk, k_outer, k_unrolled, i_reg, j_unrolled, j_vector)
    sch.vectorize(j_vector)
    for loop in (j_unrolled, i_reg, k_unrolled):
        sch.unroll(loop)
    fused = sch.fuse(*outer)
    if config["parallel"]:
        sch.parallel(fused)
    schedule_epilogue(sch, i_walk, lanes)
    sch.decompose_reduction(block, k_outer)

    if config["pack_b"]:
        panel, _, within = sch.get_loops(sch.get_sblock("b_packed"))
        if config["parallel"]:
            sch.parallel(panel)
        sch.vectorize(sch.split(within, [None, lanes])[1])

    return Kernel(sch.mod, computed.arg_shapes)
