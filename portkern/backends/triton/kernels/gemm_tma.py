"""GEMM fed by the Hopper tensor memory accelerator (TMA): persistent programs, tile descriptors.

TMA copies whole tiles into shared memory asynchronously and masks the edges in hardware, so the
main loop carries no address arithmetic and no masks, and wgmma reads its operands from shared
memory: the pipeline depth (num_stages) and the tile shape are what is left to tune. FLATTEN lets
Triton's pipeliner run one tile's loads under the previous tile's epilogue. Needs sm_90 or newer,
rows of A and B contiguous and 16-byte aligned (K, and N for an untransposed B, multiples of 8 for
16-bit data); the epilogue (bias, activation, residual) is gemm_tiled's.
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# include: gemm_common

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64, 128],
         "GROUP_M": [1, 8, 16], "NUM_SMS": [58, 108, 132, 304], "FLATTEN": [False, True],
         "num_warps": [4, 8], "num_stages": [2, 3, 4, 5]}
DEFAULT = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "NUM_SMS": 132, "FLATTEN": True,
           "num_warps": 8, "num_stages": 3}
_ROW_BYTES = 16  # TMA: every row stride (and the base) 16-byte aligned


def constraints(task, config, target):
    arch = target.profile.arch
    if not (arch.startswith("sm_") and int(arch[3:]) >= 90):
        return f"TMA needs sm_90 or newer, the target is {arch}"
    if config["NUM_SMS"] != target.profile.cores:
        return f"NUM_SMS={config['NUM_SMS']} is not the target's SM count ({target.profile.cores})"
    a, b = task.inputs[0], task.inputs[1]
    if a.dtype != b.dtype or a.dtype not in ("float16", "bfloat16", "float32"):
        return f"TMA tiles need one 16/32-bit float type for A and B, not {a.dtype}/{b.dtype}"
    item = 4 if a.dtype == "float32" else 2
    _, N, K = _gemm_dims(task)
    row_elements = (K,) if task.attr("trans_b", False) else (K, N)
    if any(n * item % _ROW_BYTES for n in row_elements):
        return f"rows of {row_elements} elements are not {_ROW_BYTES}-byte aligned for TMA"
    return _residual_problem(task) or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"],
                                                            config["num_warps"], target)


@triton.jit
def _gemm_tma(a_desc, b_desc, c_ptr, bias_ptr, res_ptr, M, N, K, stride_cm, stride_cn, stride_rm, stride_rn,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
              B_TRANSPOSED: tl.constexpr, FLATTEN: tl.constexpr, ACTIVATION: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
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
            acc = tl.dot(a, b, acc, input_precision="ieee")
        rows = first_row + tl.arange(0, BLOCK_M)
        cols = first_col + tl.arange(0, BLOCK_N)
        _epilogue_store(acc, c_ptr, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                        stride_rn, ACTIVATION, HAS_BIAS, HAS_RESIDUAL)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    block_m, block_n, block_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    b_transposed = bool(task.attr("trans_b", False))
    a_desc = TensorDescriptor(inputs[0], [p.M, p.K], [p.stride_a[0], p.stride_a[1]], [block_m, block_k])
    b = inputs[1]
    if b_transposed:  # B stored N x K
        b_desc = TensorDescriptor(b, [p.N, p.K], [p.stride_b[1], p.stride_b[0]], [block_n, block_k])
    else:
        b_desc = TensorDescriptor(b, [p.K, p.N], [p.stride_b[0], p.stride_b[1]], [block_k, block_n])
    tiles = triton.cdiv(p.M, block_m) * triton.cdiv(p.N, block_n)
    _gemm_tma[(min(tiles, config["NUM_SMS"]),)](
        a_desc, b_desc, outputs[0], p.bias, p.residual, p.M, p.N, p.K, *p.stride_c, *p.stride_r,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=config["GROUP_M"],
        B_TRANSPOSED=b_transposed, FLATTEN=config["FLATTEN"], **p.epilogue,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
