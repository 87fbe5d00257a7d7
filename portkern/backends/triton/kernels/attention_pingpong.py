"""Fused attention forward on Hopper, written in Gluon: FlashAttention-3's ping-pong schedule.

attention_flash (plain Triton) reached 0.83x torch's scaled_dot_product_attention (cuDNN's
persistent flash kernel) on causal b4 h32 s2048 d128 on an H100: Triton waits on each wgmma, so
the tensor cores idle while a warpgroup runs its softmax. Here two consumer warpgroups share a tile
of 128 query rows, 64 each, and take turns on the tensor cores (two mbarriers pass the turn): each
issues q k^T of a key block with p v of the block before, hands over, and runs its softmax while
the other's products run. One producer warp fills double-buffered Q tiles and a K/V ring by TMA;
setmaxnreg gives the consumers its registers. A key block is released once its scores are done,
its values once p v is (FA3's order: 10% on the causal shape). PERSISTENT runs one program per SM
over units of tiles, so the next tile's loads run under this one's products; under a causal mask a
unit is row block r's tile and its mirror's (n-1-r), equal work for the static schedule. Without
an additive mask, a consumer's key blocks run in two loops: those no mask edge reaches (compiled
without the masks), then the causal diagonal or a partial last block.
Each consumer stages its output tile in shared memory and stores it by TMA while its next tile
runs. Stored from the wgmma layout (4 bytes a thread, every 32-byte sector in two halves) it had
cost 1.46x on b32 h12 s128 d64, 1.18x on b8 h12 s512 d64 (CUDA graphs, H100,
benchmarks/results/h100-attention-pingpong-store-16b-ab-2026-12-06.log), more than any key-loop
change. The attention suite through the search on an H100 (h100-ops-attention-tma-store-2026-12-06):
0.99x, 0.96x and 1.10x SDPA on those two and causal b4 h32 s2048 d128. In SASS ptxas waits for a
turn's p v before its softmax's exponentials: forcing the overlap back measured 0.97-1.00x.

fp16/bf16, head dim up to 128, sm_90 (wgmma, TMA, setmaxnreg); causal is bottom-right; grouped-query
attention reads key/value head h // group for query head h (k and v before their repeat); an additive
mask (broadcast through zero strides) comes a key block at a time, by TMA with K where its rows are
whole 16-byte rows (_mask_by_tma), else read by the consumers; q, k and v come through TMA,
zero-filled past every edge: each one's head dim must be its buffer's last axis, rows 16-byte
aligned (K^T as BERT's exports give it, a view of (B, S, H, D) rows, is read as those rows; a K^T
stored d x s is refused). The output leaves by TMA too: its head dim must be contiguous. Gluon
kernels cannot run in the Triton interpreter: without a GPU this variant is cross-compiled, not run.
"""
import math

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

KIND = "attention"
PRECISION = "fp32"
DOT_PRECISION = "ieee"
NEEDS_GPU = "Gluon kernels cannot run in the Triton interpreter"

# include: attention_core

# include: tma_rules

# include: gluon_descriptors

# include: device_cores

# include: warp_roles

SPACE = {"BLOCK_N": [64, 128], "STAGES": [2, 3], "PERSISTENT": [False, True]}
DEFAULT = {"BLOCK_N": 128, "STAGES": 2, "PERSISTENT": True}
_CONSUMER_ROWS = 64  # query rows of a consumer warpgroup (one wgmma's height); a tile is two
_MAX_HEAD_DIM = 128  # the accumulator and the scores of 64 rows in a consumer's 240 registers
_MASK_SCRATCH_BYTES = 16384
_SM90_SHARED_BYTES = 232448  # a program's shared memory on sm_90 (hwprofiles h100/h200: shared_mem_per_block)


def constraints(task, config, target):
    if target.profile.arch != "sm_90":
        return f"wgmma, TMA and setmaxnreg as used here need sm_90, the target is {target.profile.arch}"
    if task.dtype not in _GL_DTYPES:
        return f"attention_pingpong multiplies float16/bfloat16, not {task.dtype}"
    if task.attr("softcap"):
        return "soft-capped logits (tanh) are attention_flash's and attention_splitkv's, not this schedule's"
    head_dim = _logical(task, 0)[-1]
    if head_dim > _MAX_HEAD_DIM:
        return f"head dim {head_dim} > {_MAX_HEAD_DIM}: a consumer's accumulator and scores would spill"
    if _logical(task, 2)[-1] != head_dim:
        return f"values {_logical(task, 2)[-1]} wide, keys {head_dim}: one head dim serves both here"
    k_transposed = task.attr("k_transposed", False)
    for index, name in ((0, "q"), (1, "k"), (2, "v"), (3, "the output")):
        # the buffer axis that holds the head dim (K^T's is its third): TMA tiles and the output's
        # stores need it to be the last; BERT's exports give K^T as a view of (B, S, H, D) rows
        head_axis = _perm(task, index)[2 if index == 1 and k_transposed else 3]
        if head_axis != 3:
            return f"{name}'s head dim is not its buffer's last axis (a d x s K^T needs the other operand layout)"
    if not _row_aligned(head_dim, task.dtype):
        return f"TMA: rows of {head_dim} x {task.dtype} are not {_ROW_BYTES}-byte aligned"
    return None


def _unmasked_shared_memory(task, config):
    """Two Q buffers of both consumers' rows, the K/V ring and each consumer's output tile staged for
    its TMA store, 2-byte elements (constraints), and the mbarriers with the compiler's padding
    (392-408 B in every sm_90 build of the space)."""
    block_d = _block_d(_logical(task, 0)[-1])
    return 2 * block_d * (6 * _CONSUMER_ROWS + 2 * config["STAGES"] * config["BLOCK_N"]) + _BARRIER_BYTES


def _mask_ring_bytes(config):
    return 2 * config["STAGES"] * _CONSUMER_ROWS * config["BLOCK_N"] * 2  # two consumers' rings, 2-byte elements


def _mask_by_tma(task, config):
    """Whether the additive mask can come by TMA (the producer loads each consumer's tile with K;
    the consumers read it from shared memory): its rows are not broadcast (a (B, 1, 1, Sk) padding
    mask has one row a batch, which TMA would read past), its rows are whole 16-byte multiples in
    a contiguous buffer, and both consumers' mask rings fit beside the rest. The launch also needs
    its pointer 16-byte aligned (_mask_alignment), else the mask is read from global memory."""
    if not task.attr("mask", False):
        return False
    shape = task.inputs[3].shape
    return (len(shape) >= 2 and shape[-2] > 1 and shape[-1] * 2 % 16 == 0
            and _unmasked_shared_memory(task, config) + _mask_ring_bytes(config) <= _SM90_SHARED_BYTES)


def shared_memory(task, config):
    """_unmasked_shared_memory, and with a mask either its rings (_mask_by_tma) or the scratch
    through which its blocks change layout (_mask_block; 16,080 B in every sm_90 build of the space)."""
    if not task.attr("mask", False):
        return _unmasked_shared_memory(task, config)
    mask_bytes = _mask_ring_bytes(config) if _mask_by_tma(task, config) else _MASK_SCRATCH_BYTES
    return _unmasked_shared_memory(task, config) + mask_bytes


@gluon.jit
def _tiles_in_unit(unit, n_row_blocks, PAIRED: gl.constexpr):
    """A unit of work is one tile of query rows, or (PAIRED, under a causal mask) row block
    n-1-r's tile and then r's, so that every unit costs about the same: two, or one where r is its
    own mirror."""
    count = 1
    if PAIRED:
        light = unit % ((n_row_blocks + 1) // 2)
        count = 2 - (light == n_row_blocks - 1 - light).to(gl.int32)
    return count


@gluon.jit
def _tile_origin(unit, t, n_row_blocks, H, tile_rows: gl.constexpr, PAIRED: gl.constexpr):
    """(batch, head, first query row) of the unit's t-th tile (_tiles_in_unit)."""
    per_head = n_row_blocks
    if PAIRED:
        per_head = (n_row_blocks + 1) // 2
    bh = unit // per_head
    row_block = unit % per_head
    if PAIRED:
        heavy = n_row_blocks - 1 - row_block
        row_block = heavy + t * (row_block - heavy)
    return bh // H, bh % H, row_block * tile_rows


@gluon.jit
def _key_blocks(q0, tile_rows, S, SK, block_n: gl.constexpr, CAUSAL: gl.constexpr):
    """How many key blocks the tile of query rows [q0, q0 + tile_rows) reads (at least one)."""
    key_end = SK
    if CAUSAL:  # bottom-right: key j is visible to query i when j <= i + SK - S
        key_end = gl.minimum(SK, q0 + tile_rows + SK - S)
    return gl.maximum(gl.cdiv(key_end, block_n), 1)


@gluon.jit
def _mask_block(mask_base, rows_left, start, SK, sm_s, sm_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                layout: gl.constexpr, EDGE: gl.constexpr, MASK_ALIGN: gl.constexpr):
    """The additive mask's key columns [start, +BLOCK_N) of a consumer's rows (mask_base is its first
    row; rows_left of them in range) in the scores' layout, for a mask TMA cannot bring (_mask_by_tma;
    by TMA, BERT's masked attention ran 1.3x faster still: h100-attention-mask-tma-committed-ab-
    2026-12-06.log). Read 16 bytes a thread in row-major order, it moves into the wgmma layout
    through shared memory; read in that layout (4 bytes a thread, each 32-byte sector in parts)
    BERT's masked attention took 1.1x longer. MASK_ALIGN, the alignment of
    the mask's rows in bytes, comes from the launch: a warp-specialized partition other than the
    first does not see the divisibility and contiguity of the pointer and strides, and the second
    consumer read 2 bytes at a time. Both fixed: 1.25x on BERT's masked attention in CUDA graphs on
    an H100 (benchmarks/results/h100-attention-mask-loads-ab-2026-12-06.log)."""
    across: gl.constexpr = BLOCK_N // 8  # 8 two-byte elements a thread (fp16/bf16, constraints)
    # steps that may meet a key or causal edge read in the scores' layout: changing it spilled there
    load_layout: gl.constexpr = layout if EDGE else gl.BlockedLayout([1, 8], [32 // across, across], [4, 1], [1, 0])
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, load_layout))
    cols = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, load_layout))
    ptrs = gl.multiple_of(mask_base + rows[:, None].to(gl.int64) * sm_s + cols[None, :] * sm_k,
                          [MASK_ALIGN, MASK_ALIGN])
    if MASK_ALIGN > 1:  # the key axis is contiguous (_mask_alignment)
        ptrs = gl.max_contiguous(ptrs, [1, BLOCK_N])
    in_range = rows[:, None] < rows_left
    if EDGE:
        in_range = in_range & (cols[None, :] < SK)
    return gl.convert_layout(gl.load(ptrs, mask=in_range, other=0.0), layout)


@gluon.jit
def _scores_to_probs(s, m_i, l_i, start, unmasked_end, rows, first_row, mask_src, S, SK, scale_log2, sm_s, sm_k,
                     HAS_MASK: gl.constexpr, CAUSAL: gl.constexpr, EDGE: gl.constexpr, col_layout: gl.constexpr,
                     MASK_ALIGN: gl.constexpr, MASK_TMA: gl.constexpr):
    """One online-softmax step on a block of raw scores: the probabilities, the accumulator's
    rescale, the new running max (log2 units) and sum. The scale goes into the exponent (s * scale
    - max, one FFMA a score). The key and causal masks are built only where the block may reach
    past unmasked_end (EDGE, known when compiling): ptxas turns the runtime check into selects that
    every block executes (64-128 a block), so blocks known to be whole are compiled without it.
    mask_src: the block's mask tile in shared memory (MASK_TMA), else the consumer's first mask row."""
    block_m: gl.constexpr = s.shape[0]
    block_n: gl.constexpr = s.shape[1]
    s_layout: gl.constexpr = s.type.layout
    cols = start + gl.arange(0, block_n, layout=col_layout)
    scale = scale_log2
    if HAS_MASK:  # the mask is added to the scaled scores in natural units (one FFMA), log2 units after
        if MASK_TMA:
            bias = mask_src.reshape([block_m, block_n]).load(s_layout)
        else:
            bias = _mask_block(mask_src, S - first_row, start, SK, sm_s, sm_k, block_m, block_n, s_layout, EDGE,
                               MASK_ALIGN)
        # held at -2^126 (as attention_flash holds it), which scales to log2 units exactly (no FFMA
        # rounding below): a row that transformers' finfo.min mask hides entirely averages its keys
        s = gl.maximum(s * (scale_log2 * 0.6931471805599453) + bias.to(gl.float32), -8.507059173023462e37)
        scale = 1.4426950408889634
    if EDGE and start + block_n > unmasked_end:
        visible = cols[None, :] < SK
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + (SK - S))
        s = gl.where(visible, s, -float("inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale)
    shift = m_new
    if HAS_MASK:  # a mask can hide a whole block from a row (a causal one never hides its first)
        shift = gl.where(m_new == -float("inf"), 0.0, m_new)
    p = gl.exp2(s * scale - shift[:, None])
    alpha = gl.exp2(m_i - shift)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, axis=1)


@gluon.jit
def _mask_source(mask_base, slot, MASK_TMA: gl.constexpr):
    """What _scores_to_probs reads a key block's mask from: with MASK_TMA the block's tile in the
    consumer's ring (mask_base), else the consumer's first mask row in global memory (mask_base)."""
    source = mask_base
    if MASK_TMA:
        source = mask_base.index(slot)
    return source


@gluon.jit
def _pv_operands(acc, p, alpha, v_bars, ring_index, stages: gl.constexpr, dtype: gl.constexpr):
    """Ahead of a turn's p v (in a key step and in a tile's last turn): wait for ring entry
    ring_index's values, rescale the accumulator by alpha, move p into the wgmma's register operand."""
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    mbarrier.wait(v_bars.index(ring_index % stages), (ring_index // stages) & 1)
    acc = acc * gl.convert_layout(alpha, o_row_layout)[:, None]
    return acc, gl.convert_layout(p.to(dtype), p_layout)


@gluon.jit
def _key_step(j, carry, q, s_zero, ring, turns, masks, HAS_MASK: gl.constexpr, CAUSAL: gl.constexpr,
              EDGE: gl.constexpr, MASK_ALIGN: gl.constexpr, MASK_TMA: gl.constexpr):
    """One turn of a consumer inside a tile: q k^T of key block j and p v of block j-1 issued
    together, the turn passed, then block j's softmax while p v runs. EDGE: whether block j may
    reach past unmasked_end (see _scores_to_probs)."""
    acc, p, alpha, m_i, l_i, turn_count = carry
    k_smem, v_smem, k_bars, v_bars, k_free, v_free, kv_count = ring
    my_turn, their_turn = turns
    unmasked_end, rows, first_row, mask_base, S, SK, scale_log2, sm_s, sm_k = masks
    stages: gl.constexpr = k_smem.type.shape[0]
    block_n: gl.constexpr = k_smem.type.shape[3]  # a ring slot is a (1, 1, rows, head dim) TMA box
    block_d: gl.constexpr = k_smem.type.shape[4]
    col_layout: gl.constexpr = gl.SliceLayout(0, s_zero.type.layout)
    ring_index = kv_count + j
    slot = ring_index % stages
    prev = (ring_index - 1) % stages
    mbarrier.wait(k_bars.index(slot), (ring_index // stages) & 1)
    acc, p_op = _pv_operands(acc, p, alpha, v_bars, ring_index - 1, stages, q.dtype)
    mbarrier.wait(my_turn, turn_count & 1)
    s = warpgroup_mma(q, k_smem.index(slot).reshape([block_n, block_d]).permute((1, 0)), s_zero,
                      use_acc=False, is_async=True)
    acc = warpgroup_mma(p_op, v_smem.index(prev).reshape([block_n, block_d]), acc, is_async=True)
    mbarrier.arrive(their_turn)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))  # the scores are done; p v may still run
    mbarrier.arrive(k_free.index(slot))
    mask_src = _mask_source(mask_base, slot, MASK_TMA)
    p, alpha, m_i, l_i = _scores_to_probs(s, m_i, l_i, j * block_n, unmasked_end, rows, first_row, mask_src, S,
                                          SK, scale_log2, sm_s, sm_k, HAS_MASK, CAUSAL, EDGE, col_layout,
                                          MASK_ALIGN, MASK_TMA)
    acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
    mbarrier.arrive(v_free.index(prev))
    return acc, p, alpha, m_i, l_i, turn_count + 1


@gluon.jit
def _pingpong_producer(args, which: gl.constexpr, CAUSAL: gl.constexpr, MASK_TMA: gl.constexpr,
                       KV_GROUP: gl.constexpr):
    """One warp: for each tile of this program, both consumers' query rows into a free Q buffer
    (two: the next tile's are in place while this one runs), then each key block's K and V (of
    key/value head h // KV_GROUP: grouped-query attention's k and v before their repeat) into
    the ring, a slot's K (V) refilled once both consumers have released that K (V). With MASK_TMA,
    each consumer's mask tile of the block comes with its K, into that slot of the consumer's mask
    ring; it is read until the block's softmax, so the slot waits for its V's release too."""
    # one level at a time: Triton's cache key cannot read nested targets
    descs, bars, buffers, mask_tiles, params = args
    q_desc, k_desc, v_desc, o_desc = descs
    q_bars, q_free, k_bars, v_bars, k_free, v_free, turns = bars
    q_smem, k_smem, v_smem, o_smem = buffers
    n_row_blocks, units, H, S, SK = params[1], params[2], params[3], params[4], params[5]
    sm_b, sm_h = params[7], params[8]
    block_m: gl.constexpr = q_desc.block_type.shape[2]
    block_n: gl.constexpr = k_desc.block_type.shape[2]
    stages: gl.constexpr = k_smem.type.shape[0]
    kv_count = 0
    tile_count = 0
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        for t in range(_tiles_in_unit(unit, n_row_blocks, CAUSAL)):
            b, h, q0 = _tile_origin(unit, t, n_row_blocks, H, 2 * block_m, CAUSAL)
            buf = tile_count % 2
            mbarrier.wait(q_free.index(buf), ((tile_count // 2) & 1) ^ 1)  # a fresh barrier passes phase 1
            mbarrier.expect(q_bars.index(buf), 2 * q_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(q_desc, [b, h, q0, 0], q_bars.index(buf), q_smem.index(2 * buf))
            tma.async_copy_global_to_shared(q_desc, [b, h, q0 + block_m, 0], q_bars.index(buf),
                                            q_smem.index(2 * buf + 1))
            n_blocks = _key_blocks(q0, 2 * block_m, S, SK, block_n, CAUSAL)
            for j in range(n_blocks):
                ring = kv_count + j
                slot = ring % stages
                phase = ((ring // stages) & 1) ^ 1
                mbarrier.wait(k_free.index(slot), phase)
                if MASK_TMA:
                    mbarrier.wait(v_free.index(slot), phase)
                    m_desc = mask_tiles[0]
                    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes + 2 * m_desc.block_type.nbytes)
                    mask_b = b * gl.minimum(sm_b, 1)  # a broadcast (zero-stride) axis is read at 0
                    mask_h = h * gl.minimum(sm_h, 1)
                    for half in gl.static_range(2):
                        tma.async_copy_global_to_shared(m_desc, [mask_b, mask_h, q0 + half * block_m, j * block_n],
                                                        k_bars.index(slot), mask_tiles[1 + half].index(slot))
                else:
                    mbarrier.expect(k_bars.index(slot), k_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(k_desc, [b, h // KV_GROUP, j * block_n, 0], k_bars.index(slot),
                                                k_smem.index(slot))
                mbarrier.wait(v_free.index(slot), phase)
                mbarrier.expect(v_bars.index(slot), v_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(v_desc, [b, h // KV_GROUP, j * block_n, 0], v_bars.index(slot),
                                                v_smem.index(slot))
            kv_count += n_blocks
            tile_count += 1


@gluon.jit
def _pingpong_consumer(args, which: gl.constexpr, CAUSAL: gl.constexpr, HAS_MASK: gl.constexpr,
                       EVEN_KEYS: gl.constexpr, MASK_ALIGN: gl.constexpr, MASK_TMA: gl.constexpr):
    """One warpgroup: query rows [q0 + which * 64, +64) of each tile. Each turn it issues q k^T of
    a key block and p v of the block before, passes the turn, and runs its softmax while the
    other consumer's products run."""
    descs, bars, buffers, mask_tiles, params = args
    q_desc, k_desc, v_desc, o_desc = descs
    q_bars, q_free, k_bars, v_bars, k_free, v_free, turns = bars
    q_smem, k_smem, v_smem, o_smem = buffers
    m_ptr, n_row_blocks, units, H, S, SK, scale_log2, sm_b, sm_h, sm_s, sm_k = params
    dtype: gl.constexpr = q_desc.dtype
    block_m: gl.constexpr = q_desc.block_type.shape[2]
    block_n: gl.constexpr = k_desc.block_type.shape[2]
    block_d: gl.constexpr = k_desc.block_type.shape[3]
    stages: gl.constexpr = k_smem.type.shape[0]
    s_layout: gl.constexpr = _wgmma_layout(4, 1, block_n)
    o_layout: gl.constexpr = _wgmma_layout(4, 1, block_d)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, s_layout)
    o_row_layout: gl.constexpr = gl.SliceLayout(1, o_layout)
    my_turn = turns.index(which)
    their_turn = turns.index(1 - which)
    s_zero = gl.zeros([block_m, block_n], gl.float32, layout=s_layout)
    edges: gl.constexpr = CAUSAL or not EVEN_KEYS  # whether any key block can meet a mask's edge
    kv_count = 0
    tile_count = 0
    turn_count = 0
    for unit in range(gl.program_id(0), units, gl.num_programs(0)):
        for t in range(_tiles_in_unit(unit, n_row_blocks, CAUSAL)):
            b, h, q0 = _tile_origin(unit, t, n_row_blocks, H, 2 * block_m, CAUSAL)
            n_blocks = _key_blocks(q0, 2 * block_m, S, SK, block_n, CAUSAL)
            first_row = q0 + which * block_m
            unmasked_end = SK
            if CAUSAL:
                unmasked_end = gl.minimum(SK, first_row + SK - S + 1)
            rows = first_row + gl.arange(0, block_m, layout=row_layout)
            if MASK_TMA:  # this consumer's ring of mask tiles (_pingpong_producer)
                mask_base = mask_tiles[1 + which]
            else:
                mask_base = m_ptr + b.to(gl.int64) * sm_b + h * sm_h + first_row.to(gl.int64) * sm_s
            m_i = gl.full([block_m], -float("inf"), gl.float32, layout=row_layout)
            l_i = gl.zeros([block_m], gl.float32, layout=row_layout)
            acc = gl.zeros([block_m, block_d], gl.float32, layout=o_layout)
            buf = tile_count % 2
            mbarrier.wait(q_bars.index(buf), (tile_count // 2) & 1)
            q = q_smem.index(2 * buf + which).reshape([block_m, block_d])
            # the tile's first turn: the first block's scores only
            slot = kv_count % stages
            mbarrier.wait(k_bars.index(slot), (kv_count // stages) & 1)
            mbarrier.wait(my_turn, turn_count & 1)
            s = warpgroup_mma(q, k_smem.index(slot).reshape([block_n, block_d]).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
            mbarrier.arrive(their_turn)
            turn_count += 1
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(k_free.index(slot))
            mask_src = _mask_source(mask_base, slot, MASK_TMA)
            p, alpha, m_i, l_i = _scores_to_probs(s, m_i, l_i, 0, unmasked_end, rows, first_row, mask_src, S, SK,
                                                  scale_log2, sm_s, sm_k, HAS_MASK, CAUSAL, edges, col_layout,
                                                  MASK_ALIGN, MASK_TMA)
            carry = (acc, p, alpha, m_i, l_i, turn_count)
            kv_ring = (k_smem, v_smem, k_bars, v_bars, k_free, v_free, kv_count)
            masks = (unmasked_end, rows, first_row, mask_base, S, SK, scale_log2, sm_s, sm_k)
            if edges and HAS_MASK and (CAUSAL or not MASK_TMA):
                # one loop, each block checked at run time: two copies of a step that reads the mask
                # from global memory spill ~100 accesses into each loop at BLOCK_N 128 (sm_90 build);
                # with the mask by TMA they build clean, but the split timed 0.91x at BLOCK_N 128 on a
                # masked causal case (H100; 1.01-1.06x where only the keys' end is an edge)
                for j in range(1, n_blocks):
                    carry = _key_step(j, carry, q, s_zero, kv_ring, (my_turn, their_turn), masks, HAS_MASK,
                                      CAUSAL, True, MASK_ALIGN, MASK_TMA)
            else:
                # the blocks before the first one a mask edge can reach, in a loop compiled without
                # the masks; then the rest, with them
                edge_start = gl.minimum(n_blocks, gl.maximum(unmasked_end // block_n, 1))
                for j in range(1, edge_start):
                    carry = _key_step(j, carry, q, s_zero, kv_ring, (my_turn, their_turn), masks, HAS_MASK,
                                      CAUSAL, False, MASK_ALIGN, MASK_TMA)
                if edges:
                    for j in range(edge_start, n_blocks):
                        carry = _key_step(j, carry, q, s_zero, kv_ring, (my_turn, their_turn), masks, HAS_MASK,
                                          CAUSAL, True, MASK_ALIGN, MASK_TMA)
            acc, p, alpha, m_i, l_i, turn_count = carry
            # the tile's last turn: p v of its last block
            ring = kv_count + n_blocks - 1
            acc, p_op = _pv_operands(acc, p, alpha, v_bars, ring, stages, dtype)
            mbarrier.wait(my_turn, turn_count & 1)
            acc = warpgroup_mma(p_op, v_smem.index(ring % stages).reshape([block_n, block_d]), acc, is_async=True)
            mbarrier.arrive(their_turn)
            turn_count += 1
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
            mbarrier.arrive(v_free.index(ring % stages))
            mbarrier.arrive(q_free.index(buf))
            out = (acc / gl.convert_layout(l_i, o_row_layout)[:, None]).to(dtype)
            # stored from shared memory by TMA (clipped at the sequence's and head dim's ends) while
            # the next tile runs; first, the previous tile's store must have read the staging tile
            tma.store_wait(0)
            o_tile = o_smem.index(which)
            o_tile.reshape([block_m, block_d]).store(out)
            fence_async_shared()
            tma.async_copy_shared_to_global(o_desc, [b, h, first_row, 0], o_tile)
            kv_count += n_blocks
            tile_count += 1
    tma.store_wait(0)


@gluon.jit
def _attention_pingpong(q_desc, k_desc, v_desc, o_desc, m_desc, m_ptr, n_row_blocks, units, H, S, SK, scale_log2,
                        sm_b, sm_h, sm_s, sm_k, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                        HAS_MASK: gl.constexpr, EVEN_KEYS: gl.constexpr, MASK_ALIGN: gl.constexpr,
                        MASK_TMA: gl.constexpr, KV_GROUP: gl.constexpr):
    """Programs from program_id by num_programs over the units of tiles (_tiles_in_unit; a head's
    n_row_blocks tiles of two consumers' rows, units in all): two consumer warpgroups and a
    producer warp each (warp specialization)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [4] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    o_smem = gl.allocate_shared_memory(dtype, [2] + o_desc.block_type.shape, o_desc.layout)
    mask_tiles = ()
    if MASK_TMA:  # the mask's descriptor and each consumer's ring of its tiles
        mask_tiles = (m_desc, gl.allocate_shared_memory(dtype, [STAGES] + m_desc.block_type.shape, m_desc.layout),
                      gl.allocate_shared_memory(dtype, [STAGES] + m_desc.block_type.shape, m_desc.layout))
    q_bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_free = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(q_bars.index(i), count=1)
        mbarrier.init(q_free.index(i), count=2)  # both consumers release a buffer
        mbarrier.init(turns.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
        mbarrier.init(k_free.index(i), count=2)
        mbarrier.init(v_free.index(i), count=2)
    mbarrier.arrive(turns.index(0))  # consumer 0 goes first

    args = ((q_desc, k_desc, v_desc, o_desc), (q_bars, q_free, k_bars, v_bars, k_free, v_free, turns),
            (q_smem, k_smem, v_smem, o_smem), mask_tiles,
            (m_ptr, n_row_blocks, units, H, S, SK, scale_log2, sm_b, sm_h, sm_s, sm_k))
    gl.warp_specialize([(_pingpong_consumer, (args, 0, CAUSAL, HAS_MASK, EVEN_KEYS, MASK_ALIGN, MASK_TMA)),
                        (_pingpong_consumer, (args, 1, CAUSAL, HAS_MASK, EVEN_KEYS, MASK_ALIGN, MASK_TMA)),
                        (_pingpong_producer, (args, 0, CAUSAL, MASK_TMA, KV_GROUP))], [4, 1],
                       [_CONSUMER_REGISTERS, _LOADER_REGISTERS])


def _mask_alignment(p):
    """The bytes (16 at most) that the mask's pointer and its batch, head and row strides are
    multiples of, or 1 where its key axis is not contiguous (_mask_block)."""
    if not p.has_mask or p.strides[15] != 1:
        return 1
    return _byte_alignment(p.mask.data_ptr(), *(stride * p.mask.element_size() for stride in p.strides[12:15]))


def _mask_descriptor(p, block_n, dtype):
    """The mask as (B, H, S, Sk) in (1, 1, consumer rows, block_n) tiles; a broadcast batch or head
    axis (stride 0) is an axis of size 1, read at 0 (_pingpong_producer), with a stride TMA accepts."""
    sm_b, sm_h, sm_s, _ = p.strides[12:]
    shape = [p.batch if sm_b else 1, p.heads if sm_h else 1, p.seq, p.seq_kv]
    stride_h = sm_h or p.seq * sm_s
    strides = [sm_b or shape[1] * stride_h, stride_h, sm_s, 1]
    return _descriptor(p.mask, shape, strides, [1, 1, _CONSUMER_ROWS, block_n], dtype)


def launch(task, config, inputs, outputs):
    p = _AttentionProblem(task, inputs, outputs)
    block_d, block_n, dtype = p.flags["BLOCK_D"], config["BLOCK_N"], task.dtype
    q, k_t, v = p.tensors[:3]
    k = k_t.transpose(2, 3) if p.k_transposed else k_t  # (B, H, S, D) rows, d contiguous (constraints)
    q_desc, k_desc, v_desc, o_desc = (_descriptor(t, t.shape, t.stride(), [1, 1, rows, block_d], dtype) for t, rows
                                      in ((q, _CONSUMER_ROWS), (k, block_n), (v, block_n), (p.out, _CONSUMER_ROWS)))
    row_blocks = triton.cdiv(p.seq, 2 * _CONSUMER_ROWS)
    causal = p.flags["CAUSAL"]
    units = p.batch * p.heads * ((row_blocks + 1) // 2 if causal else row_blocks)  # pairs (_tiles_in_unit)
    grid = (min(units, _core_count(p.out, units)) if config["PERSISTENT"] else units,)
    mask_align = _mask_alignment(p)
    mask_tma = _mask_by_tma(task, config) and mask_align == 16 and p.strides[14] != 0
    m_desc = _mask_descriptor(p, block_n, dtype) if mask_tma else None
    _attention_pingpong[grid](q_desc, k_desc, v_desc, o_desc, m_desc, p.mask, row_blocks, units, p.heads, p.seq,
                              p.seq_kv, p.scale_log2, *p.strides[12:], STAGES=config["STAGES"],
                              CAUSAL=causal, HAS_MASK=p.has_mask, EVEN_KEYS=p.seq_kv % block_n == 0,
                              MASK_ALIGN=mask_align, MASK_TMA=mask_tma, KV_GROUP=p.flags["KV_GROUP"], num_warps=4,
                              maxnreg=_MAX_REGISTERS)
