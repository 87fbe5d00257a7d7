# --- included from _attention_flash.py: the flash-attention kernel (its module sets DOT_PRECISION) ---
# include: attention_core
# include: tma_rules

SPACE = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "TMA": [False, True],
         "PACK_GQA": [False, True], "HEAVY_FIRST": [False, True], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 32, "TMA": False, "PACK_GQA": False, "HEAVY_FIRST": False, "num_warps": 4,
           "num_stages": 2}


def _tma_kv_problem(task, target):
    """Why K and V cannot be read through TMA descriptors, or None: TMA needs sm_90, each buffer's
    last axis the one the kernel reads contiguously (d, or s of a transposed K), and its rows
    16-byte aligned."""
    problem = _tma_arch_problem(target)
    if problem:
        return problem
    for index, name in ((1, "k"), (2, "v")):
        spec = task.inputs[index]
        if _perm(task, index)[3] != 3:
            return f"TMA: {name}'s buffer is not read along its last axis"
        if not _row_aligned(spec.shape[-1], spec.dtype):
            return f"TMA: rows of {name} ({spec.shape[-1]} x {spec.dtype}) are not {_ROW_BYTES}-byte aligned"
    return None


def _kv_descriptors(p, block_n):
    """4-D descriptors over K and V as the kernel reads them, (B, H, S, D) or K's (B, H, D, S), V's
    (B, H, S, Dv)."""
    k, v = p.tensors[1], p.tensors[2]
    block_d = p.flags["BLOCK_D"]
    k_block = [1, 1, block_d, block_n] if p.k_transposed else [1, 1, block_n, block_d]
    return (TensorDescriptor(k, list(k.shape), list(k.stride()), k_block),
            TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, block_n, p.flags["BLOCK_DV"]]))


def fixed(task, target):
    """PACK_GQA as _pack_fixed pins it; TMA off where the task or target rules it out for every
    tile. Without a causal mask every query block reads every key, so HEAVY_FIRST only decides which
    grid axis holds the heads: the second (off), unless there are more than that axis takes."""
    pinned = {**_pack_fixed(task, SPACE["BLOCK_M"]), **({"TMA": False} if _tma_kv_problem(task, target) else {})}
    if not task.attr("causal", False):
        batch, heads = _logical(task, 0)[:2]
        pinned["HEAVY_FIRST"] = batch * heads > MAX_GRID_Y
    return pinned


def _grid(task, config):
    """(query blocks, heads / PACK), the launch grid; HEAVY_FIRST swaps its axes."""
    batch, heads, seq, _ = _logical(task, 0)
    pack = _heads_per_tile(task, config)
    grid = (triton.cdiv(seq, config["BLOCK_M"] // pack), batch * heads // pack)
    return grid[::-1] if config["HEAVY_FIRST"] else grid


def constraints(task, config, target):
    problem = (_dot_precision_problem(task, target) or _head_dim_problem(task)
               or (config["TMA"] and _tma_kv_problem(task, target))
               or (config["PACK_GQA"] and _pack_problem(task, config)) or _register_problem(task, config, target))
    return problem or _grid_axis_problem(_grid(task, config)[1], "HEAVY_FIRST swaps the axes")


def shared_memory(task, config):
    return _attention_shared_memory(task, config)


@triton.jit
def _flash_attention(q_ptr, k_ptr, v_ptr, k_desc, v_desc, mask_ptr, o_ptr, H, S, SK, D, DV, scale_log2,
                     softcap_log2, sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                     sm_b, sm_h, sm_s, sm_k, so_b, so_h, so_s, so_d,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
                     HAS_MASK: tl.constexpr, CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr, EVEN_D: tl.constexpr,
                     EVEN_DV: tl.constexpr, KV_GROUP: tl.constexpr, PACK: tl.constexpr, TMA: tl.constexpr, K_TRANSPOSED: tl.constexpr,
                     HEAVY_FIRST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Program (block, b * H / PACK + g): query heads [g * PACK, (g + 1) * PACK), BLOCK_M / PACK
    positions of each from block * BLOCK_M / PACK, row r of the tile being position r // PACK of the
    group's head r % PACK (_heads_per_tile). HEAVY_FIRST swaps the grid's axes and reverses the
    blocks: the hardware starts programs in grid order, so every head's last (causal: longest) query
    blocks start first and the lightest fill the last wave, as FlashAttention's schedulers order
    causal tiles (longest processing time first)."""
    POSITIONS: tl.constexpr = BLOCK_M // PACK
    if HEAVY_FIRST:
        block = tl.num_programs(1) - 1 - tl.program_id(1)
        b32, h = _tile_heads(tl.program_id(0), H, PACK)
    else:
        block = tl.program_id(0)
        b32, h = _tile_heads(tl.program_id(1), H, PACK)
    b = b32.to(tl.int64)
    kv = h // KV_GROUP
    rows, heads, dims, row_ok, dim_ok, q = _query_tile(q_ptr, b, h, block, S, D, sq_b, sq_h, sq_s, sq_d, BLOCK_M,
                                                       BLOCK_D, PACK)
    vdims = tl.arange(0, BLOCK_DV)
    vdim_ok = vdims < DV
    # a packed tile's mask is one for all its heads (_pack_problem): read at its first head
    acc, row_max, row_sum = _attend(q, k_ptr + b * sk_b + kv * sk_h, v_ptr + b * sv_b + kv * sv_h,
                                    mask_ptr + b * sm_b + h * sm_h, block * POSITIONS, rows, row_ok, dims,
                                    dim_ok, vdims, vdim_ok, 0, _causal_end(block, SK, S, POSITIONS, CAUSAL), S, SK,
                                    scale_log2, softcap_log2, sk_s, sk_d, sv_s, sv_d, sm_s, sm_k, (k_desc, v_desc),
                                    b32, kv, BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, HAS_MASK, CAUSAL, SOFTCAP, EVEN_D,
                                    EVEN_DV, TMA, K_TRANSPOSED, DOT_PRECISION)
    out = acc / row_sum[:, None]
    tl.store(o_ptr + b * so_b + (heads * so_h + rows * so_s)[:, None] + vdims[None, :] * so_d,
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & vdim_ok[None, :])


def launch(task, config, inputs, outputs):
    p = _AttentionProblem(task, inputs, outputs)
    out = p.out
    pack = _heads_per_tile(task, config)
    grid = _grid(task, config)
    # without TMA the descriptor slots take a placeholder pointer the kernel never reads
    k_desc, v_desc = _kv_descriptors(p, config["BLOCK_N"]) if config["TMA"] else p.tensors[1:3]
    _flash_attention[grid](*p.tensors[:3], k_desc, v_desc, p.mask, out, p.heads, p.seq, p.seq_kv, p.head_dim,
                           p.value_dim, p.scale_log2, p.softcap_log2, *p.strides, *out.stride(), BLOCK_M=config["BLOCK_M"],
                           BLOCK_N=config["BLOCK_N"], **p.flags, PACK=pack, TMA=config["TMA"],
                           K_TRANSPOSED=p.k_transposed, HEAVY_FIRST=config["HEAVY_FIRST"],
                           num_warps=config["num_warps"], num_stages=config["num_stages"])
