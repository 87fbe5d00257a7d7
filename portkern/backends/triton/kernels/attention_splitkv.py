"""Attention for few queries over many keys (decoding, short prompts): the keys split across programs.

With S small, one program per (query block, head) leaves most SMs idle while it walks a long Sk.
Here SPLITS programs share the keys of each (query block, head): each runs the same online
softmax over its key chunk and writes its unnormalised output, running max and running sum to a
workspace (`scratch`); a second pass merges the splits in order, rescaling each to the common
max. Deterministic, no atomics. A split with no visible key (short Sk, causal) contributes
nothing. Mask, causal, k_transposed, perms and PACK_GQA (a decoding step's one query position a
head fills a tile with its group's heads) as in attention_flash.
"""
import math

import triton
import triton.language as tl

# include: attention_core

KIND = "attention"
PRECISION = "fp32"
DOT_PRECISION = "ieee"
SPACE = {"BLOCK_M": [16, 32, 64], "BLOCK_N": [16, 32, 64, 128], "SPLITS": [2, 4, 8, 16, 32],
         "PACK_GQA": [False, True], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3]}
DEFAULT = {"BLOCK_M": 16, "BLOCK_N": 64, "SPLITS": 8, "PACK_GQA": False, "num_warps": 4, "num_stages": 2}
MAX_QUERIES = 128  # beyond this, query blocks alone fill the machine: use attention_flash


def _chunk(seq_kv, splits, block_n):
    return triton.cdiv(triton.cdiv(seq_kv, splits), block_n) * block_n


def fixed(task, target):
    return _pack_fixed(task, SPACE["BLOCK_M"])


def constraints(task, config, target):
    seq = _logical(task, 0)[2]
    if seq > MAX_QUERIES:
        return f"{seq} queries fill the machine without splitting the keys (at most {MAX_QUERIES})"
    batch, heads = _logical(task, 0)[:2]
    # the merge pass's grid holds every (batch, head); the split pass's PACK times fewer
    return (_head_dim_problem(task) or (config["PACK_GQA"] and _pack_problem(task, config))
            or _register_problem(task, config, target)
            or _grid_axis_problem(batch * heads, "attention_flash takes them first"))


def shared_memory(task, config):
    return _attention_shared_memory(task, config)


def scratch(task, config):
    batch, heads, seq, _ = _logical(task, 0)
    rows = batch * heads * seq
    return [((config["SPLITS"], rows, _logical(task, 2)[-1]), "float32"), ((config["SPLITS"], rows), "float32"),
            ((config["SPLITS"], rows), "float32")]


@triton.jit
def _attention_split(q_ptr, k_ptr, v_ptr, mask_ptr, acc_ptr, max_ptr, sum_ptr, H, S, SK, D, DV, chunk,
                     scale_log2, softcap_log2, sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s,
                     sv_d, sm_b, sm_h, sm_s, sm_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr,
                     SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr, KV_GROUP: tl.constexpr,
                     PACK: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (block, b * H / PACK + g, split): attention_flash's tile of query heads [g * PACK,
    (g + 1) * PACK) over the split's key chunk, its partial results in the (split, b * H + head, row)
    slots the merge reads."""
    POSITIONS: tl.constexpr = BLOCK_M // PACK
    block, split = tl.program_id(0), tl.program_id(2)
    b32, h = _tile_heads(tl.program_id(1), H, PACK)
    b = b32.to(tl.int64)
    kv = h // KV_GROUP
    rows, heads, dims, row_ok, dim_ok, q = _query_tile(q_ptr, b, h, block, S, D, sq_b, sq_h, sq_s, sq_d, BLOCK_M,
                                                       BLOCK_D, PACK)
    vdims = tl.arange(0, BLOCK_DV)
    vdim_ok = vdims < DV
    key_lo = split * chunk
    key_hi = tl.minimum(key_lo + chunk, _causal_end(block, SK, S, POSITIONS, CAUSAL))
    acc, row_max, row_sum = _attend(q, k_ptr + b * sk_b + kv * sk_h, v_ptr + b * sv_b + kv * sv_h,
                                    mask_ptr + b * sm_b + h * sm_h, block * POSITIONS, rows, row_ok, dims,
                                    dim_ok, vdims, vdim_ok, key_lo, key_hi, S, SK, scale_log2, softcap_log2, sk_s,
                                    sk_d, sv_s, sv_d, sm_s, sm_k, None, b, h, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV,
                                    HAS_MASK, CAUSAL, SOFTCAP, EVEN_D, EVEN_DV, False, False, DOT_PRECISION)
    slots = (split * tl.num_programs(1) * PACK + b32 * H + heads).to(tl.int64) * S + rows  # (split, b*h, row)
    tl.store(max_ptr + slots, row_max, mask=row_ok)
    tl.store(sum_ptr + slots, row_sum, mask=row_ok)
    tl.store(acc_ptr + slots[:, None] * DV + vdims[None, :], acc, mask=row_ok[:, None] & vdim_ok[None, :])


@triton.jit
def _attention_merge(acc_ptr, max_ptr, sum_ptr, o_ptr, H, S, D, so_b, so_h, so_s, so_d,
                     SPLITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """out = sum_s 2^(m_s - m) acc_s / sum_s 2^(m_s - m) l_s, splits in order (D, BLOCK_D: the
    output's, the values', head dim)."""
    block, bh = tl.program_id(0), tl.program_id(1)
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < S
    dim_ok = dims < D
    stride_split = tl.num_programs(1).to(tl.int64) * S
    here = bh.to(tl.int64) * S + rows
    top = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    for split in range(SPLITS):
        top = tl.maximum(top, tl.load(max_ptr + split * stride_split + here, mask=row_ok, other=-float("inf")))
    shift = tl.where(top == -float("inf"), 0.0, top)
    total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    out = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for split in range(SPLITS):
        slots = split * stride_split + here
        weight = tl.exp2(tl.load(max_ptr + slots, mask=row_ok, other=-float("inf")) - shift)
        total += weight * tl.load(sum_ptr + slots, mask=row_ok, other=0.0)
        part = tl.load(acc_ptr + slots[:, None] * D + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :],
                       other=0.0)
        out += weight[:, None] * part
    out = out / tl.where(row_ok, total, 1.0)[:, None]  # padding rows: no 0/0
    b = (bh // H).to(tl.int64)
    h = bh % H
    tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_s + dims[None, :] * so_d,
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :])


def launch(task, config, inputs, outputs):
    p = _AttentionProblem(task, inputs, outputs)
    out, acc, row_max, row_sum = p.out, outputs[1], outputs[2], outputs[3]
    splits, block_m, pack = config["SPLITS"], config["BLOCK_M"], _heads_per_tile(task, config)
    blocks = triton.cdiv(p.seq, block_m)
    _attention_split[(triton.cdiv(p.seq, block_m // pack), p.batch * p.heads // pack, splits)](
        *p.tensors[:3], p.mask, acc, row_max, row_sum, p.heads, p.seq, p.seq_kv, p.head_dim, p.value_dim,
        _chunk(p.seq_kv, splits, config["BLOCK_N"]), p.scale_log2, p.softcap_log2, *p.strides, BLOCK_M=block_m,
        BLOCK_N=config["BLOCK_N"], **p.flags, PACK=pack, num_warps=config["num_warps"],
        num_stages=config["num_stages"])
    _attention_merge[(blocks, p.batch * p.heads)](
        acc, row_max, row_sum, out, p.heads, p.seq, p.value_dim, *out.stride(), SPLITS=splits,
        BLOCK_M=block_m, BLOCK_D=p.flags["BLOCK_DV"], num_warps=config["num_warps"])
