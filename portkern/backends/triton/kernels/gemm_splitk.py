"""GEMM split along K for small M x N and long K: more programs than output tiles.

Pass 1: program (tile, split) multiplies its K chunk and writes fp32 partials to a workspace of
SPLIT_K x M x N that the backend allocates (`scratch`). Pass 2 sums the partials in split order
and applies the epilogue. No atomics, so results are bit-identical run to run.
"""
import math

import triton
import triton.language as tl

# include: gemm_common
# include: splitk

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [32, 64, 128], "BLOCK_K": [16, 32, 64, 128],
         "SPLIT_K": [2, 4, 8, 16], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "SPLIT_K": 4, "num_warps": 4, "num_stages": 3}


def constraints(task, config, target):
    M, N, K = _gemm_dims(task)
    return (_residual_problem(task) or _split_problem(K, config["SPLIT_K"], config["BLOCK_K"])
            or _accumulator_problem(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"], target))


def scratch(task, config):
    M, N, K = _gemm_dims(task)
    return _partials_scratch(M, N, config["SPLIT_K"])


@triton.jit
def _gemm_partial(a_ptr, b_ptr, ws_ptr, M, N, K, k_chunk, stride_am, stride_ak, stride_bk, stride_bn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    blocks_n = tl.cdiv(N, BLOCK_N)
    tile, split = tl.program_id(0), tl.program_id(1)
    rows = (tile // blocks_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = (tile % blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_lo = split * k_chunk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _dot_tile(acc, a_ptr, b_ptr, rows, cols, M, N, k_lo, tl.minimum(k_lo + k_chunk, K), stride_am,
                    stride_ak, stride_bk, stride_bn, BLOCK_K, "ieee")
    _store_partial(acc, ws_ptr, split, rows, cols, M, N)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    bm, bn, bk, split_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    workspace = outputs[1]
    grid = (triton.cdiv(p.M, bm) * triton.cdiv(p.N, bn), split_k)
    _gemm_partial[grid](inputs[0], inputs[1], workspace, p.M, p.N, p.K, _k_chunk(p.K, split_k, bk),
                        *p.stride_a, *p.stride_b, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                        num_warps=config["num_warps"], num_stages=config["num_stages"])
    _launch_reduce(p, workspace, outputs[0], split_k, bm, bn, config["num_warps"])
