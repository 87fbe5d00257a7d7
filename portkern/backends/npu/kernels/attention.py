"""Attention, flash style on a cube+vector program: one program per cube core loops over
(batch, head, BLOCK_M query rows) items; for each, K/V blocks stream through L1 while the two
vector cores keep the running max/sum and rescale the output (online softmax), so the S x Sk
scores never reach GM. Scores and the output accumulator cross cube<->vector through a GM
workspace, so their UB tails must be 512-byte aligned: the head dim is padded to 128 lanes.
Causal blocks above the (bottom-right aligned) diagonal are skipped.
"""
import triton
import triton.language as tl

KIND = "attention"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [128, 256], "PROGRAMS": [16, 20, 24], "BUFFERS": [1, 2]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 256, "PROGRAMS": 24, "BUFFERS": 1}  # fp16; fp32 needs BLOCK_N 128

ITEMSIZE = {"float16": 2, "float32": 4}
SCORE_VECTOR_OPS = 12  # scale, mask, max, subtract, exp (4 passes), sum, cast, select
ACC_VECTOR_OPS = 3  # rescale, add, final divide


def _geometry(task, config):
    batch, heads, seq, head_dim = task.inputs[0].shape
    seq_kv = task.inputs[2].shape[2]
    block_d = max(triton.next_power_of_2(head_dim), 128)
    tiles_m = triton.cdiv(seq, config["BLOCK_M"])
    items = batch * heads * tiles_m
    return batch, heads, seq, seq_kv, head_dim, block_d, tiles_m, items, min(config["PROGRAMS"], items)


def _kv_blocks(task, config, seq, seq_kv, tiles_m):
    """K/V blocks visited per query block, averaged (causal skips the blocks above the diagonal)."""
    visited = 0
    for m_tile in range(tiles_m):
        hi = seq_kv
        if task.attr("causal", False):
            hi = min(seq_kv, (m_tile + 1) * config["BLOCK_M"] + seq_kv - seq)
        visited += triton.cdiv(hi, config["BLOCK_N"])
    return visited / tiles_m


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    return None


def schedule(task, config, target):
    _, _, seq, seq_kv, head_dim, block_d, tiles_m, items, programs = _geometry(task, config)
    size, buffers = ITEMSIZE[task.dtype], config["BUFFERS"]
    # masked loads move only in-bounds rows/columns; the cube works on 16-aligned fractals
    bm, bn = (min(config[f"BLOCK_{axis}"], -(-extent // 16) * 16) for axis, extent in (("M", seq), ("N", seq_kv)))
    steps = _kv_blocks(task, config, seq, seq_kv, tiles_m)
    mask_bytes = bm * bn * ITEMSIZE.get(task.inputs[3].dtype, 4) if task.attr("mask", False) else 0
    per_tile = {
        "gm_to_l1": 2 * bn * head_dim * size + bm * head_dim * size / steps + bm * bn * size,
        "l1_to_l0": (bm * block_d + 2 * bn * block_d + bm * bn) * size,
        "cube_macs": 2 * bm * bn * block_d,
        "l0c_to_gm": (bm * bn + bm * block_d) * 4,
        "gm_to_ub": (bm * bn + bm * block_d) * 4 + mask_bytes,
        "vector_ops": bm * bn * SCORE_VECTOR_OPS + bm * block_d * ACC_VECTOR_OPS,
        "ub_to_gm": bm * bn * size + bm * head_dim * size / steps,
    }
    transfers = {"gm_to_l1": 3 + 1 / steps, "l1_to_l0": 4, "l0c_to_gm": 2, "gm_to_ub": 2 + bool(mask_bytes),
                 "ub_to_gm": 1 + 1 / steps}
    tile_m, tile_n = config["BLOCK_M"], config["BLOCK_N"]
    tile_mask = tile_m * tile_n * ITEMSIZE.get(task.inputs[3].dtype, 4) if mask_bytes else 0
    live = {"l1": buffers * (2 * tile_n * block_d + tile_m * tile_n) * size + tile_m * block_d * size,
            "l0a": buffers * max(tile_m * block_d, tile_m * tile_n) * size, "l0b": buffers * tile_n * block_d * size,
            "l0c": buffers * (tile_m * tile_n + tile_m * block_d) * 4,
            "ub": buffers * (tile_m * tile_n * (4 + size) + tile_mask) // 2 + tile_m * block_d * 4 + 2 * tile_m * 4}
    total = items * steps
    return {
        "core": "mixed", "programs": programs, "tiles": int(triton.cdiv(items, programs) * steps),
        "total_tiles": int(total), "buffers": buffers, "per_tile": per_tile, "transfers": transfers, "live": live,
        "tails": {"l1": [block_d * size, tile_n * size], "ub": [tile_n * 4, block_d * 4, tile_n * size]},
        "gm_alignment": min((head_dim * size) & -(head_dim * size), 512),
        "footprint_bytes": sum(spec.nbytes for spec in task.inputs) + task.outputs[0].nbytes
        + programs * (tile_m * tile_n + tile_m * block_d) * 4,
        "cube_dtype": task.dtype, "vector_op_bytes": 4,
    }


@triton.jit
def _attention_items(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, n_items, H, S, SK, D, scale,
                     stride_kd, stride_kn, mask_b, mask_h, mask_s, mask_k,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    tiles_m = tl.cdiv(S, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < D
    for item in range(pid, n_items, num_cores):
        bh = item // tiles_m
        m_tile = item % tiles_m
        rm = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rm < S
        q = tl.load(q_ptr + bh * S * D + rm[:, None] * D + rd[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)
        running_max = tl.full((BLOCK_M,), -float("inf"), dtype=tl.float32)
        running_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        hi = SK
        if CAUSAL:
            hi = tl.minimum(SK, (m_tile + 1) * BLOCK_M + SK - S)
        for n0 in range(0, hi, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            col_ok = rn < SK
            kt = tl.load(k_ptr + bh * SK * D + rd[:, None] * stride_kd + rn[None, :] * stride_kn,
                         mask=d_ok[:, None] & col_ok[None, :], other=0.0)
            scores = tl.dot(q, kt, input_precision=DOT_PRECISION) * scale
            if HAS_MASK:
                mask_offsets = (bh // H) * mask_b + (bh % H) * mask_h + rm[:, None] * mask_s + rn[None, :] * mask_k
                scores += tl.load(mask_ptr + mask_offsets, mask=row_ok[:, None] & col_ok[None, :],
                                  other=0.0).to(tl.float32)
            allowed = col_ok[None, :] & row_ok[:, None]
            if CAUSAL:
                allowed = allowed & (rn[None, :] <= rm[:, None] + (SK - S))
            scores = tl.where(allowed, scores, -float("inf"))
            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            new_max = tl.where(new_max == -float("inf"), 0.0, new_max)
            correction = tl.exp(running_max - new_max)
            probs = tl.exp(scores - new_max[:, None])
            running_sum = running_sum * correction + tl.sum(probs, axis=1)
            v = tl.load(v_ptr + bh * SK * D + rn[:, None] * D + rd[None, :], mask=col_ok[:, None] & d_ok[None, :],
                        other=0.0)
            acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
            running_max = new_max
        out = acc / tl.where(running_sum == 0.0, 1.0, running_sum)[:, None]
        tl.store(out_ptr + bh * S * D + rm[:, None] * D + rd[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


def launch(task, config, inputs, outputs):
    batch, heads, seq, seq_kv, head_dim, block_d, _, items, programs = _geometry(task, config)
    q, k, v = inputs[0], inputs[1], inputs[2]
    stride_kd, stride_kn = (seq_kv, 1) if task.attr("k_transposed", False) else (1, head_dim)
    has_mask = bool(task.attr("mask", False))
    mask = inputs[3].expand(batch, heads, seq, seq_kv) if has_mask else q
    mask_strides = mask.stride() if has_mask else (0, 0, 0, 0)
    _attention_items[(programs,)](q, k, v, mask, outputs[0], items, heads, seq, seq_kv, head_dim,
                                  float(task.attr("scale", 1.0)), stride_kd, stride_kn, *mask_strides,
                                  BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_D=block_d,
                                  HAS_MASK=has_mask, CAUSAL=bool(task.attr("causal", False)),
                                  DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
