# --- included from _gemm_tma.py: the TMA GEMM over tile descriptors, persistent programs (its module sets
# DOT_PRECISION) ---
# include: gemm_common

# include: tma

SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
         "GROUP_M": [1, 8, 16], "NUM_SMS": [58, 108, 132, 304], "FLATTEN": [False, True],
         "TMA_STORE": [False, True], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132, "FLATTEN": True,
           "TMA_STORE": False, "num_warps": 8, "num_stages": 3}


def _tma_config_problem(task, config, target):
    """Why this config cannot run the TMA GEMM on operands TMA can read, or None."""
    return (_sms_problem(config, target) or _store_problem(task, config) or _residual_problem(task)
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target))


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
def _gemm_tma(a_desc, b_desc, c_desc, c_ptr, bias_ptr, res_ptr, M, N, K, stride_cm, stride_cn, stride_rm, stride_rn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
              B_TRANSPOSED: tl.constexpr, FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr, ACTIVATION: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, tl.num_programs(0), flatten=FLATTEN):
        block_m, block_n = _swizzle(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        first_row = block_m * BLOCK_M
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
    b_transposed = bool(task.attr("trans_b", False))
    a_desc = TensorDescriptor(a, [p.M, p.K], list(a_strides), [block_m, block_k])
    b_desc = _b_descriptor(task, p, b, b_strides, block_n, block_k)
    # the output's descriptor is built (and checked) only where the kernel stores through it
    c_desc = TensorDescriptor(out, [p.M, p.N], list(p.stride_c), [block_m, block_n]) if config["TMA_STORE"] else a_desc
    tiles = triton.cdiv(p.M, block_m) * triton.cdiv(p.N, block_n)
    _gemm_tma[(min(tiles, config["NUM_SMS"]),)](
        a_desc, b_desc, c_desc, out, p.bias, p.residual, p.M, p.N, p.K, *p.stride_c, *p.stride_r,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["GROUP_M"],
        B_TRANSPOSED=b_transposed, FLATTEN=config["FLATTEN"], TMA_STORE=config["TMA_STORE"], **p.epilogue,
        DOT_PRECISION=DOT_PRECISION, num_warps=config["num_warps"], num_stages=config["num_stages"])
