# --- included from _gemm_tma.py: the TMA GEMM over tile descriptors, persistent programs (its module sets
# DOT_PRECISION) ---
# include: gemm_common

# include: tma

SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128], "WIDE": [False, True],
         "GROUP_M": [1, 8, 16], "NUM_SMS": [58, 108, 132, 304], "FLATTEN": [False, True],
         "TMA_STORE": [False, True], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "WIDE": False, "GROUP_M": 8, "NUM_SMS": 132,
           "FLATTEN": True, "TMA_STORE": False, "num_warps": 8, "num_stages": 3}


def _tile_n(config):
    """Columns of C a tile covers: BLOCK_N, or with WIDE another BLOCK_N / 2 beside it.

    Triton's blocks are powers of two, and tiles of 2^k columns quantize some N badly onto the
    SMs (N = 768: 128-wide tiles make 1.45 waves on 132 SMs, 256-wide 0.73); WIDE gives 192-wide
    tiles (4 per row block) from a 128- and a 64-column accumulator that share each A tile."""
    return config["BLOCK_N"] * 3 // 2 if config["WIDE"] else config["BLOCK_N"]


def _sms_problem(config, target):
    if config["NUM_SMS"] != target.profile.cores:
        return f"NUM_SMS={config['NUM_SMS']} is not the target's SM count ({target.profile.cores})"
    return None


def _tma_config_problem(task, config, target):
    """Why this config cannot run the TMA GEMM on operands TMA can read, or None."""
    return (_sms_problem(config, target) or _store_problem(task, config) or _residual_problem(task)
            or _accumulator_problem(config["BLOCK_M"], _tile_n(config), config["num_warps"], target))


def shared_memory(task, config):
    """num_stages x (A tile + B tile) for the TMA ring (one more A and B tile for tf32x3's split
    operands), plus the output tile a TMA store stages."""
    tile_n = _tile_n(config)
    stages = config["num_stages"] + (1 if DOT_PRECISION == "tf32x3" else 0)
    ring = stages * (config["BLOCK_M"] + tile_n) * config["BLOCK_K"] * _item_bytes(task)
    out_tile = config["BLOCK_M"] * tile_n * _dtype_bytes(task.outputs[0].dtype)
    return ring + (out_tile if config["TMA_STORE"] else 0)


def _store_problem(task, config):
    """A TMA store needs the output's rows 16-byte aligned."""
    out = task.outputs[0]
    if config["TMA_STORE"] and not _row_aligned(out.shape[-1], out.dtype):
        return f"TMA_STORE: output rows of {out.shape[-1]} {out.dtype} are not {_ROW_BYTES}-byte aligned"
    return None


@triton.jit
def _gemm_tma(a_desc, b_desc, b_tail_desc, c_desc, c_tail_desc, c_ptr, bias_ptr, res_ptr, M, N, K, stride_cm,
              stride_cn, stride_rm, stride_rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              WIDE: tl.constexpr, GROUP_M: tl.constexpr, B_TRANSPOSED: tl.constexpr, FLATTEN: tl.constexpr,
              TMA_STORE: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    TAIL_N: tl.constexpr = BLOCK_N // 2
    TILE_N: tl.constexpr = BLOCK_N + TAIL_N if WIDE else BLOCK_N
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, TILE_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
        block_m, block_n = _swizzle(tile, M, N, BLOCK_M, TILE_N, GROUP_M)
        first_row = block_m * BLOCK_M
        first_col = block_n * TILE_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        tail = tl.zeros((BLOCK_M, TAIL_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = a_desc.load([first_row, k])
            acc = tl.dot(a, _b_tile(b_desc, first_col, k, B_TRANSPOSED), acc, input_precision=DOT_PRECISION)
            if WIDE:  # the same A tile against the next BLOCK_N / 2 columns
                tail = tl.dot(a, _b_tile(b_tail_desc, first_col + BLOCK_N, k, B_TRANSPOSED), tail,
                              input_precision=DOT_PRECISION)
        _store_tile(acc, c_desc, c_ptr, bias_ptr, res_ptr, first_row, first_col, M, N, stride_cm, stride_cn,
                    stride_rm, stride_rn, BLOCK_M, BLOCK_N, TMA_STORE, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)
        if WIDE:
            _store_tile(tail, c_tail_desc, c_ptr, bias_ptr, res_ptr, first_row, first_col + BLOCK_N, M, N,
                        stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M, TAIL_N, TMA_STORE, ACTIVATION,
                        HAS_BIAS, HAS_RESIDUAL)


@triton.jit
def _b_tile(b_desc, first_col, k, B_TRANSPOSED: tl.constexpr):
    """B's BLOCK_K x (descriptor width) tile at (k, first_col), whichever way B is stored."""
    if B_TRANSPOSED:
        tile = b_desc.load([first_col, k]).T
    else:
        tile = b_desc.load([k, first_col])
    return tile


@triton.jit
def _store_tile(acc, c_desc, c_ptr, bias_ptr, res_ptr, first_row, first_col, M, N, stride_cm, stride_cn,
                stride_rm, stride_rn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA_STORE: tl.constexpr,
                ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """The epilogue of a BLOCK_M x BLOCK_N accumulator at (first_row, first_col), stored."""
    rows = first_row + tl.arange(0, BLOCK_M)
    cols = first_col + tl.arange(0, BLOCK_N)
    if TMA_STORE:  # asynchronous, clipped at the edges by the descriptor: no masks
        acc = _epilogue(acc, bias_ptr, res_ptr, rows, cols, M, N, stride_rm, stride_rn, ACTIVATION, HAS_BIAS,
                        HAS_RESIDUAL)
        c_desc.store([first_row, first_col], acc.to(c_ptr.dtype.element_ty))
    else:
        _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                        stride_rn, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


def _launch_tma(task, config, p, a, a_strides, b, b_strides, out):
    """The GEMM of problem p reading A (M x K) and B (N x K when trans_b, else K x N) with these
    (row, column) strides as stored: p's own operands, or aligned copies of them. The descriptors
    carry p's logical sizes, so TMA zero-fills past every edge and never reads a copy's padding."""
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    wide = bool(config["WIDE"])
    b_transposed = bool(task.attr("trans_b", False))
    a_desc = TensorDescriptor(a, [p.M, p.K], list(a_strides), [block_m, block_k])
    b_desc = _b_descriptor(task, p, b, b_strides, block_n, block_k)
    # descriptors a config does not read (the tail's without WIDE, the output's without TMA_STORE)
    # are not built: a_desc stands in for them
    b_tail_desc = _b_descriptor(task, p, b, b_strides, block_n // 2, block_k) if wide else a_desc
    c_desc, c_tail_desc = a_desc, a_desc
    if config["TMA_STORE"]:
        c_desc = TensorDescriptor(out, [p.M, p.N], list(p.stride_c), [block_m, block_n])
        if wide:
            c_tail_desc = TensorDescriptor(out, [p.M, p.N], list(p.stride_c), [block_m, block_n // 2])
    tiles = triton.cdiv(p.M, block_m) * triton.cdiv(p.N, _tile_n(config))
    _gemm_tma[(min(tiles, config["NUM_SMS"]),)](
        a_desc, b_desc, b_tail_desc, c_desc, c_tail_desc, out, p.bias, p.residual, p.M, p.N, p.K, *p.stride_c,
        *p.stride_r, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, WIDE=wide, GROUP_M=config["GROUP_M"],
        B_TRANSPOSED=b_transposed, FLATTEN=config["FLATTEN"], TMA_STORE=config["TMA_STORE"], **p.epilogue,
        DOT_PRECISION=DOT_PRECISION, num_warps=config["num_warps"], num_stages=config["num_stages"])
