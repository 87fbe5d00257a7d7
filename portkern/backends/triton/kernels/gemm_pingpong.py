"""GEMM on Hopper with the epilogue under the tensor cores, written in Gluon: CUTLASS's ping-pong.

A GEMM tile's epilogue (bias, activation, residual, the store) runs after its K loop, and in
gemm_tma and gemm_wgmma the tensor cores idle meanwhile: BERT's FFN GEMM 4096x3072x768 with its
GELU took 43 us on an H100 where the same GEMM without it took 35
(results/h100-ops-gemm-epilogue-2026-12-07.log). Here each program is persistent and runs two
consumer warpgroups that own alternate tiles of the program's share: one runs its K loop while the
other finishes the tile before, and a turn (two mbarriers) keeps their K loops from interleaving,
so each tile's products run at full rate. One producer warp fills the ring of A and B tiles by TMA
in the order the consumers take them; setmaxnreg gives the consumers its registers. Each consumer
stages its output tile in shared memory and stores it by TMA while its next K loop runs.

Where it wins (H100, 2026-12-07, results/h100-gemm-pingpong-ab-2026-12-07.log and the
h100-grid-gemm-epilogue-* grids): GEMMs with a GELU or tanh-GELU fused, 128x128x64 in 4 stages
(BERT's FFN GEMM 40 us, 1.46x torch.compile); not plain GEMMs (0.90-1.00x gemm_tma) nor those with a
residual or a SiLU behind a long K, where the epilogue is a small share of the tile's time.

fp16/bf16 into the same type, sm_90 (wgmma, TMA, setmaxnreg), rows of A, B and C 16-byte aligned;
TMA clips every edge. The epilogue is gemm_tiled's, its residual read with the pointers' alignment
restated for the second consumer (_byte_alignment). Gluon kernels cannot run in the Triton
interpreter: without a GPU this variant is cross-compiled, not run.
"""
import math

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

KIND = "gemm"
PRECISION = "fp32"
DOT_PRECISION = "ieee"
NEEDS_GPU = "Gluon kernels cannot run in the Triton interpreter"

# include: gluon_gemm

# include: device_cores

# include: warp_roles

SPACE = {"BLOCK_M": [64, 128], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "GROUP_M": [1, 8, 16],
         "STAGES": [2, 3, 4, 5, 6]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "STAGES": 4}
_ACCUMULATOR_REGISTERS = 128  # per consumer thread: its tile's fp32 accumulator, within _CONSUMER_REGISTERS


def constraints(task, config, target):
    if target.profile.arch != "sm_90":
        return f"wgmma, TMA and setmaxnreg as used here need sm_90, the target is {target.profile.arch}"
    per_thread = config["BLOCK_M"] * config["BLOCK_N"] // _WARPGROUP_THREADS
    if per_thread > _ACCUMULATOR_REGISTERS:
        return (f"a {config['BLOCK_M']}x{config['BLOCK_N']} fp32 accumulator needs {per_thread} registers of each "
                f"consumer thread (> {_ACCUMULATOR_REGISTERS})")
    return _gluon_gemm_problem(task, target, "gemm_pingpong")


def shared_memory(task, config):
    """The ring (STAGES x (A tile + B tile)), each consumer's output staging tile and the mbarriers;
    2-byte elements (constraints)."""
    ring = config["STAGES"] * (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"]
    return 2 * (ring + 2 * config["BLOCK_M"] * config["BLOCK_N"]) + _BARRIER_BYTES


@gluon.jit
def _pingpong_loader(args, GROUP_M: gl.constexpr, B_TRANSPOSED: gl.constexpr):
    """One warp: for each of the program's tiles in turn, its K steps' A and B tiles into the ring,
    a slot refilled once the consumer that read it has released it."""
    descs, bars, buffers, params = args
    a_desc, b_desc, c_desc = descs
    full, empty, turns = bars
    a_smem, b_smem, c_smem = buffers
    M, N, K, tiles = params[0], params[1], params[2], params[3]
    block_m: gl.constexpr = a_desc.block_type.shape[0]
    block_k: gl.constexpr = a_desc.block_type.shape[1]
    block_n: gl.constexpr = c_desc.block_type.shape[1]
    stages: gl.constexpr = a_smem.type.shape[0]
    k_steps = gl.cdiv(K, block_k)
    ring = 0
    for tile in range(gl.program_id(0), tiles, gl.num_programs(0)):
        block_row, block_col = _swizzle(tile, M, N, block_m, block_n, GROUP_M)
        for step in range(k_steps):
            slot = ring % stages
            mbarrier.wait(empty.index(slot), ((ring // stages) & 1) ^ 1)  # a fresh barrier passes phase 1
            mbarrier.expect(full.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            k = step * block_k
            tma.async_copy_global_to_shared(a_desc, [block_row * block_m, k], full.index(slot), a_smem.index(slot))
            if B_TRANSPOSED:
                tma.async_copy_global_to_shared(b_desc, [block_col * block_n, k], full.index(slot), b_smem.index(slot))
            else:
                tma.async_copy_global_to_shared(b_desc, [k, block_col * block_n], full.index(slot), b_smem.index(slot))
            ring += 1


@gluon.jit
def _pingpong_consumer(args, which: gl.constexpr, GROUP_M: gl.constexpr, B_TRANSPOSED: gl.constexpr,
                       ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, RESIDUAL: gl.constexpr,
                       RES_ALIGN: gl.constexpr):
    """One warpgroup: the program's tiles `which`, `which` + 2, ... Each waits for the turn, runs
    its K loop (one wgmma in flight while the next is issued), passes the turn once its last
    product is issued, and runs its epilogue while the other consumer's K loop runs."""
    descs, bars, buffers, params = args
    a_desc, b_desc, c_desc = descs
    full, empty, turns = bars
    a_smem, b_smem, c_smem = buffers
    M, N, K, tiles, bias_ptr, res_ptr, stride_rm, stride_rn = params
    block_m: gl.constexpr = a_desc.block_type.shape[0]
    block_k: gl.constexpr = a_desc.block_type.shape[1]
    block_n: gl.constexpr = c_desc.block_type.shape[1]
    stages: gl.constexpr = a_smem.type.shape[0]
    acc_layout: gl.constexpr = _wgmma_layout(4, 1, block_n)
    my_turn = turns.index(which)
    their_turn = turns.index(1 - which)
    c_tile = c_smem.index(which)
    k_steps = gl.cdiv(K, block_k)
    programs = gl.num_programs(0)
    mine = 0  # this consumer's tiles so far: the turn's phase
    for tile in range(gl.program_id(0) + which * programs, tiles, 2 * programs):
        block_row, block_col = _swizzle(tile, M, N, block_m, block_n, GROUP_M)
        ring = (2 * mine + which) * k_steps  # the program's tiles before this one filled the ring in order
        acc = gl.zeros([block_m, block_n], gl.float32, layout=acc_layout)
        mbarrier.wait(my_turn, mine & 1)
        for step in range(k_steps):
            slot = (ring + step) % stages
            mbarrier.wait(full.index(slot), ((ring + step) // stages) & 1)
            if B_TRANSPOSED:
                b_tile = b_smem.index(slot).permute((1, 0))
            else:
                b_tile = b_smem.index(slot)
            acc = warpgroup_mma(a_smem.index(slot), b_tile, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
            if step > 0:  # the previous step's product is done: its slot can refill
                mbarrier.arrive(empty.index((ring + step - 1) % stages))
        mbarrier.arrive(their_turn)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        mbarrier.arrive(empty.index((ring + k_steps - 1) % stages))
        first_row = block_row * block_m
        first_col = block_col * block_n
        rows = first_row + gl.arange(0, block_m, layout=gl.SliceLayout(1, acc_layout))
        cols = first_col + gl.arange(0, block_n, layout=gl.SliceLayout(0, acc_layout))
        acc = _bias_activation(acc, bias_ptr, cols, N, ACTIVATION, HAS_BIAS)
        if RESIDUAL != "none":  # gemm_tiled's residual join, its pointers' alignment restated (_byte_alignment)
            ptrs = gl.multiple_of(res_ptr + rows[:, None].to(gl.int64) * stride_rm + cols[None, :] * stride_rn,
                                  [RES_ALIGN, RES_ALIGN])
            if RES_ALIGN > 1:  # the residual's rows are contiguous
                ptrs = gl.max_contiguous(ptrs, [1, block_n])
            in_range = (rows[:, None] < M) & (cols[None, :] < N)
            acc = _join(acc, gl.load(ptrs, mask=in_range, other=0.0).to(gl.float32), RESIDUAL)
        tma.store_wait(0)  # the previous tile's store has read the staging tile
        c_tile.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [first_row, first_col], c_tile)
        mine += 1
    tma.store_wait(0)


@gluon.jit
def _gemm_pingpong(a_desc, b_desc, c_desc, bias_ptr, res_ptr, M, N, K, tiles, stride_rm, stride_rn,
                   GROUP_M: gl.constexpr, B_TRANSPOSED: gl.constexpr, STAGES: gl.constexpr,
                   ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, RESIDUAL: gl.constexpr,
                   RES_ALIGN: gl.constexpr):
    """Programs from program_id by num_programs over the tiles (GROUP_M row blocks at a time): two
    consumer warpgroups and a loader warp each (warp specialization)."""
    dtype: gl.constexpr = a_desc.dtype
    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    c_smem = gl.allocate_shared_memory(dtype, [2] + c_desc.block_type.shape, c_desc.layout)
    full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turns.index(i), count=1)
    mbarrier.arrive(turns.index(0))  # consumer 0 goes first

    args = ((a_desc, b_desc, c_desc), (full, empty, turns), (a_smem, b_smem, c_smem),
            (M, N, K, tiles, bias_ptr, res_ptr, stride_rm, stride_rn))
    gl.warp_specialize([(_pingpong_consumer, (args, 0, GROUP_M, B_TRANSPOSED, ACTIVATION, HAS_BIAS, RESIDUAL,
                                              RES_ALIGN)),
                        (_pingpong_consumer, (args, 1, GROUP_M, B_TRANSPOSED, ACTIVATION, HAS_BIAS, RESIDUAL,
                                              RES_ALIGN)),
                        (_pingpong_loader, (args, GROUP_M, B_TRANSPOSED))], [4, 1],
                       [_CONSUMER_REGISTERS, _LOADER_REGISTERS])


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    a, b, out = inputs[0], inputs[1], outputs[0]
    block_m, block_n, block_k, dtype = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], task.dtype
    b_shape, b_block = _b_tiling(task, p, block_n, block_k)
    b_desc = _descriptor(b, b_shape, _stored_b_strides(task, p), b_block, dtype)
    a_desc = _descriptor(a, [p.M, p.K], p.stride_a, [block_m, block_k], dtype)
    c_desc = _descriptor(out, [p.M, p.N], p.stride_c, [block_m, block_n], dtype)
    tiles = triton.cdiv(p.M, block_m) * triton.cdiv(p.N, block_n)
    stride_rm, stride_rn = p.stride_r
    res_align = (_byte_alignment(p.residual.data_ptr(), stride_rm * p.residual.element_size())
                 if p.epilogue["RESIDUAL"] != "none" and stride_rn == 1 else 1)
    _gemm_pingpong[(min(tiles, _core_count(out, tiles)),)](
        a_desc, b_desc, c_desc, p.bias, p.residual, p.M, p.N, p.K, tiles, stride_rm, stride_rn,
        GROUP_M=config["GROUP_M"], B_TRANSPOSED=bool(task.attr("trans_b", False)), STAGES=config["STAGES"],
        **p.epilogue, RES_ALIGN=res_align, num_warps=4, maxnreg=_MAX_REGISTERS)
