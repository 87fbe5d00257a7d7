"""GEMM with persistent programs: one per SM, each looping over output tiles (GROUP_M order).

Launch overhead and tail effects shrink when there are many small tiles; NUM_SMS must be the
target's SM count (the kernel module cannot see the target at launch, so it is a parameter that
fixed() pins to the target's count and `constraints` checks). Same fused epilogue and exact fp32
products as gemm_tiled.
"""
import math

import triton
import triton.language as tl

# include: gemm_common

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
         "GROUP_M": [1, 8, 16], "NUM_SMS": [132], "num_warps": [4, 8],
         "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "NUM_SMS": 132, "num_warps": 8,
           "num_stages": 3}


def fixed(task, target):
    return _one_program_an_sm(target)


def constraints(task, config, target):
    return (_sms_problem(config, target) or _residual_problem(task)
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target))


@triton.jit
def _gemm_persistent(a_ptr, b_ptr, c_ptr, bias_ptr, res_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                     stride_bn, stride_cm, stride_cn, stride_rm, stride_rn, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                     ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        block_m, block_n = _swizzle(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = block_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc = _dot_tile(acc, a_ptr, b_ptr, rows, cols, M, N, 0, K, stride_am, stride_ak, stride_bk,
                        stride_bn, BLOCK_K, "ieee")
        _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                        stride_rn, ACTIVATION, HAS_BIAS, RESIDUAL)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    tiles = triton.cdiv(p.M, config["BLOCK_M"]) * triton.cdiv(p.N, config["BLOCK_N"])
    _gemm_persistent[(min(tiles, config["NUM_SMS"]),)](
        inputs[0], inputs[1], outputs[0], p.bias, p.residual, p.M, p.N, p.K, *p.stride_a, *p.stride_b,
        *p.stride_c, *p.stride_r, BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
        BLOCK_K=config["BLOCK_K"], GROUP_M=config["GROUP_M"], **p.epilogue,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
