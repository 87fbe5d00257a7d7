# --- included from _gemm_tiled.py: the tiled GEMM (its module sets DOT_PRECISION) ---
# include: gemm_common

SPACE = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
         "GROUP_M": [1, 4, 8, 16], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3}


def constraints(task, config, target):
    return (_dot_precision_problem(task, target) or _residual_problem(task)
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target,
                                    _accumulator_limit()))


@triton.jit
def _gemm_tiled(a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                stride_bn, stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr,
                DOT_PRECISION: tl.constexpr):
    block_m, block_n = _swizzle(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _dot_tile(acc, a_ptr, b_ptr, rows, cols, M, N, 0, K, stride_am, stride_ak, stride_bk, stride_bn,
                    BLOCK_K, DOT_PRECISION)
    _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                    stride_rn, ACTIVATION, HAS_BIAS, RESIDUAL)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    tiles = triton.cdiv(p.M, config["BLOCK_M"]) * triton.cdiv(p.N, config["BLOCK_N"])
    _gemm_tiled[(tiles,)](inputs[0], inputs[1], outputs[0], p.bias, p.residual, p.M, p.N, p.K,
                          *p.stride_a, *p.stride_b, *p.stride_c, *p.stride_r,
                          BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=config["BLOCK_K"],
                          GROUP_M=config["GROUP_M"], DOT_PRECISION=DOT_PRECISION, **p.epilogue,
                          num_warps=config["num_warps"], num_stages=config["num_stages"])
