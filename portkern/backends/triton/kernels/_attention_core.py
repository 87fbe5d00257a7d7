# --- included from _attention_core.py: operands and the online-softmax loop (its module sets DOT_PRECISION) ---
# include: dot_precision
# include: broadcast
# include: fast_math
LOG2E = 1.4426950408889634
MAX_HEAD_DIM = 256


def _block_d(head_dim):
    return max(16, triton.next_power_of_2(head_dim))


def _perm(task, index):
    """Operand `index` (q, k, v, out) as the kernel reads it: its buffer permuted (tasks.py)."""
    perms = task.attr("perms")
    return tuple(perms[index]) if perms and perms[index] else (0, 1, 2, 3)


def _logical(task, index):
    """The (B, H, ...) shape of operand `index` (q, k, v, out)."""
    spec = task.inputs[index] if index < 3 else task.outputs[0]
    return tuple(spec.shape[axis] for axis in _perm(task, index))


def _kv_group(task):
    """Query heads per key/value head: 1, or the group size of grouped-query attention (partition
    reads k and v before their heads are repeated)."""
    return _logical(task, 0)[1] // _logical(task, 2)[1]


def _heads_per_tile(task, config):
    """Query heads a program's rows come from: 1, or with PACK_GQA a key/value head's whole group
    (FlashAttention-3's PackGQA), BLOCK_M / group positions of each, so every K and V block a
    program loads serves the group. Where a head has fewer query positions than a tile has rows
    (decoding, short prompts), the rows that were padding are the group's other heads, and K and V
    are read once a group instead of once a query head."""
    return _kv_group(task) if config["PACK_GQA"] else 1


def _task_pack_problem(task):
    """Why no tile of this task, whatever its size, can hold several heads, or None."""
    if _kv_group(task) == 1:
        return "PACK_GQA: one query head a key/value head, nothing to pack"
    mask_shape = task.inputs[3].shape if task.attr("mask", False) else ()
    if len(mask_shape) >= 3 and mask_shape[-3] != 1:
        return "PACK_GQA: the mask differs by head (a tile's rows are several heads)"
    return None


def _pack_problem(task, config):
    """Why the group's heads cannot share this config's tile, or None."""
    problem, group = _task_pack_problem(task), _kv_group(task)
    if problem is None and config["BLOCK_M"] % group:
        problem = f"PACK_GQA: {config['BLOCK_M']} rows do not hold whole groups of {group} heads"
    return problem


def _pack_fixed(task, tile_rows):
    """PACK_GQA pinned (fixed()): off where the task has no group to pack; on for a decoding step
    (one query a head) where some tile height in `tile_rows` holds whole groups: unpacked, each
    tile reads its key/value head once for every query head sharing it (the LLaMA step on an H100,
    b8 h32 kv8 sk4096: attention_flash 62.8 -> 53.2 us, attention_splitkv 78.1 -> 48.0 us packed,
    h100-in-sequence-probe-pack-gqa-decode-2026-12-07.json)."""
    if _task_pack_problem(task):
        return {"PACK_GQA": False}
    if _logical(task, 0)[2] == 1 and any(rows % _kv_group(task) == 0 for rows in tile_rows):
        return {"PACK_GQA": True}
    return {}


MAX_GRID_Y = 65535  # CUDA's limit on a grid's second (and third) axis; the first holds 2^31 - 1


def _grid_axis_problem(programs, remedy):
    """Why `programs` cannot be a launch grid's second axis, or None."""
    if programs > MAX_GRID_Y:
        return f"{programs} programs on the grid's second axis > {MAX_GRID_Y} ({remedy})"
    return None


def _head_dim_problem(task):
    for what, width in (("head dim", _logical(task, 0)[-1]), ("value head dim", _logical(task, 2)[-1])):
        if width > MAX_HEAD_DIM:
            return f"{what} {width} > {MAX_HEAD_DIM} does not fit one tile"
    return None


def _register_problem(task, config, target):
    """The fp32 accumulator and the score tile live in registers (q's tile, as wide as the keys, beside
    an accumulator as wide as the values: the wider of the two counted)."""
    threads = config["num_warps"] * target.profile.warp_size
    widest = max(_block_d(_logical(task, 0)[-1]), _block_d(_logical(task, 2)[-1]))
    per_thread = (config["BLOCK_M"] * (widest + config["BLOCK_N"])) // threads
    if per_thread > 160:
        return f"{per_thread} fp32 registers a thread for the accumulator and scores would spill"
    return None


def _attention_shared_memory(task, config):
    """q's tile and each pipeline stage's K and V tiles (V as wide as the values)."""
    itemsize = 4 if task.dtype == "float32" else 2
    block_d, block_dv = _block_d(_logical(task, 0)[-1]), _block_d(_logical(task, 2)[-1])
    stages = max(1, config["num_stages"])
    return itemsize * (block_d * config["BLOCK_M"] + stages * config["BLOCK_N"] * (block_d + block_dv))


class _AttentionProblem:
    """q, k, v, mask and out of an attention task as kernel arguments: k_transposed is a stride
    swap, folded head-split/merge Transposes (perms) are permuted views of the buffers; query head
    h reads key/value head h // KV_GROUP."""

    def __init__(self, task, inputs, outputs):
        q, k, v = (inputs[i].permute(*_perm(task, i)) for i in range(3))
        self.out = outputs[0].permute(*_perm(task, 3))
        self.batch, self.heads, self.seq, self.head_dim = q.shape
        self.seq_kv, self.value_dim = v.shape[2], v.shape[3]
        k_strides = k.stride()
        self.k_transposed = bool(task.attr("k_transposed", False))
        if self.k_transposed:  # (B, H, D, Sk) read in (b, h, s, d) order
            k_strides = (k_strides[0], k_strides[1], k_strides[3], k_strides[2])
        self.has_mask = bool(task.attr("mask", False))
        self.mask = inputs[3] if self.has_mask else q
        shape4 = (self.batch, self.heads, self.seq, self.seq_kv)
        mask_strides = _strides4(self.mask, shape4) if self.has_mask else (0, 0, 0, 0)
        self.tensors = (q, k, v, self.mask)
        self.strides = (*q.stride(), *k_strides, *v.stride(), *mask_strides)
        scale = float(task.attr("scale", 1.0 / math.sqrt(self.head_dim)))
        softcap = float(task.attr("softcap", 0.0))
        # soft-capped logits (Gemma 2), softcap * tanh(scale * q k^T / softcap), in the log2 domain:
        # the products scaled by scale / softcap, their tanh by softcap * log2(e)
        self.scale_log2 = scale / softcap if softcap else scale * LOG2E
        self.softcap_log2 = softcap * LOG2E
        self.flags = {"BLOCK_D": _block_d(self.head_dim), "BLOCK_DV": _block_d(self.value_dim),
                      "HAS_MASK": self.has_mask, "CAUSAL": bool(task.attr("causal", False)),
                      "EVEN_D": _block_d(self.head_dim) == self.head_dim,
                      "EVEN_DV": _block_d(self.value_dim) == self.value_dim,
                      "KV_GROUP": _kv_group(task), "SOFTCAP": bool(softcap), "DOT_PRECISION": DOT_PRECISION}


@triton.jit
def _tile_heads(program, H, PACK: tl.constexpr):
    """(batch, first query head) of a program along the grid's (batch x head groups) axis: heads
    one at a time, or PACK at a time (_heads_per_tile)."""
    return program // (H // PACK), program % (H // PACK) * PACK


@triton.jit
def _query_tile(q_ptr, b, h, block, S, D, sq_b, sq_h, sq_s, sq_d, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
                PACK: tl.constexpr):
    """The query block's rows (their positions), heads (h, or with PACK > 1 each row's: row r is
    position r // PACK of head h + r % PACK), dims (with their in-range masks) and its q tile, zero
    past S and D."""
    tile_rows = tl.arange(0, BLOCK_M)
    if PACK == 1:
        rows = block * BLOCK_M + tile_rows
        heads = h
    else:
        rows = block * (BLOCK_M // PACK) + tile_rows // PACK
        heads = h + tile_rows % PACK
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < S
    dim_ok = dims < D
    q = tl.load(q_ptr + b * sq_b + (heads * sq_h + rows * sq_s)[:, None] + dims[None, :] * sq_d,
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    return rows, heads, dims, row_ok, dim_ok, q


@triton.jit
def _attend(q, k_base, v_base, m_base, first_row, rows, row_ok, dims, dim_ok, vdims, vdim_ok, key_lo, key_hi, S,
            SK, scale_log2, softcap_log2, sk_s, sk_d, sv_s, sv_d, sm_s, sm_k, kv_descs, b, h, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_MASK: tl.constexpr,
            CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
            TMA: tl.constexpr, K_TRANSPOSED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Online softmax of q against keys [key_lo, key_hi): the unnormalised output, running max
    (log2 units) and running sum. Causal is bottom-right aligned: key j is visible to query i when
    j <= i + SK - S (as partition.py recognises it). The whole key blocks that every row of the
    block sees (all of them but the diagonal and the tail) run without key masks or the causal
    test; the rest run masked. With TMA, K and V tiles come through the descriptors kv_descs
    (zero-filled past every edge) at (b, h), and the pointers are unused. dims are q's and k's
    columns, vdims v's and the output's (LeViT's values are twice as wide as its keys)."""
    row_max = tl.full((BLOCK_M,), -float("inf"), tl.float32)
    row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), dtype=tl.float32)
    seen_by_all = key_hi
    if CAUSAL:
        seen_by_all = tl.minimum(key_hi, first_row + SK - S + 1)
    unmasked_end = key_lo + tl.maximum(seen_by_all - key_lo, 0) // BLOCK_N * BLOCK_N
    acc, row_max, row_sum = _attend_keys(acc, row_max, row_sum, q, k_base, v_base, m_base, rows, row_ok, dims,
                                         dim_ok, vdims, vdim_ok, key_lo, unmasked_end, S, SK, scale_log2,
                                         softcap_log2, sk_s, sk_d, sv_s, sv_d, sm_s, sm_k, kv_descs, b, h, BLOCK_N,
                                         BLOCK_D, BLOCK_DV, HAS_MASK, CAUSAL, SOFTCAP, EVEN_D, EVEN_DV, False, TMA,
                                         K_TRANSPOSED, DOT_PRECISION)
    return _attend_keys(acc, row_max, row_sum, q, k_base, v_base, m_base, rows, row_ok, dims, dim_ok, vdims, vdim_ok,
                        unmasked_end, key_hi, S, SK, scale_log2, softcap_log2, sk_s, sk_d, sv_s, sv_d, sm_s, sm_k,
                        kv_descs, b, h, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_MASK, CAUSAL, SOFTCAP, EVEN_D, EVEN_DV, True,
                        TMA, K_TRANSPOSED, DOT_PRECISION)


@triton.jit
def _attend_keys(acc, row_max, row_sum, q, k_base, v_base, m_base, rows, row_ok, dims, dim_ok, vdims, vdim_ok,
                 key_lo, key_hi, S, SK, scale_log2, softcap_log2, sk_s, sk_d, sv_s, sv_d, sm_s, sm_k, kv_descs, b, h,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, HAS_MASK: tl.constexpr,
                 CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
                 MASKED: tl.constexpr, TMA: tl.constexpr, K_TRANSPOSED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The online-softmax steps over keys [key_lo, key_hi). MASKED=False promises whole blocks
    that every row sees: the loads drop their key masks (and dim masks where the head dims fill
    their tiles). SOFTCAP: the scores are softcap * tanh(scale * q k^T / softcap) (_AttentionProblem)."""
    for start in range(key_lo, key_hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + dims[:, None] * sk_d + cols[None, :] * sk_s
        v_ptrs = v_base + cols[:, None] * sv_s + vdims[None, :] * sv_d
        if TMA:  # keys past SK (and dims past D) arrive as zeros; the scores' masks below still apply
            k_desc, v_desc = kv_descs
            if K_TRANSPOSED:
                k_t = k_desc.load([b, h, 0, start]).reshape(BLOCK_D, BLOCK_N)
            else:
                k_t = k_desc.load([b, h, start, 0]).reshape(BLOCK_N, BLOCK_D).T
            v = v_desc.load([b, h, start, 0]).reshape(BLOCK_N, BLOCK_DV)
        elif MASKED:
            col_ok = cols < key_hi
            k_t = tl.load(k_ptrs, mask=dim_ok[:, None] & col_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=col_ok[:, None] & vdim_ok[None, :], other=0.0)
        else:
            if EVEN_D:
                k_t = tl.load(k_ptrs)
            else:
                k_t = tl.load(k_ptrs, mask=dim_ok[:, None], other=0.0)
            if EVEN_DV:
                v = tl.load(v_ptrs)
            else:
                v = tl.load(v_ptrs, mask=vdim_ok[None, :], other=0.0)
        scores = tl.dot(q, k_t, input_precision=DOT_PRECISION) * scale_log2
        if SOFTCAP:
            scores = _tanh(scores) * softcap_log2
        if HAS_MASK:
            bias_ptrs = m_base + rows[:, None] * sm_s + cols[None, :] * sm_k
            if MASKED:
                bias = tl.load(bias_ptrs, mask=row_ok[:, None] & (cols < key_hi)[None, :], other=0.0)
            else:
                bias = tl.load(bias_ptrs, mask=row_ok[:, None], other=0.0)
            # transformers hides a key with its dtype's lowest value, -inf once in log2 units: held
            # at -2^126 instead, a row the mask hides entirely averages its keys as the model does
            scores = tl.maximum(scores + bias.to(tl.float32) * 1.4426950408889634, -8.507059173023462e37)
        if MASKED:
            visible = (cols < key_hi)[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + (SK - S))
            scores = tl.where(visible, scores, -float("inf"))
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        shift = tl.where(new_max == -float("inf"), 0.0, new_max)  # rows with nothing visible yet
        probs = tl.exp2(scores - shift[:, None])
        rescale = tl.exp2(row_max - shift)
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def _causal_end(block, SK, S, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    """One past the last key any row of this query block can see."""
    if CAUSAL:
        return tl.minimum(SK, (block + 1) * BLOCK_M + SK - S)
    return SK
