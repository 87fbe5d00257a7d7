"""GEMM with its epilogue (bias, activation, residual), triton-ascend style: one program per cube
core walking a contiguous run of BLOCK_M x BLOCK_N output tiles; each tile's K loop streams A and B
slices through L1 and L0A/L0B while the fp32 accumulator stays in L0C, and L1_PANEL keeps the A
(or B) panel in L1 across the run's tiles that share it (the cube_tiles include below says how).
Bias alone rides the cube's bias table; an activation or residual makes it a cube+vector kernel
whose accumulator crosses to the vector cores through a GM workspace (Atlas A2 has no L0C->UB
path), so its tail axes must be 512-byte aligned.
"""
import triton
import triton.language as tl

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "L1_STEPS": [1, 2, 4],
         "L1_PANEL": ["none", "a", "b"], "PROGRAMS": [16, 20, 24], "BUFFERS": [1, 2, 3]}
# valid for fp16/fp32 and every epilogue
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "L1_STEPS": 1, "L1_PANEL": "none", "PROGRAMS": 24,
           "BUFFERS": 2}

# include: cube_tiles


def _problem(task):
    """(M, N, K, groups): leading batch dims of `a` fold into M."""
    a, b = task.inputs[0], task.inputs[1]
    k = a.shape[-1]
    return a.numel // k, b.shape[0] if task.attr("trans_b", False) else b.shape[1], k, 1


def schedule(task, config, target):
    _, n, k, _ = _problem(task)
    row_bytes = [k * ITEMSIZE[task.dtype], n * ITEMSIZE[task.outputs[0].dtype]]
    return _cube_schedule(task, config, a_dmas=lambda depth: 1,  # one 2-D copy per A slice
                          gm_alignment=min(min(r & -r for r in row_bytes), 512), ub_lanes=config["BLOCK_N"])


@triton.jit
def _gemm_tiles(a_ptr, b_ptr, bias_ptr, residual_ptr, out_ptr, M, N, K, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_SLICE: tl.constexpr, ALONG_M: tl.constexpr,
                ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    first, last = _run_bounds(tiles_m * tiles_n)
    for tile in range(first, last):
        tile_m, tile_n = _tile_coords(tile, tiles_m, tiles_n, ALONG_M)
        rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, K_SLICE):  # one L1 slice; the cube takes it BLOCK_K columns at a time
            rk = k0 + tl.arange(0, K_SLICE)
            a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm < M)[:, None] & (rk < K)[None, :], other=0.0)
            b = tl.load(b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
                        mask=(rk < K)[:, None] & (rn < N)[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        acc = _activate(acc, ACTIVATION)
        inside = (rm < M)[:, None] & (rn < N)[None, :]
        out_offsets = rm[:, None] * N + rn[None, :]
        if HAS_RESIDUAL:
            acc += tl.load(residual_ptr + out_offsets, mask=inside, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_offsets, acc.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    m, n, k, _ = _problem(task)
    programs = _tile_grid(task, config)[3]
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if has_bias else a
    residual = inputs[2 + has_bias] if has_residual else a
    stride_bk, stride_bn = (1, k) if task.attr("trans_b", False) else (n, 1)
    _gemm_tiles[(programs,)](a, b, bias, residual, outputs[0], m, n, k, stride_bk, stride_bn,
                             BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                             K_SLICE=config["BLOCK_K"] * config["L1_STEPS"], ALONG_M=config["L1_PANEL"] == "b",
                             ACTIVATION=task.attr("activation", "none"), HAS_BIAS=has_bias,
                             HAS_RESIDUAL=has_residual, DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
