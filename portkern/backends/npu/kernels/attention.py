"""Attention on a cube+vector program, triton-ascend style: one program per cube core walks a
contiguous run of (batch, head, BLOCK_M query rows) items, query blocks innermost, and BUFFERS
overlaps the next item's loads and cube work with this item's vector work. Scores cross from L0C
to the two vector cores, and probabilities back to L1, through a GM workspace (Atlas A2 has no
L0C->UB path), so every UB tile's tail is 512-byte aligned: fp16 score rows take 256 lanes.

When the keys fit one BLOCK_N block (BERT: 128), K and V stay in L1 across the query blocks of
their (batch, head); the vector cores finish the softmax on the whole row and P @ V leaves L0C
straight to the output through FIXPIPE, so the output never crosses to UB and its head dim needs
no padding. Longer keys stream BLOCK_N blocks flash style (online softmax): the output
accumulator crosses to the vector cores each block for its rescale, its UB rows padded to 128
lanes (512 B). Causal blocks above the (bottom-right aligned) diagonal are skipped.
"""
import triton
import triton.language as tl

KIND = "attention"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [128, 256], "PROGRAMS": [16, 20, 24], "BUFFERS": [1, 2, 3]}
DEFAULT = {"BLOCK_M": 32, "BLOCK_N": 256, "PROGRAMS": 24, "BUFFERS": 1}  # fp16; fp32 needs BLOCK_N 128

ITEMSIZE = {"float16": 2, "float32": 4}
SCORE_VECTOR_OPS = 12  # scale, mask, max, subtract, exp (4 passes), sum, cast, select
ACC_VECTOR_OPS = 3  # flash: rescale, add, final divide (per output element and block)
GM_BEST_ALIGNMENT = 512


def _geometry(task, config):
    batch, heads, seq, head_dim = task.inputs[0].shape
    seq_kv = task.inputs[2].shape[2]
    tiles_m = triton.cdiv(seq, config["BLOCK_M"])
    items = batch * heads * tiles_m
    one_block = seq_kv <= config["BLOCK_N"]
    # the output accumulator is padded to 512-byte fp32 UB rows only where it crosses to UB
    block_d = triton.next_power_of_2(head_dim) if one_block else max(triton.next_power_of_2(head_dim), 128)
    return batch, heads, seq, seq_kv, head_dim, block_d, tiles_m, items, min(config["PROGRAMS"], items), one_block


def _kv_blocks(task, config, seq, seq_kv, tiles_m):
    """K/V blocks visited per query block, averaged (causal skips the blocks above the diagonal)."""
    visited = 0
    for m_tile in range(tiles_m):
        hi = seq_kv
        if task.attr("causal", False):
            hi = min(seq_kv, (m_tile + 1) * config["BLOCK_M"] + seq_kv - seq)
        visited += triton.cdiv(hi, config["BLOCK_N"])
    return visited / tiles_m


def _runs(items, programs, tiles_m):
    """(longest run, most (batch, head) pairs one run touches): the busiest program's items and its
    K/V loads when they stay in L1 across a pair's query blocks."""
    bounds = [(p * items // programs, (p + 1) * items // programs) for p in range(programs)]
    return (max(last - first for first, last in bounds),
            max((last - 1) // tiles_m - first // tiles_m + 1 for first, last in bounds))


def _alignment(*offsets):
    """The largest power of two <= 512 dividing every GM transfer start, from the byte offsets
    between starts (a tile of whole rows is one contiguous burst: its offsets are per head or batch
    and per tile; a block of partial rows starts each row at a multiple of the row stride)."""
    return min(min(int(o) & -int(o) for o in offsets), GM_BEST_ALIGNMENT)


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    if task.attr("softcap"):
        return "soft-capped logits (tanh) are not implemented by this variant"
    if task.inputs[2].shape[-1] != task.inputs[0].shape[-1]:
        return f"values {task.inputs[2].shape[-1]} wide, keys {task.inputs[0].shape[-1]}: one head dim serves both here"
    return None


def schedule(task, config, target):
    _, _, seq, seq_kv, head_dim, block_d, tiles_m, items, programs, one_block = _geometry(task, config)
    size, buffers = ITEMSIZE[task.dtype], config["BUFFERS"]
    tile_m, tile_n = config["BLOCK_M"], config["BLOCK_N"]
    # masked loads move only in-bounds rows/columns; the cube works on 16-aligned fractals
    bm, bn = (min(config[f"BLOCK_{axis}"], -(-extent // 16) * 16) for axis, extent in (("M", seq), ("N", seq_kv)))
    dim = -(-head_dim // 16) * 16
    steps = _kv_blocks(task, config, seq, seq_kv, tiles_m)
    has_mask = bool(task.attr("mask", False))
    mask_size = ITEMSIZE.get(task.inputs[3].dtype, 4) if has_mask else 0
    kv_bytes = 2 * bn * head_dim * size
    scores = bm * bn * 4 + bm * bn * mask_size  # the fp32 scores and the mask tile, into UB
    # the vector unit computes on the whole Triton tile: its padded lanes too
    vector = bm * tile_n * SCORE_VECTOR_OPS
    lead_tiles, lead, lead_transfers = 0, {}, {}
    if one_block:  # one trip per item: K/V come once per (batch, head), P @ V leaves L0C to the output
        run, kv_loads = _runs(items, programs, tiles_m)
        # the first item loads its pair's K/V beside its own Q and P; the next pairs' stream in behind
        lead_tiles, lead, lead_transfers = 1, {"gm_to_l1": kv_bytes}, {"gm_to_l1": 2}
        per_tile = {"gm_to_l1": bm * head_dim * size + bm * bn * size + kv_bytes * (kv_loads - 1) / run,
                    "l1_to_l0": (bm * dim + 2 * bn * dim + bm * bn) * size, "cube_macs": 2 * bm * bn * dim,
                    "l0c_to_gm": bm * bn * 4 + bm * head_dim * size, "gm_to_ub": scores,
                    "vector_ops": vector + bm * tile_n, "ub_to_gm": bm * bn * size}  # + the normalize
        transfers = {"gm_to_l1": 2 + 2 * (kv_loads - 1) / run, "l1_to_l0": 4, "l0c_to_gm": 2,
                     "gm_to_ub": 1 + has_mask, "ub_to_gm": 1}
        live_l1 = (buffers * (tile_m * block_d + tile_m * tile_n) + min(kv_loads, 2) * 2 * tile_n * block_d) * size
        l0c = max(tile_m * tile_n, tile_m * block_d)  # S has left L0C before P @ V fills it
        ub_tails = [tile_n * 4, tile_n * size]
        ub_acc = 0
    else:  # one trip per K/V block: the output accumulator crosses to UB for its rescale each block
        per_tile = {"gm_to_l1": kv_bytes + bm * head_dim * size / steps + bm * bn * size,
                    "l1_to_l0": (bm * block_d + 2 * bn * block_d + bm * bn) * size, "cube_macs": 2 * bm * bn * block_d,
                    "l0c_to_gm": (bm * bn + bm * block_d) * 4, "gm_to_ub": scores + bm * block_d * 4,
                    "vector_ops": vector + bm * block_d * ACC_VECTOR_OPS,
                    "ub_to_gm": bm * bn * size + bm * head_dim * size / steps}
        transfers = {"gm_to_l1": 3 + 1 / steps, "l1_to_l0": 4, "l0c_to_gm": 2, "gm_to_ub": 2 + has_mask,
                     "ub_to_gm": 1 + 1 / steps}
        live_l1 = buffers * (2 * tile_n * block_d + tile_m * tile_n) * size + tile_m * block_d * size
        l0c = tile_m * tile_n + tile_m * block_d  # the accumulator stays beside each block's scores
        ub_tails = [tile_n * 4, block_d * 4, tile_n * size]
        ub_acc = tile_m * block_d * 4
    tile_mask = tile_m * tile_n * mask_size
    live = {"l1": live_l1, "l0a": buffers * max(tile_m * block_d, tile_m * tile_n) * size,
            "l0b": buffers * tile_n * block_d * size, "l0c": buffers * l0c * 4,
            "ub": buffers * (tile_m * tile_n * (4 + size) + tile_mask) // 2 + ub_acc + 2 * tile_m * 4}
    if has_mask:
        ub_tails.append(tile_n * mask_size)
    if task.attr("k_transposed", False):  # K^T (D, Sk): whole when one block, else rows of BLOCK_N keys
        k_offsets = (head_dim * seq_kv * size,) if one_block else (seq_kv * size, bn * size)
    else:
        k_offsets = (seq_kv * head_dim * size, bn * head_dim * size)
    mask_offsets = (seq * seq_kv * mask_size, bm * seq_kv * mask_size) if one_block \
        else (seq_kv * mask_size, bn * mask_size)
    alignment = _alignment(seq * head_dim * size, bm * head_dim * size, *k_offsets, seq_kv * head_dim * size,
                           bn * head_dim * size, bm * bn * 4, bm * bn * size, *(mask_offsets if has_mask else ()))
    trips_per_item = 1 if one_block else steps
    return {
        "core": "mixed", "programs": programs, "tiles": int(triton.cdiv(items, programs) * trips_per_item),
        "total_tiles": int(items * trips_per_item), "buffers": buffers, "per_tile": per_tile, "transfers": transfers,
        "lead_tiles": lead_tiles, "lead": lead, "lead_transfers": lead_transfers,
        "live": live, "tails": {"l1": [block_d * size, tile_n * size], "ub": ub_tails}, "gm_alignment": alignment,
        "footprint_bytes": sum(spec.nbytes for spec in task.inputs) + task.outputs[0].nbytes
        + programs * buffers * (tile_m * tile_n * (4 + size) + ub_acc),
        "cube_dtype": task.dtype, "vector_op_bytes": 4,
    }


@triton.jit
def _scores(q, k_head, mask_rows, rm, row_ok, d_ok, n0, S, SK, scale, kt_tile, mask_tile, stride_kn, mask_k,
            BLOCK_N: tl.constexpr, HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One K block's scaled, masked scores (-inf where a key is outside the sequence or the causal
    window); the cube's Q K^T, the vector cores' scale and mask. kt_tile and mask_tile are a block's
    offsets from its first key, the same for every block."""
    rn = n0 + tl.arange(0, BLOCK_N)
    col_ok = rn < SK
    kt = tl.load(k_head + n0 * stride_kn + kt_tile, mask=d_ok[:, None] & col_ok[None, :], other=0.0)
    scores = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
    allowed = row_ok[:, None] & col_ok[None, :]
    if HAS_MASK:
        scores += tl.load(mask_rows + n0 * mask_k + mask_tile, mask=allowed, other=0.0).to(tl.float32)
    if CAUSAL:
        allowed = allowed & (rn[None, :] <= rm[:, None] + (SK - S))
    return tl.where(allowed, scores, -float("inf")), rn, col_ok


@triton.jit
def _attention_items(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, n_items, H, S, SK, D, scale,
                     stride_kd, stride_kn, mask_b, mask_h, mask_s, mask_k,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, ONE_BLOCK: tl.constexpr,
                     DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    tiles_m = tl.cdiv(S, BLOCK_M)
    # a row tile's and a key block's offsets from their first element, the same for every item and
    # block: made once here (in the interpreter each op costs about the same whatever its size)
    rows = tl.arange(0, BLOCK_M)
    keys = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    row_tile = rows[:, None] * D + rd[None, :]  # Q and the output
    kt_tile = rd[:, None] * stride_kd + keys[None, :] * stride_kn
    v_tile = keys[:, None] * D + rd[None, :]
    mask_tile = rows[:, None] * mask_s + keys[None, :] * mask_k
    for item in range(pid * n_items // num_cores, (pid + 1) * n_items // num_cores):  # this core's run
        bh = item // tiles_m
        row0 = (item % tiles_m) * BLOCK_M
        rm = row0 + rows
        row_ok = rm < S
        rows_in = row_ok[:, None] & d_ok[None, :]
        q = tl.load(q_ptr + (bh * S + row0) * D + row_tile, mask=rows_in, other=0.0)
        k_head = k_ptr + bh * SK * D
        v_head = v_ptr + bh * SK * D
        mask_rows = mask_ptr + (bh // H) * mask_b + (bh % H) * mask_h + row0 * mask_s
        if ONE_BLOCK:  # the whole row at once: P normalized in UB, P @ V straight to the output
            scores, rn, col_ok = _scores(q, k_head, mask_rows, rm, row_ok, d_ok, 0, S, SK, scale, kt_tile, mask_tile,
                                         stride_kn, mask_k, BLOCK_N, HAS_MASK, CAUSAL, DOT_PRECISION)
            row_max = tl.max(scores, axis=1)
            probs = tl.exp(scores - tl.where(row_max == -float("inf"), 0.0, row_max)[:, None])
            row_sum = tl.sum(probs, axis=1)
            probs = probs / tl.where(row_sum == 0.0, 1.0, row_sum)[:, None]
            v = tl.load(v_head + v_tile, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
            out = tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        else:  # flash: online softmax over K/V blocks, the accumulator rescaled in UB each block
            running_max = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
            running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
            acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
            hi = SK
            if CAUSAL:
                hi = tl.minimum(SK, row0 + BLOCK_M + SK - S)
            for n0 in range(0, hi, BLOCK_N):
                scores, rn, col_ok = _scores(q, k_head, mask_rows, rm, row_ok, d_ok, n0, S, SK, scale, kt_tile,
                                             mask_tile, stride_kn, mask_k, BLOCK_N, HAS_MASK, CAUSAL, DOT_PRECISION)
                new_max = tl.maximum(running_max, tl.max(scores, axis=1))
                new_max = tl.where(new_max == -float("inf"), 0.0, new_max)
                correction = tl.exp(running_max - new_max)
                probs = tl.exp(scores - new_max[:, None])
                running_sum = running_sum * correction + tl.sum(probs, axis=1)
                v = tl.load(v_head + n0 * D + v_tile, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
                acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
                running_max = new_max
            out = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]
        tl.store(out_ptr + (bh * S + row0) * D + row_tile, out.to(out_ptr.dtype.element_ty), mask=rows_in)


def launch(task, config, inputs, outputs):
    batch, heads, seq, seq_kv, head_dim, block_d, _, items, programs, one_block = _geometry(task, config)
    q, k, v = inputs[0], inputs[1], inputs[2]
    stride_kd, stride_kn = (seq_kv, 1) if task.attr("k_transposed", False) else (1, head_dim)
    has_mask = bool(task.attr("mask", False))
    mask = inputs[3].expand(batch, heads, seq, seq_kv) if has_mask else q
    mask_strides = mask.stride() if has_mask else (0, 0, 0, 0)
    _attention_items[(programs,)](q, k, v, mask, outputs[0], items, heads, seq, seq_kv, head_dim,
                                  float(task.attr("scale", 1.0)), stride_kd, stride_kn, *mask_strides,
                                  BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_D=block_d,
                                  HAS_MASK=has_mask, CAUSAL=bool(task.attr("causal", False)), ONE_BLOCK=one_block,
                                  DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
