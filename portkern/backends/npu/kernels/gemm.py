"""GEMM with its epilogue (bias, activation, residual), triton-ascend style: one program per cube
core walking a contiguous run of BLOCK_M x BLOCK_N output tiles; each tile's K loop streams A and B
slices through L1 and L0A/L0B while the fp32 accumulator stays in L0C, and L1_PANEL keeps the A
(or B) panel in L1 across the run's tiles that share it (the cube_tiles include below says how).
Bias alone rides the cube's bias table; an activation or residual makes it a cube+vector kernel
whose accumulator crosses to the vector cores through a GM workspace (Atlas A2 has no L0C->UB
path), so its tail axes must be 512-byte aligned. K_SPLIT > 1 takes a panel's tiles through K one
L1-resident slice at a time, their partial sums accumulated in that workspace (the fixpipe's
atomic add), and the vector cores finish each tile in EPILOGUE_ROWS-row chunks; unsplit, STAGING
picks the workspace's dtype (fp32, or the output's). LEAD shapes the start of a run, while the panel
streams in under its first tile (or first two, side by side in L0C): the panel in 2-step loads.
"""
import triton
import triton.language as tl

KIND = "gemm"
PRECISION = "fp32"
# 15,552 configurations: the cost model ranks all of them before a trial (search.strategy's MAX_RANKED
# samples a larger space). Left out, as never the model's best on the BERT/ResNet shapes tried: 128-deep
# BLOCK_K, 1-step L1 loads, K_SPLIT 2, 16- and 128-row epilogue chunks, no buffering at all, and
# PROGRAMS 16 and 20 (made room for LEAD; with 4096 rows every core has tiles, and at 1024 rows fewer
# programs only idle cores).
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64], "L1_STEPS": [2, 4, 8],
         "L1_PANEL": ["none", "a", "b"], "K_SPLIT": [1, 4, 8, 16], "EPILOGUE_ROWS": [32, 64],
         "STAGING": ["float32", "output"], "LEAD": ["whole", "steps2", "pair2"], "PROGRAMS": [24],
         "BUFFERS": [2, 3]}
# valid for fp16/fp32 and every epilogue
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "L1_STEPS": 2, "L1_PANEL": "none", "K_SPLIT": 1,
           "EPILOGUE_ROWS": 64, "STAGING": "float32", "LEAD": "whole", "PROGRAMS": 24, "BUFFERS": 2}

# include: cube_tiles


def _problem(task):
    """(M, N, K, groups): leading batch dims of `a` fold into M."""
    a, b = task.inputs[0], task.inputs[1]
    k = a.shape[-1]
    return a.numel // k, b.shape[0] if task.attr("trans_b", False) else b.shape[1], k, 1


def _misaligned(task, config):
    """Which cut rows start off 512 bytes: A's (and a transposed B's) every `depth` K-columns, B's
    and the output's (residual's, bias's) every BLOCK_N columns, where more than one tile spans the
    row. Tiles of the first column, or of even ones, may start aligned; the busiest program is taken
    to be one that does not."""
    _, n, k, _ = _problem(task)
    size, out_size = ITEMSIZE[task.dtype], ITEMSIZE[task.outputs[0].dtype]
    trans_b, block_n = bool(task.attr("trans_b", False)), config["BLOCK_N"]

    def k_cut(depth):
        return k > depth and (depth * size) % 512 != 0

    def misaligned(operand, depth):
        if operand == "a" or (operand == "b" and trans_b):
            return k_cut(depth)
        return n > block_n and (block_n * (size if operand == "b" else min(size, out_size))) % 512 != 0
    return misaligned


def fixed(task, target):
    """An fp32 output crosses to the vector cores in fp32 whatever STAGING says: one choice."""
    return {"STAGING": STAGING_UNUSED} if task.outputs[0].dtype == "float32" else {}


def schedule(task, config, target):
    _, n, k, _ = _problem(task)
    row_bytes = [k * ITEMSIZE[task.dtype], n * ITEMSIZE[task.outputs[0].dtype]]
    return _cube_schedule(task, config, target, a_dmas=lambda depth: 1,  # one 2-D copy per A slice
                          gm_alignment=min(min(r & -r for r in row_bytes), 512), ub_lanes=config["BLOCK_N"],
                          misaligned=_misaligned(task, config))


def workspace(task, config):
    """(elements, dtype) of the GM workspace a launch needs (the backend allocates it, poisoned, per run)."""
    elements = _tile_grid(task, config)[3] * _workspace_slots(task, config) * config["BLOCK_M"] * config["BLOCK_N"]
    return elements, _staging(task, config)


@triton.jit
def _tile_start(tile, tiles_m, tiles_n, bias_ptr, N, k_lo, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                ALONG_M: tl.constexpr, HAS_BIAS: tl.constexpr):
    """A tile's rows, columns and fresh accumulator (the bias table initialises L0C, first slice only)."""
    tile_m, tile_n = _tile_coords(tile, tiles_m, tiles_n, ALONG_M)
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_BIAS:
        if k_lo == 0:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    return tile_m, rm, rn, acc


@triton.jit
def _k_step_lead(acc, a_slice, a_rows_in, b_slice, b_cols_in, k0, K, stride_bk, K_SLICE: tl.constexpr,
                 LEAD_SLICE: tl.constexpr, PANEL_A: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """_k_step while the panel streams in: one L1 load of the tile's own operand, K_SLICE deep, and the
    panel's part of the slice in LEAD_SLICE-deep loads (each its own DMA; the pieces do not overlap,
    so their sum is the slice)."""
    rk = tl.arange(0, K_SLICE)
    if EVEN_K:
        a_mask = a_rows_in
        b_mask = b_cols_in
    else:
        k_in = k0 + rk < K
        a_mask = a_rows_in & k_in[None, :]
        b_mask = k_in[:, None] & b_cols_in
    if PANEL_A:
        b = tl.load(b_slice + k0 * stride_bk, mask=b_mask, other=0.0)
        a = tl.zeros((a_rows_in.shape[0], K_SLICE), dtype=a_slice.dtype.element_ty)
        for piece in tl.static_range(0, K_SLICE, LEAD_SLICE):
            in_piece = (rk >= piece) & (rk < piece + LEAD_SLICE)
            a += tl.load(a_slice + k0, mask=a_mask & in_piece[None, :], other=0.0)
    else:
        a = tl.load(a_slice + k0, mask=a_mask, other=0.0)
        b = tl.zeros((K_SLICE, b_cols_in.shape[1]), dtype=b_slice.dtype.element_ty)
        for piece in tl.static_range(0, K_SLICE, LEAD_SLICE):
            in_piece = (rk >= piece) & (rk < piece + LEAD_SLICE)
            b += tl.load(b_slice + k0 * stride_bk, mask=in_piece[:, None] & b_mask, other=0.0)
    return tl.dot(a, b, acc, input_precision=DOT_PRECISION)


@triton.jit
def _tile_finish(acc, tile_sum, residual_ptr, out_ptr, tile_m, rm, rn, k_lo, M, N, K, K_DEPTH: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, VECTOR: tl.constexpr, EPILOGUE_ROWS: tl.constexpr,
                 ACTIVATION: tl.constexpr, RESIDUAL: tl.constexpr):
    """The accumulator leaves L0C: to the output, or (FIXPIPE) to the tile's workspace slot, stored by
    the first K slice and accumulated by the others; after the last slice the vector cores finish it."""
    if VECTOR:
        tile_offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        if k_lo == 0:  # FIXPIPE casts to the workspace's dtype (fp32 when K is split)
            tl.store(tile_sum + tile_offsets, acc.to(tile_sum.dtype.element_ty))
        else:
            tl.atomic_add(tile_sum + tile_offsets, acc)
        if k_lo + K_DEPTH >= K:
            _vector_epilogue(tile_sum, residual_ptr, out_ptr, tile_m * BLOCK_M, rn, M, N, BLOCK_M, BLOCK_N,
                             EPILOGUE_ROWS, 1, ACTIVATION, RESIDUAL)
    else:
        tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=(rm < M)[:, None] & (rn < N)[None, :])


@triton.jit
def _gemm_tiles(a_ptr, b_ptr, bias_ptr, residual_ptr, out_ptr, ws_ptr, M, N, K, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_SLICE: tl.constexpr, K_DEPTH: tl.constexpr,
                ALONG_M: tl.constexpr, HAS_LEAD: tl.constexpr, LEAD_TILES: tl.constexpr, LEAD_SLICE: tl.constexpr,
                VECTOR: tl.constexpr, SLOTS: tl.constexpr, EPILOGUE_ROWS: tl.constexpr, ACTIVATION: tl.constexpr,
                HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if ALONG_M:
        line = tiles_m
    else:
        line = tiles_n
    first, last = _run_bounds(tiles_m * tiles_n)
    slots = ws_ptr + tl.program_id(0) * SLOTS * BLOCK_M * BLOCK_N
    for segment in range(first // line, tl.cdiv(last, line)):  # the run's tiles that share one panel
        lo = tl.maximum(first, segment * line)
        hi = tl.minimum(last, segment * line + line)
        start = lo
        if HAS_LEAD:  # a lead other than whole L1 loads (unsplit K: constraints)
            if segment == first // line:  # the run's first tile (two, side by side) while the panel streams in
                m0, rm0, rn0, acc0 = _tile_start(lo, tiles_m, tiles_n, bias_ptr, N, 0, BLOCK_M, BLOCK_N, ALONG_M,
                                                 HAS_BIAS)
                a0, a0_in, b0, b0_in = _tile_operands(a_ptr, b_ptr, rm0, rn0, M, N, K, stride_bk, stride_bn, K_SLICE)
                if LEAD_TILES == 2:  # constraints: the segment holds two tiles
                    m1, rm1, rn1, acc1 = _tile_start(lo + 1, tiles_m, tiles_n, bias_ptr, N, 0, BLOCK_M, BLOCK_N,
                                                     ALONG_M, HAS_BIAS)
                    a1, a1_in, b1, b1_in = _tile_operands(a_ptr, b_ptr, rm1, rn1, M, N, K, stride_bk, stride_bn,
                                                          K_SLICE)
                for k0 in range(0, K, K_SLICE):  # the panel in LEAD_SLICE-deep loads; a pair shares each
                    acc0 = _k_step_lead(acc0, a0, a0_in, b0, b0_in, k0, K, stride_bk, K_SLICE, LEAD_SLICE,
                                        not ALONG_M, EVEN_K, DOT_PRECISION)
                    if LEAD_TILES == 2:
                        acc1 = _k_step_lead(acc1, a1, a1_in, b1, b1_in, k0, K, stride_bk, K_SLICE, LEAD_SLICE,
                                            not ALONG_M, EVEN_K, DOT_PRECISION)
                _tile_finish(acc0, slots, residual_ptr, out_ptr, m0, rm0, rn0, 0, M, N, K, K_DEPTH, BLOCK_M,
                             BLOCK_N, VECTOR, EPILOGUE_ROWS, ACTIVATION, RESIDUAL)
                if LEAD_TILES == 2:
                    _tile_finish(acc1, slots + (1 % SLOTS) * BLOCK_M * BLOCK_N, residual_ptr, out_ptr, m1, rm1,
                                 rn1, 0, M, N, K, K_DEPTH, BLOCK_M, BLOCK_N, VECTOR, EPILOGUE_ROWS, ACTIVATION,
                                 RESIDUAL)
                start = lo + LEAD_TILES
        for k_lo in range(0, K, K_DEPTH):  # one K slice: only this slice of the panel is in L1
            for tile in range(start, hi):
                tile_m, rm, rn, acc = _tile_start(tile, tiles_m, tiles_n, bias_ptr, N, k_lo, BLOCK_M, BLOCK_N,
                                                  ALONG_M, HAS_BIAS)
                a_slice, a_rows_in, b_slice, b_cols_in = _tile_operands(a_ptr, b_ptr, rm, rn, M, N, K, stride_bk,
                                                                        stride_bn, K_SLICE)
                for k0 in range(k_lo, tl.minimum(k_lo + K_DEPTH, K), K_SLICE):  # one L1 load each
                    acc = _k_step(acc, a_slice, a_rows_in, b_slice, b_cols_in, k0, K, stride_bk, K_SLICE, EVEN_K,
                                  DOT_PRECISION)
                _tile_finish(acc, slots + ((tile - lo) % SLOTS) * BLOCK_M * BLOCK_N, residual_ptr, out_ptr, tile_m,
                             rm, rn, k_lo, M, N, K, K_DEPTH, BLOCK_M, BLOCK_N, VECTOR, EPILOGUE_ROWS, ACTIVATION,
                             RESIDUAL)


def launch(task, config, inputs, outputs, workspace_buffer):
    m, n, k, _ = _problem(task)
    programs = _tile_grid(task, config)[3]
    depth, slices = _k_slices(task, config)
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    slots = _workspace_slots(task, config)
    lead_tiles, lead_steps = _lead(config)
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if has_bias else a
    residual = inputs[2 + has_bias] if has_residual else a
    stride_bk, stride_bn = (1, k) if task.attr("trans_b", False) else (n, 1)
    _gemm_tiles[(programs,)](a, b, bias, residual, outputs[0], workspace_buffer if slots else a, m, n, k,
                             stride_bk, stride_bn, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                             K_SLICE=config["BLOCK_K"] * config["L1_STEPS"], K_DEPTH=depth,
                             ALONG_M=config["L1_PANEL"] == "b", HAS_LEAD=config.get("LEAD", "whole") != "whole",
                             LEAD_TILES=lead_tiles,
                             LEAD_SLICE=config["BLOCK_K"] * lead_steps, VECTOR=slots > 0, SLOTS=max(slots, 1),
                             EPILOGUE_ROWS=config["EPILOGUE_ROWS"], ACTIVATION=task.attr("activation", "none"),
                             HAS_BIAS=has_bias, RESIDUAL=_residual_join(task),
                             EVEN_K=k % (config["BLOCK_K"] * config["L1_STEPS"]) == 0,
                             DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
