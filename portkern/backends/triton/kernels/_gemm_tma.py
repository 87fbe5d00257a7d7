# --- included from _gemm_tma.py: the TMA GEMM over tile descriptors, persistent programs (its module sets
# DOT_PRECISION) ---
# include: gemm_common

# include: tma

SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
         "GROUP_M": [1, 8, 16], "NUM_SMS": [132], "FLATTEN": [False, True],
         "TMA_STORE": [False, True], "HALF_TAIL": [False, True], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132, "FLATTEN": True,
           "TMA_STORE": False, "HALF_TAIL": False, "num_warps": 8, "num_stages": 3}


def fixed(task, target):
    """One program an SM, and no TMA store where the output's rows are not aligned for one."""
    store = {} if _store_problem(task, {"TMA_STORE": True}) is None else {"TMA_STORE": False}
    return {**_one_program_an_sm(target), **store}


def _tma_config_problem(task, config, target):
    """Why this config cannot run the TMA GEMM on operands TMA can read, or None."""
    return (_sms_problem(config, target) or _store_problem(task, config) or _residual_problem(task)
            or (config["HALF_TAIL"] and _half_tail_problem(task, config))
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target,
                                    _accumulator_limit()))


_SPLITS = {}  # (M, N, BLOCK_M, BLOCK_N, NUM_SMS) -> split: launch() asks on every run


def _half_tail_split(M, N, config):
    """The first row of the half-height tiles: rows [0, split) run BLOCK_M-high tiles, the rest
    BLOCK_M/2-high ones, both dealt round-robin to NUM_SMS programs in one list (full tiles
    first). Wave quantization: 4096 x 768 in 128 x 128 tiles is 192 tiles, two rounds on 132 SMs
    for 60 of them; 132 full tiles and 120 half ones finish in 1.5. The split minimises the
    heaviest program's share (a half tile counting half a full one) over the last two rounds'
    rows, keeping the most full tiles among equal shares; M when no split lowers it."""
    block_m, programs = config["BLOCK_M"], config["NUM_SMS"]
    key = (M, N, block_m, config["BLOCK_N"], programs)
    if key not in _SPLITS:
        _SPLITS[key] = _least_loaded_split(M, N, block_m, config["BLOCK_N"], programs)
    return _SPLITS[key]


def _least_loaded_split(M, N, block_m, block_n, programs):
    blocks_m, blocks_n = -(-M // block_m), -(-N // block_n)
    best_load, best_split = None, M
    for full_rows in range(blocks_m, max(-1, blocks_m - 1 - 2 * -(-programs // blocks_n)), -1):
        split = min(M, full_rows * block_m)
        load = _heaviest_share(full_rows * blocks_n, -(-(M - split) // (block_m // 2)) * blocks_n, programs)
        if best_load is None or load < best_load:
            best_load, best_split = load, split
    return best_split


def _heaviest_share(full, half, programs):
    """The largest share, in full tiles, that a program gets when `full` full tiles then `half`
    half tiles are dealt round-robin to `programs` programs: the first full % programs programs
    get one full tile more, and the half tiles' extra round starts where the full ones stopped."""
    extra_full, extra_half = full % programs, half % programs
    extra = 0.5 if extra_half else 0.0
    if extra_full:  # their extra half tile comes only if the half tiles' last round wraps around to them
        extra = max(extra, 1.0 + (0.5 if extra_half > programs - extra_full else 0.0))
    return full // programs + 0.5 * (half // programs) + extra


def _half_tail_problem(task, config):
    """Half tiles need 64 rows for a warpgroup's MMA; a shape no split evens out would only repeat
    the full-tile config."""
    if config["BLOCK_M"] < 128:
        return "HALF_TAIL needs BLOCK_M >= 128 (half tiles of at least 64 rows)"
    M, N, _ = _gemm_dims(task)
    split = _half_tail_split(M, N, config)
    if split >= M or split == 0:  # all full tiles, or all half ones: another config's tiling
        return f"HALF_TAIL: no split of {M} rows evens out the tiles on {config['NUM_SMS']} programs"
    return None


def shared_memory(task, config):
    """num_stages x (A tile + B tile) for the TMA ring (one more A and B tile for tf32x3's split
    operands), plus the output tile a TMA store stages."""
    stages = config["num_stages"] + (1 if DOT_PRECISION == "tf32x3" else 0)
    ring = stages * (config["BLOCK_M"] + config["BLOCK_N"]) * config["BLOCK_K"] * _item_bytes(task)
    out_tile = config["BLOCK_M"] * config["BLOCK_N"] * _dtype_bytes(task.outputs[0].dtype)
    return ring + (out_tile if config["TMA_STORE"] else 0)


def _store_problem(task, config):
    """A TMA store needs the output's rows 16-byte aligned."""
    out = task.outputs[0]
    if config["TMA_STORE"] and not _row_aligned(out.shape[-1], out.dtype):
        return f"TMA_STORE: output rows of {out.shape[-1]} {out.dtype} are not {_ROW_BYTES}-byte aligned"
    return None


@triton.jit
def _gemm_tma(a_desc, b_desc, c_desc, a_half_desc, c_half_desc, c_ptr, bias_ptr, res_ptr, M, N, K, M_SPLIT,
              stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_TRANSPOSED: tl.constexpr, FLATTEN: tl.constexpr,
              TMA_STORE: tl.constexpr, HALF_TAIL: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
              RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Rows [0, M_SPLIT) in BLOCK_M-high tiles; with HALF_TAIL the rest in BLOCK_M/2-high tiles
    (their own A and output descriptors), continuing the same round-robin deal."""
    programs = tl.num_programs(0)
    full_tiles = tl.cdiv(M_SPLIT, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    _tma_tiles(a_desc, b_desc, c_desc, c_ptr, bias_ptr, res_ptr, 0, M_SPLIT, M, N, K, tl.program_id(0), full_tiles,
               stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, B_TRANSPOSED,
               FLATTEN, TMA_STORE, ACTIVATION, HAS_BIAS, RESIDUAL, DOT_PRECISION)
    if HALF_TAIL:
        half_tiles = tl.cdiv(M - M_SPLIT, BLOCK_M // 2) * tl.cdiv(N, BLOCK_N)
        first = (tl.program_id(0) + programs - full_tiles % programs) % programs
        _tma_tiles(a_half_desc, b_desc, c_half_desc, c_ptr, bias_ptr, res_ptr, M_SPLIT, M - M_SPLIT, M, N, K, first,
                   half_tiles, stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M // 2, BLOCK_N, BLOCK_K, GROUP_M,
                   B_TRANSPOSED, FLATTEN, TMA_STORE, ACTIVATION, HAS_BIAS, RESIDUAL, DOT_PRECISION)


@triton.jit
def _tma_tiles(a_desc, b_desc, c_desc, c_ptr, bias_ptr, res_ptr, row_offset, rows_here, M, N, K, first_tile, tiles,
               stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, B_TRANSPOSED: tl.constexpr, FLATTEN: tl.constexpr,
               TMA_STORE: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
               RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """This program's tiles (first_tile, then every num_programs-th) of rows [row_offset,
    row_offset + rows_here); M bounds the epilogue's masks."""
    for tile in tl.range(first_tile, tiles, tl.num_programs(0), flatten=FLATTEN):
        block_m, block_n = _swizzle(tile, rows_here, N, BLOCK_M, BLOCK_N, GROUP_M)
        first_row = row_offset + block_m * BLOCK_M
        first_col = block_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = a_desc.load([first_row, k])
            if B_TRANSPOSED:
                b = b_desc.load([first_col, k]).T
            else:
                b = b_desc.load([k, first_col])
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        rows = first_row + tl.arange(0, BLOCK_M)
        cols = first_col + tl.arange(0, BLOCK_N)
        if TMA_STORE:  # asynchronous, clipped at the edges by the descriptor: no masks
            acc = _epilogue(acc, bias_ptr, res_ptr, rows, cols, M, N, stride_rm, stride_rn, ACTIVATION, HAS_BIAS,
                            RESIDUAL)
            c_desc.store([first_row, first_col], acc.to(c_ptr.dtype.element_ty))
        else:
            _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                            stride_rn, ACTIVATION, HAS_BIAS, RESIDUAL)


def _launch_tma(task, config, p, a, a_strides, b, b_strides, out):
    """The GEMM of problem p reading A (M x K) and B (N x K when trans_b, else K x N) with these
    (row, column) strides as stored: p's own operands, or aligned copies of them. The descriptors
    carry p's logical sizes, so TMA zero-fills past every edge and never reads a copy's padding."""
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    b_transposed = bool(task.attr("trans_b", False))
    a_desc, c_desc = _row_descriptors(config, p, a, a_strides, out, block_m)
    b_desc = _b_descriptor(task, p, b, b_strides, block_n, block_k)
    split = _half_tail_split(p.M, p.N, config) if config["HALF_TAIL"] else p.M
    # the half tiles' descriptors exist only where the kernel reads them
    a_half, c_half = _row_descriptors(config, p, a, a_strides, out, block_m // 2) if config["HALF_TAIL"] else (
        a_desc, c_desc)
    tiles = (triton.cdiv(split, block_m) + triton.cdiv(p.M - split, block_m // 2)) * triton.cdiv(p.N, block_n)
    _gemm_tma[(min(tiles, config["NUM_SMS"]),)](
        a_desc, b_desc, c_desc, a_half, c_half, out, p.bias, p.residual, p.M, p.N, p.K, split, *p.stride_c,
        *p.stride_r, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["GROUP_M"],
        B_TRANSPOSED=b_transposed, FLATTEN=config["FLATTEN"], TMA_STORE=config["TMA_STORE"],
        HALF_TAIL=config["HALF_TAIL"], **p.epilogue, DOT_PRECISION=DOT_PRECISION, num_warps=config["num_warps"],
        num_stages=config["num_stages"])


def _row_descriptors(config, p, a, a_strides, out, block_m):
    """A's descriptor for block_m-high tiles, and the output's where the kernel stores through
    one (it is built, and checked, only then; A's stands in otherwise)."""
    a_desc = TensorDescriptor(a, [p.M, p.K], list(a_strides), [block_m, config["BLOCK_K"]])
    if not config["TMA_STORE"]:
        return a_desc, a_desc
    return a_desc, TensorDescriptor(out, [p.M, p.N], list(p.stride_c), [block_m, config["BLOCK_N"]])
