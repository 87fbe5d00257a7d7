"""GEMM in 192-row tiles on Hopper, written in Gluon: asynchronous wgmma with explicit waits.

cuBLAS runs a 4096 x 768 output in 192 x 128 tiles, 22 x 6 = 132 tiles: one per SM of an H100 or
H200, every SM busy for one round. Triton's tiles are powers of two (128 x 256: 96 tiles, 36 SMs
idle; 64 x 128: 384 tiles of lower intensity), and a Triton loop with two products waits on each
wgmma on its own. Gluon issues wgmma asynchronously and waits where the kernel says, so a 192-row
tile is a 128-row and a 64-row product per K step, in flight together, on one B tile from a TMA
ring (BLOCK_M=128 is the same kernel with one product). On an H100 the one-warpgroup 192 x 128
tile matched cuBLAS at 4096x768x3072 where gemm_tma reached 0.84x
(benchmarks/results/h100-gluon-gemm-probe-2026-12-06.log).

One tile per program (no persistence), GROUP_M row blocks at a time; TMA loads and stores clip at
every edge; the epilogue (bias, activation, residual) is gemm_tiled's. fp16/bf16 only (fp32 has
gemm_tma_tf32x3), sm_90 or newer, rows of A, B and C 16-byte aligned. Gluon kernels cannot run in
the Triton interpreter: without a GPU this variant is cross-compiled, not run.
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

SPACE = {"BLOCK_M": [128, 192], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "GROUP_M": [1, 8],
         "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 192, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
_HEAD_ROWS = 128  # the first product's rows; a 192-row tile adds a 64-row one (one warpgroup's height)
_ACCUMULATOR_REGISTERS = 192  # per thread: 192 x 128 in one warpgroup keeps its K loop free of spills on sm_90


def constraints(task, config, target):
    threads = config["num_warps"] * target.profile.warp_size
    if config["BLOCK_M"] * config["BLOCK_N"] > _ACCUMULATOR_REGISTERS * threads:
        return (f"a {config['BLOCK_M']}x{config['BLOCK_N']} fp32 accumulator over {threads} threads needs > "
                f"{_ACCUMULATOR_REGISTERS} registers each")
    return _gluon_gemm_problem(task, target, "gemm_wgmma")


def shared_memory(task, config):
    """The TMA ring (num_stages x (A tile + B tile)); the output's staging tile reuses it after the
    loop, so it counts only where it is larger. 2-byte elements: constraints() refuses the rest."""
    ring = config["num_stages"] * (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"]
    return max(ring, _HEAD_ROWS * config["BLOCK_N"]) * 2


@gluon.jit
def _load_step(a_desc, tail_desc, b_desc, a_smem, tail_smem, b_smem, bars, step, n_steps, first_row, first_col,
               TAIL: gl.constexpr, B_TRANSPOSED: gl.constexpr, STAGES: gl.constexpr):
    """Start the TMA copies of K step `step` into its ring slot (nothing past the last step)."""
    slot = step % STAGES
    bar = bars.index(slot)
    pred = step < n_steps
    k = step * a_desc.block_type.shape[1]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    if TAIL > 0:
        mbarrier.expect(bar, nbytes + tail_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(tail_desc, [first_row + a_desc.block_type.shape[0], k], bar,
                                        tail_smem.index(slot), pred=pred)
    else:
        mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [first_row, k], bar, a_smem.index(slot), pred=pred)
    if B_TRANSPOSED:
        tma.async_copy_global_to_shared(b_desc, [first_col, k], bar, b_smem.index(slot), pred=pred)
    else:
        tma.async_copy_global_to_shared(b_desc, [k, first_col], bar, b_smem.index(slot), pred=pred)


@gluon.jit
def _finish_tile(c_desc, acc, bias_ptr, res_ptr, first_row, first_col, M, N, stride_rm, stride_rn,
                 ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, RESIDUAL: gl.constexpr):
    """The epilogue on the accumulator's own layout, then registers -> shared -> global by TMA."""
    rows = first_row + gl.arange(0, acc.shape[0], layout=gl.SliceLayout(1, acc.type.layout))
    cols = first_col + gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, acc.type.layout))
    acc = _epilogue(acc, bias_ptr, res_ptr, rows, cols, M, N, stride_rm, stride_rn, ACTIVATION, HAS_BIAS,
                    RESIDUAL)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    c_smem.store(acc.to(c_desc.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(c_desc, [first_row, first_col], c_smem)


@gluon.jit
def _gemm_wgmma(a_desc, tail_desc, b_desc, c_desc, c_tail_desc, bias_ptr, res_ptr, M, N, K, stride_rm, stride_rn,
                TAIL: gl.constexpr, GROUP_M: gl.constexpr, B_TRANSPOSED: gl.constexpr, STAGES: gl.constexpr,
                ACTIVATION: gl.constexpr, HAS_BIAS: gl.constexpr, RESIDUAL: gl.constexpr):
    """One (128 + TAIL) x BLOCK_N tile of C per program."""
    num_warps: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = a_desc.dtype
    head: gl.constexpr = a_desc.block_type.shape[0]
    block_k: gl.constexpr = a_desc.block_type.shape[1]
    block_n: gl.constexpr = c_desc.block_type.shape[1]
    acc_layout: gl.constexpr = _wgmma_layout(num_warps, 1, block_n)
    # 64 rows are one warpgroup's height: with two warpgroups each takes half of the columns
    tail_layout: gl.constexpr = _wgmma_layout(4, num_warps // 4, block_n // (num_warps // 4))

    block_m, block_col = _swizzle(gl.program_id(0), M, N, head + TAIL, block_n, GROUP_M)
    first_row = block_m * (head + TAIL)
    first_col = block_col * block_n
    n_steps = gl.cdiv(K, block_k)

    a_smem = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_smem = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
    tail_smem = a_smem  # stands in where there is no tail: never read
    if TAIL > 0:
        tail_smem = gl.allocate_shared_memory(dtype, [STAGES] + tail_desc.block_type.shape, tail_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    for i in gl.static_range(STAGES - 1):
        _load_step(a_desc, tail_desc, b_desc, a_smem, tail_smem, b_smem, bars, i, n_steps, first_row, first_col,
                   TAIL, B_TRANSPOSED, STAGES)

    acc = gl.zeros([head, block_n], gl.float32, layout=acc_layout)
    tail_acc = gl.zeros([64, block_n], gl.float32, layout=tail_layout)
    for step in range(n_steps):
        slot = step % STAGES
        mbarrier.wait(bars.index(slot), (step // STAGES) & 1)
        if B_TRANSPOSED:
            b_tile = b_smem.index(slot).permute((1, 0))
        else:
            b_tile = b_smem.index(slot)
        acc = warpgroup_mma(a_smem.index(slot), b_tile, acc, is_async=True)
        if TAIL > 0:
            tail_acc = warpgroup_mma(tail_smem.index(slot), b_tile, tail_acc, is_async=True)
            # this step's two products stay in flight; the previous step's are done, so its slot refills
            acc, tail_acc = warpgroup_mma_wait(num_outstanding=2, deps=(acc, tail_acc))
        else:
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, ))
        _load_step(a_desc, tail_desc, b_desc, a_smem, tail_smem, b_smem, bars, step + STAGES - 1, n_steps,
                   first_row, first_col, TAIL, B_TRANSPOSED, STAGES)
    if TAIL > 0:
        acc, tail_acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, tail_acc))
    else:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(i))

    _finish_tile(c_desc, acc, bias_ptr, res_ptr, first_row, first_col, M, N, stride_rm, stride_rn, ACTIVATION,
                 HAS_BIAS, RESIDUAL)
    if TAIL > 0:
        # the compiler gives both staging tiles the same shared address (it does not see the
        # asynchronous store still reading the first): wait until that store has read it
        tma.store_wait(0)
        _finish_tile(c_tail_desc, tail_acc, bias_ptr, res_ptr, first_row + head, first_col, M, N, stride_rm,
                     stride_rn, ACTIVATION, HAS_BIAS, RESIDUAL)
    tma.store_wait(0)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    a, b, out = inputs[0], inputs[1], outputs[0]
    block_n, block_k, dtype = config["BLOCK_N"], config["BLOCK_K"], task.dtype
    tail = config["BLOCK_M"] - _HEAD_ROWS
    b_shape, b_block = _b_tiling(task, p, block_n, block_k)
    b_desc = _descriptor(b, b_shape, _stored_b_strides(task, p), b_block, dtype)
    a_desc = _descriptor(a, [p.M, p.K], p.stride_a, [_HEAD_ROWS, block_k], dtype)
    c_desc = _descriptor(out, [p.M, p.N], p.stride_c, [_HEAD_ROWS, block_n], dtype)
    # the 64-row part's descriptors exist only where the kernel reads them
    tail_desc, c_tail_desc = ((_descriptor(a, [p.M, p.K], p.stride_a, [tail, block_k], dtype),
                               _descriptor(out, [p.M, p.N], p.stride_c, [tail, block_n], dtype))
                              if tail else (a_desc, c_desc))
    grid = (triton.cdiv(p.M, config["BLOCK_M"]) * triton.cdiv(p.N, block_n),)
    _gemm_wgmma[grid](a_desc, tail_desc, b_desc, c_desc, c_tail_desc, p.bias, p.residual, p.M, p.N, p.K, *p.stride_r,
                      TAIL=tail, GROUP_M=config["GROUP_M"], B_TRANSPOSED=bool(task.attr("trans_b", False)),
                      STAGES=config["num_stages"], **p.epilogue, num_warps=config["num_warps"])
