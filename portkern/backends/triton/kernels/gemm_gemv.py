"""Skinny GEMM (M <= 16, decode-style): streams the weight once.

All M rows live in one program (padded to M_PAD, a power of two), so every weight element is read
once; a program owns BLOCK_N columns and, with SPLIT_K > 1, one K chunk (partials to a workspace,
summed in order by a second pass) so that narrow N still fills the machine. Below 16 rows the
products are fp32 multiply-adds on CUDA cores (a tensor-core tile would be mostly padding); at 16
rows tl.dot takes over. fp32 inputs use exact fp32 products either way.

REDUCE says when the CUDA-core path sums over K: 'step' reduces each BLOCK_K slice as it arrives
(a cross-thread reduction per step, since the threads of a warp lie along the contiguous K axis
of a transposed weight); 'end' keeps one fp32 partial per product lane and reduces once after the
loop, so the loop body is loads and multiply-adds only.
"""
import math

import triton
import triton.language as tl

# include: gemm_common
# include: splitk

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_N": [4, 8, 16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128, 256, 512],
         "SPLIT_K": [1, 2, 4, 8, 16], "REDUCE": ["step", "end"], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3]}
# the H200's best at M=1 and 16 on 4096/11008-wide weights (h200-ops-2026-12-02-run4.json); SPLIT_K 2:
# N/BLOCK_N programs alone leave 132 SMs short of loads in flight. REDUCE 'end' is not yet timed on a GPU
DEFAULT = {"BLOCK_N": 32, "BLOCK_K": 256, "SPLIT_K": 2, "REDUCE": "step", "num_warps": 4, "num_stages": 2}
MAX_ROWS = 16
DOT_ROWS = 16  # from here a tensor-core tile is full
PRODUCTS_PER_THREAD = 64  # fp32 products of the M_PAD x BLOCK_K x BLOCK_N block a thread holds


def _m_pad(M):
    return max(1, triton.next_power_of_2(M))


def fixed(task, target):
    """From DOT_ROWS rows tl.dot reduces over K: REDUCE is 'step'."""
    return {"REDUCE": "step"} if _m_pad(_gemm_dims(task)[0]) >= DOT_ROWS else {}


def constraints(task, config, target):
    M, N, K = _gemm_dims(task)
    if M > MAX_ROWS:
        return f"M={M} is not skinny (at most {MAX_ROWS} rows)"
    threads = config["num_warps"] * target.profile.warp_size
    if _m_pad(M) >= DOT_ROWS and config["REDUCE"] != "step":
        return f"M={M} runs on tensor cores (tl.dot reduces over K): REDUCE={config['REDUCE']!r} does not apply"
    if _m_pad(M) < DOT_ROWS and _m_pad(M) * config["BLOCK_N"] * config["BLOCK_K"] > PRODUCTS_PER_THREAD * threads:
        return f"a {_m_pad(M)}x{config['BLOCK_K']}x{config['BLOCK_N']} product block spills over {threads} threads"
    return _residual_problem(task) or _split_problem(K, config["SPLIT_K"], config["BLOCK_K"])


def shared_memory(task, config):
    return 0  # operands go global -> registers; no shared-memory staging


def scratch(task, config):
    M, N, K = _gemm_dims(task)
    return _partials_scratch(M, N, config["SPLIT_K"])


@triton.jit
def _gemv(a_ptr, b_ptr, c_ptr, ws_ptr, bias_ptr, res_ptr, M, N, K, k_chunk, stride_am, stride_ak,
          stride_bk, stride_bn, stride_cm, stride_cn, stride_rm, stride_rn, M_PAD: tl.constexpr,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, USE_DOT: tl.constexpr,
          REDUCE_AT_END: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
          RESIDUAL: tl.constexpr):
    split = tl.program_id(1)
    rows = tl.arange(0, M_PAD)
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    k_lo = split * k_chunk
    k_hi = tl.minimum(k_lo + k_chunk, K)
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    lanes = tl.zeros((M_PAD, BLOCK_K, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi, BLOCK_K):
        k_ok = (k + ks) < k_hi
        a = tl.load(a_ptr + rows[:, None] * stride_am + (k + ks)[None, :] * stride_ak,
                    mask=(rows[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptr + (k + ks)[:, None] * stride_bk + cols[None, :].to(tl.int64) * stride_bn,
                    mask=k_ok[:, None] & (cols[None, :] < N), other=0.0)
        if USE_DOT:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        elif REDUCE_AT_END:
            lanes += a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :]
        else:
            acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    if REDUCE_AT_END:
        acc = tl.sum(lanes, axis=1)
    _store_result(acc, c_ptr, ws_ptr, split, bias_ptr, res_ptr, rows, cols, M, N, stride_cm, stride_cn, stride_rm,
                  stride_rn, SPLIT, ACTIVATION, HAS_BIAS, RESIDUAL)


def launch(task, config, inputs, outputs):
    p = _GemmProblem(task, inputs, outputs)
    bn, bk, split_k = config["BLOCK_N"], config["BLOCK_K"], config["SPLIT_K"]
    m_pad = _m_pad(p.M)
    workspace = outputs[1] if split_k > 1 else outputs[0]
    _gemv[(triton.cdiv(p.N, bn), split_k)](
        inputs[0], inputs[1], outputs[0], workspace, p.bias, p.residual, p.M, p.N, p.K,
        _k_chunk(p.K, split_k, bk), *p.stride_a, *p.stride_b, *p.stride_c, *p.stride_r, M_PAD=m_pad,
        BLOCK_N=bn, BLOCK_K=bk, SPLIT=split_k > 1, USE_DOT=m_pad >= DOT_ROWS,
        REDUCE_AT_END=m_pad < DOT_ROWS and config["REDUCE"] == "end", **p.epilogue,
        num_warps=config["num_warps"], num_stages=config["num_stages"])
    if split_k > 1:
        _launch_reduce(p, workspace, outputs[0], split_k, m_pad, bn, config["num_warps"])
