"""Fused attention forward (flash-attention style): softmax(q k^T * scale + mask) v in one pass.

A program owns BLOCK_M query rows of one (batch, head) and walks the keys BLOCK_N at a time with
an online softmax (running max and sum, rescaled in the exp2 domain), so the S x Sk score matrix
never reaches memory. The mask is additive and broadcast through zero strides; causal masking is
bottom-right aligned (key j is visible to query i when j <= i + Sk - S, as partition.py recognises
it) and skips key blocks that are fully masked; k_transposed is a stride swap. fp32 inputs use
exact fp32 products; fp16/bf16 feed the probabilities to the second product in the input dtype.
"""
import math

import triton
import triton.language as tl

KIND = "attention"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [2, 4, 8],
         "num_stages": [1, 2, 3, 4]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 4, "num_stages": 2}
LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256


def _block_d(head_dim):
    return max(16, triton.next_power_of_2(head_dim))


def constraints(task, config, target):
    head_dim = task.inputs[0].shape[-1]
    if head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} > {MAX_HEAD_DIM} does not fit one tile"
    threads = config["num_warps"] * target.profile.warp_size
    # the fp32 accumulator and the score tile live in registers
    per_thread = (config["BLOCK_M"] * (_block_d(head_dim) + config["BLOCK_N"])) // threads
    if per_thread > 160:
        return f"{per_thread} fp32 registers a thread for the accumulator and scores would spill"
    return None


def shared_memory(task, config):
    itemsize = 4 if task.dtype == "float32" else 2
    block_d = _block_d(task.inputs[0].shape[-1])
    stages = max(1, config["num_stages"])
    return itemsize * block_d * (config["BLOCK_M"] + 2 * stages * config["BLOCK_N"])


def _strides4(t, shape4):
    """Strides of t broadcast to a 4-D shape: size-1 (or missing) dims get stride 0."""
    pad = len(shape4) - len(t.shape)
    sizes = (1,) * pad + tuple(t.shape)
    strides = (0,) * pad + tuple(t.stride())
    return tuple(0 if size == 1 else stride for size, stride in zip(sizes, strides))


@triton.jit
def _flash_attention(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, H, S, SK, D, scale_log2,
                     sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                     sm_b, sm_h, sm_s, sm_k, so_b, so_h, so_s, so_d,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr):
    block = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < S
    dim_ok = dims < D
    q = tl.load(q_ptr + b.to(tl.int64) * sq_b + h * sq_h + rows[:, None] * sq_s + dims[None, :] * sq_d,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    k_base = k_ptr + b.to(tl.int64) * sk_b + h * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h * sv_h
    m_base = mask_ptr + b.to(tl.int64) * sm_b + h * sm_h
    row_max = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    key_end = SK
    if CAUSAL:
        key_end = tl.minimum(SK, (block + 1) * BLOCK_M + SK - S)
    for start in range(0, key_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < SK
        k_t = tl.load(k_base + dims[:, None] * sk_d + cols[None, :] * sk_s,
                      mask=dim_ok[:, None] & col_ok[None, :], other=0.0)
        scores = tl.dot(q, k_t, input_precision="ieee") * scale_log2
        if HAS_MASK:
            bias = tl.load(m_base + rows[:, None] * sm_s + cols[None, :] * sm_k,
                           mask=row_ok[:, None] & col_ok[None, :], other=0.0)
            scores += bias.to(tl.float32) * 1.4426950408889634
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + (SK - S))
        scores = tl.where(visible, scores, -float("inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # rows with nothing visible yet
        probs = tl.exp2(scores - shift[:, None])
        rescale = tl.exp2(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        v = tl.load(v_base + cols[:, None] * sv_s + dims[None, :] * sv_d,
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision="ieee")
        row_max = new_max
    out = acc / row_sum[:, None]
    tl.store(o_ptr + b.to(tl.int64) * so_b + h * so_h + rows[:, None] * so_s + dims[None, :] * so_d,
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def launch(task, config, inputs, outputs):
    q, k, v, out = inputs[0], inputs[1], inputs[2], outputs[0]
    batch, heads, seq, head_dim = q.shape
    seq_kv = v.shape[2]
    k_strides = k.stride()
    if task.attr("k_transposed", False):  # (B, H, D, Sk): swap to (b, h, s, d) order
        k_strides = (k_strides[0], k_strides[1], k_strides[3], k_strides[2])
    has_mask = bool(task.attr("mask", False))
    mask = inputs[3] if has_mask else q
    mask_strides = _strides4(mask, (batch, heads, seq, seq_kv)) if has_mask else (0, 0, 0, 0)
    scale = float(task.attr("scale", 1.0 / math.sqrt(head_dim)))
    grid = (triton.cdiv(seq, config["BLOCK_M"]), batch * heads)
    _flash_attention[grid](q, k, v, mask, out, heads, seq, seq_kv, head_dim, scale * LOG2E,
                           *q.stride(), *k_strides, *v.stride(), *mask_strides, *out.stride(),
                           BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"],
                           BLOCK_D=_block_d(head_dim), HAS_MASK=has_mask,
                           CAUSAL=bool(task.attr("causal", False)),
                           num_warps=config["num_warps"], num_stages=config["num_stages"])
