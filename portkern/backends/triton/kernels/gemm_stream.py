"""Skinny GEMM (M <= 64) that streams the weight through the Hopper tensor memory accelerator.

With few rows the weight is nearly all the traffic, so the kernel's job is to keep enough of it in
flight: each program owns BLOCK_N weight columns (and, with SPLIT_K > 1, one K chunk) and TMA
copies num_stages tiles of them into shared memory ahead of use, with no address arithmetic or
masks in the loop (TMA zero-fills past every edge). The few rows of A ride along as a second
descriptor, padded to at least 16 (the tensor cores' smallest tile; the padding costs no memory
traffic). SWAP puts the weight tile first in the product (C^T = W A^T), so a 64+-column weight
tile fills the M=64 side of a Hopper warpgroup MMA instead of padding the rows; either way the
products are exact and accumulate in fp32. Split-K partials go to the shared workspace and a
second pass sums them in split order (no atomics: bit-identical runs).
"""
import math

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# include: gemm_common
# include: tma
# include: splitk

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [64, 128, 256, 512], "SPLIT_K": [1, 2, 4, 8],
         "SWAP": [False, True], "num_warps": [4, 8], "num_stages": [2, 3, 4, 5, 6]}
# the H200's best on 4 of the 12 fp16 decode shapes, within 11% of the best on the other M <= 16
# ones (h200-gemv-table-2026-12-04.json; M=64 wants it unswapped): 64 weight columns a program,
# one K pass, four tiles in flight
DEFAULT = {"BLOCK_N": 64, "BLOCK_K": 256, "SPLIT_K": 1, "SWAP": True, "num_warps": 4, "num_stages": 4}
MAX_ROWS = 64
MIN_DOT = 16  # smallest tensor-core tile side Triton's tl.dot takes


def _m_pad(M):
    return max(MIN_DOT, triton.next_power_of_2(M))


def constraints(task, config, target):
    M, N, K = _gemm_dims(task)
    if M > MAX_ROWS:
        return f"M={M} is not skinny (at most {MAX_ROWS} rows)"
    problem = _tma_problem(task, target)
    if problem:
        return problem
    if config["SWAP"] and config["BLOCK_N"] < 64:
        return f"SWAP puts the {config['BLOCK_N']}-column weight tile on the MMA's 64-row side: BLOCK_N >= 64"
    return (_residual_problem(task) or _split_problem(K, config["SPLIT_K"], config["BLOCK_K"])
            or _accumulator_problem(_m_pad(M), config["BLOCK_N"], config["num_warps"], target))


def shared_memory(task, config):
    """num_stages x (weight tile + row tile): what the TMA ring holds."""
    M, _, _ = _gemm_dims(task)
    return config["num_stages"] * (config["BLOCK_N"] + _m_pad(M)) * config["BLOCK_K"] * _item_bytes(task)


def scratch(task, config):
    M, N, K = _gemm_dims(task)
    return _partials_scratch(M, N, config["SPLIT_K"])


@triton.jit
def _gemm_stream(a_desc, b_desc, c_ptr, ws_ptr, bias_ptr, res_ptr, M, N, K, k_chunk, stride_cm, stride_cn,
                 stride_rm, stride_rn, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT: tl.constexpr, SWAP: tl.constexpr, B_TRANSPOSED: tl.constexpr,
                 ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr):
    first_col = tl.program_id(0) * BLOCK_N
    split = tl.program_id(1)
    k_lo = split * k_chunk
    k_hi = tl.minimum(k_lo + k_chunk, K)
    if SWAP:
        acc_t = tl.zeros((BLOCK_N, M_PAD), dtype=tl.float32)
    else:
        acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        a = a_desc.load([0, k])
        if B_TRANSPOSED:  # weight stored N x K: a BLOCK_N x BLOCK_K tile
            w_nk = b_desc.load([first_col, k])
        else:
            w_nk = b_desc.load([k, first_col]).T
        if SWAP:
            acc_t = tl.dot(w_nk, a.T, acc_t, input_precision="ieee")
        else:
            acc = tl.dot(a, w_nk.T, acc, input_precision="ieee")
    if SWAP:
        acc = acc_t.T
    rows = tl.arange(0, M_PAD)
    cols = first_col + tl.arange(0, BLOCK_N)
    _store_result(acc, c_ptr, ws_ptr, split, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                  stride_rn, SPLIT, ACTIVATION, HAS_BIAS, RESIDUAL)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    bn, bk, split_k = config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    m_pad = _m_pad(p.M)
    a_desc = TensorDescriptor(inputs[0], [p.M, p.K], list(p.stride_a), [m_pad, bk])
    b_desc = _b_descriptor(task, p, inputs[1], _stored_b_strides(task, p), bn, bk)
    workspace = outputs[1] if split_k > 1 else outputs[0]
    _gemm_stream[(triton.cdiv(p.N, bn), split_k)](
        a_desc, b_desc, outputs[0], workspace, p.bias, p.residual, p.M, p.N, p.K, _k_chunk(p.K, split_k, bk),
        *p.stride_c, *p.stride_r, M_PAD=m_pad, BLOCK_N=bn, BLOCK_K=bk, SPLIT=split_k > 1,
        SWAP=config["SWAP"], B_TRANSPOSED=bool(task.attr("trans_b", False)), **p.epilogue,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if split_k > 1:
        _launch_reduce(p, workspace, outputs[0], split_k, m_pad, bn, config["num_warps"])
