"""GEMM (+ epilogue) for few output tiles, triton-ascend style: the weight spread over the cube cores.

A skinny GEMM (a few rows: a pooler, a decode step) has too few BLOCK_M x BLOCK_N output tiles to
give every cube core one, and each tile's whole K reduction streams its B (weight) slice through
one core's MTE2 while the other cores idle: weight-read-bound at a few cores' rate instead of HBM's.
Here every output tile is cut into K_PARTS parts along K, one program (one cube core and its two
vector cores) per (tile, part): programs = tiles x K_PARTS, at most the cube cores, so the weight
streams from HBM on every core at once. Each program accumulates its K part (whole BLOCK_K steps,
L1_STEPS per GM->L1 load) in L0C and FIXPIPE writes the fp32 partial to its own slot of the GM
workspace (poisoned every run: every slot must be written this run). It then bumps its tile's
arrival flag (an atomic add in GM); the program that arrives last (it sees K_PARTS - 1) has its
vector cores sum the tile's K_PARTS partials from the workspace in EPILOGUE_ROWS-row UB chunks,
apply the activation and residual, store the output, and reset the flag to zero, as it found it.
The flags (int32, one per tile) are allocated zeroed once per loaded program (`flags`): the
backend checks that every run leaves them zero. The bias rides the cube's bias table in part 0.

What the cost model charges (schedule): each program's K part at its own MTE2/cube rates, the
launch's GM traffic sharing HBM; after the loop the last part's drain of its partial (FIXPIPE), one
cross-core handshake (the flag atomic and the fence that makes the other parts' partials visible,
`syncs`), then the vector cores' read of all K_PARTS partials (and the residual), their adds and
activation, and the output's store, none of it overlapped. Every program is charged the bias load
and the busiest program is the one that finishes a tile. K-part starts whose rows are not 512-byte
aligned in GM (A's rows; B's with trans_b) move at the unaligned rate.
"""
import triton
import triton.language as tl

# include: cube_common

KIND = "gemm"
PRECISION = "fp32"
# 1,944 configurations; only shapes whose output tiles x 2 parts fit the cube cores are offered it
# (serves()), so the main GEMM's space is ranked whole for every GEMM with many tiles. 16-row tiles
# (one cube fractal): two row tiles of a 32-row GEMM read each weight slice once from HBM and once
# from L2, and halve what the part that finishes a tile reads back
SPACE = {"BLOCK_M": [16, 32, 64], "BLOCK_N": [128, 256], "BLOCK_K": [32, 64, 128], "L1_STEPS": [1, 2, 4],
         "K_PARTS": [2, 3, 4, 6, 8, 12], "EPILOGUE_ROWS": [8, 16, 32], "BUFFERS": [2, 3]}
DEFAULT = {"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "L1_STEPS": 2, "K_PARTS": 2, "EPILOGUE_ROWS": 32,
           "BUFFERS": 2}

GM_BEST = 512  # GM row starts aligned to this move at the full rate


def _problem(task):
    """(M, N, K): leading batch dims of `a` fold into M."""
    a, b = task.inputs[0], task.inputs[1]
    k = a.shape[-1]
    return a.numel // k, b.shape[0] if task.attr("trans_b", False) else b.shape[1], k


def _tiles(task, config):
    m, n, _ = _problem(task)
    return triton.cdiv(m, config["BLOCK_M"]), triton.cdiv(n, config["BLOCK_N"])


def _parts(task, config):
    """(steps per part, parts used, steps per L1 load): K in whole BLOCK_K steps, cut into K_PARTS."""
    _, _, k = _problem(task)
    steps = triton.cdiv(k, config["BLOCK_K"])
    per = triton.cdiv(steps, config["K_PARTS"])
    return per, triton.cdiv(steps, per), min(config["L1_STEPS"], per)


def serves(task, target):
    """Offered only where some configuration's grid (tiles x 2 parts at the largest tiles) fits the
    cube cores: a GEMM with many tiles already gives every core some."""
    m, n, k = _problem(task)
    tiles = triton.cdiv(m, max(SPACE["BLOCK_M"])) * triton.cdiv(n, max(SPACE["BLOCK_N"]))
    return (task.dtype in ITEMSIZE and k > min(SPACE["BLOCK_K"])
            and tiles * min(SPACE["K_PARTS"]) <= int(target.profile.limit("cube_cores")))


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    if task.attr("activation", "none") not in ACTIVATION_VECTOR_OPS:
        return f"activation {task.attr('activation')} is not implemented by this variant"
    _, _, k = _problem(task)
    per, used, _ = _parts(task, config)
    if used < config["K_PARTS"]:
        return (f"K_PARTS {config['K_PARTS']}: K = {k} makes only {used} part(s) of whole "
                f"{config['BLOCK_K']}-deep steps")
    if config["L1_STEPS"] > per:
        return (f"L1_STEPS {config['L1_STEPS']} exceeds a K part's {per} step(s): the same loads as "
                f"L1_STEPS {per}, in a larger L1 buffer")
    if config["EPILOGUE_ROWS"] > config["BLOCK_M"]:
        return (f"EPILOGUE_ROWS {config['EPILOGUE_ROWS']} exceeds BLOCK_M {config['BLOCK_M']}: a UB chunk "
                "is part of the tile's rows")
    return None


def _misaligned(task, config):
    """(A's loads, B's loads, output rows): whether their GM rows start off 512 bytes, where a part,
    an L1 load or a tile cuts a row."""
    m, n, k = _problem(task)
    size, out_size = ITEMSIZE[task.dtype], ITEMSIZE[task.outputs[0].dtype]
    per, used, l1 = _parts(task, config)
    depth, load = per * config["BLOCK_K"], l1 * config["BLOCK_K"]
    k_cut = (used > 1 and (depth * size) % GM_BEST != 0) or (per > l1 and (load * size) % GM_BEST != 0)
    n_cut = n > config["BLOCK_N"]
    b_cut = k_cut if task.attr("trans_b", False) else n_cut and (config["BLOCK_N"] * size) % GM_BEST != 0
    out_cut = n_cut and (config["BLOCK_N"] * min(size, out_size)) % GM_BEST != 0
    return k_cut, b_cut, out_cut


def schedule(task, config, target):
    m, n, k = _problem(task)
    size, out_size = ITEMSIZE[task.dtype], ITEMSIZE[task.outputs[0].dtype]
    tile_m, tile_n, tile_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    bm, bn, bk = min(tile_m, _fractal(m)), min(tile_n, _fractal(n)), min(tile_k, _fractal(k))
    tiles_m, tiles_n = _tiles(task, config)
    tiles = tiles_m * tiles_n
    per, parts, l1 = _parts(task, config)
    steps = triton.cdiv(k, tile_k)
    loads = triton.cdiv(per, l1)
    buffers, rows = config["BUFFERS"], config["EPILOGUE_ROWS"]
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    a_cut, b_cut, out_cut = _misaligned(task, config)
    # one trip: one BLOCK_K step of the program's part; one GM->L1 load of A and of B every l1 steps
    a_bytes, b_bytes = bm * bk * size, bk * bn * size
    per_tile = {"gm_to_l1": a_bytes + b_bytes, "l1_to_l0": a_bytes + b_bytes, "cube_macs": bm * bn * bk}
    transfers = {"gm_to_l1": 2 * loads / per, "l1_to_l0": 2}
    unaligned = {"per_tile": {"gm_to_l1": a_bytes * a_cut + b_bytes * b_cut}}
    if has_bias:  # charged to every program (only part 0 loads it): the busiest is any part
        per_tile["gm_to_l1"] += bn * size / per
        transfers["gm_to_l1"] += 1 / per
        unaligned["per_tile"]["gm_to_l1"] += bn * size / per * out_cut
    # after the loop, on the program that finishes the tile: its partial leaves L0C for its slot,
    # one handshake, then its vector cores read every part's partial (and the residual) in chunks
    chunks = triton.cdiv(bm, rows)
    elementwise = ACTIVATION_VECTOR_OPS[task.attr("activation", "none")]
    exposed = {"l0c_to_gm": bm * bn * 4, "gm_to_ub": bm * bn * (4 * parts + size * has_residual),
               "vector_ops": bm * bn * (parts - 1 + elementwise + has_residual + 1), "ub_to_gm": bm * bn * out_size}
    exposed_transfers = {"l0c_to_gm": 1, "gm_to_ub": (parts + has_residual) * chunks, "ub_to_gm": chunks}
    unaligned["exposed"] = {"gm_to_ub": bm * bn * size * has_residual * out_cut,
                            "ub_to_gm": bm * bn * out_size * out_cut}
    # UB of each vector core (half of a chunk's rows each): the running sum, and per buffer the
    # incoming partial, the residual and the output
    live = {"l1": buffers * l1 * (tile_m * tile_k + tile_k * tile_n) * size + (tile_n * size if has_bias else 0),
            "l0a": buffers * tile_m * tile_k * size, "l0b": buffers * tile_k * tile_n * size,
            "l0c": tile_m * tile_n * 4,
            "ub": rows * tile_n // 2 * 4 + buffers * rows * tile_n // 2 * (4 + size * has_residual + out_size)}
    footprint = sum(spec.nbytes for spec in task.inputs) + task.outputs[0].nbytes + tiles * parts * tile_m * tile_n * 4
    row_bytes = [k * size, n * out_size]
    return {
        "core": "mixed", "programs": tiles * parts, "tiles": per, "total_tiles": tiles * steps,
        "buffers": buffers, "per_tile": per_tile, "transfers": transfers, "live": live,
        "tails": {"l1": [tile_k * size, tile_n * size], "ub": [tile_n * 4, tile_n * out_size]},
        "load_trips": l1, "exposed": exposed, "exposed_transfers": exposed_transfers, "exposed_chunks": chunks,
        "syncs": 1, "unaligned": {t: {q: b for q, b in qs.items() if b > 0} for t, qs in unaligned.items()},
        "gm_alignment": min(min(r & -r for r in row_bytes), GM_BEST), "footprint_bytes": footprint,
        "cube_dtype": task.dtype, "vector_op_bytes": 4,
    }


def workspace(task, config):
    """(elements, dtype): one fp32 BLOCK_M x BLOCK_N slot per (tile, part)."""
    tiles_m, tiles_n = _tiles(task, config)
    return tiles_m * tiles_n * config["K_PARTS"] * config["BLOCK_M"] * config["BLOCK_N"], "float32"


def flags(task, config):
    """int32 arrival flags, one per output tile, zero before and after every launch."""
    tiles_m, tiles_n = _tiles(task, config)
    return tiles_m * tiles_n


@triton.jit
def _gemm_parts(a_ptr, b_ptr, bias_ptr, residual_ptr, out_ptr, ws_ptr, flags_ptr, M, N, K, stride_bk, stride_bn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, K_SLICE: tl.constexpr, DEPTH: tl.constexpr,
                PARTS: tl.constexpr, EPILOGUE_ROWS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr,
                RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    tile = pid // PARTS
    part = pid % PARTS
    tiles_n = tl.cdiv(N, BLOCK_N)
    tile_m = tile // tiles_n
    tile_n = tile % tiles_n
    rm = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_BIAS:
        if part == 0:  # the bias table initialises part 0's accumulator
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    k_lo = part * DEPTH
    k_hi = tl.minimum(k_lo + DEPTH, K)
    a_slice, a_rows_in, b_slice, b_cols_in = _tile_operands(a_ptr, b_ptr, rm, rn, M, N, K, stride_bk, stride_bn,
                                                            K_SLICE)
    for k0 in range(k_lo, k_hi, K_SLICE):  # one GM->L1 load of A rows and B columns each
        acc = _k_step(acc, a_slice, a_rows_in, b_slice, b_cols_in, k0, k_hi, stride_bk, K_SLICE, EVEN_K,
                      DOT_PRECISION)
    # FIXPIPE: the partial to this (tile, part)'s own workspace slot
    tile_offsets = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(ws_ptr + pid * BLOCK_M * BLOCK_N + tile_offsets, acc)
    arrived = tl.atomic_add(flags_ptr + tile, 1, sem="acq_rel")  # release: the partial is visible first
    if arrived == PARTS - 1:  # the last part: its vector cores finish the tile from every slot
        _vector_epilogue(ws_ptr + tile * PARTS * BLOCK_M * BLOCK_N, residual_ptr, out_ptr, tile_m * BLOCK_M, rn, M, N,
                         BLOCK_M, BLOCK_N, EPILOGUE_ROWS, PARTS, ACTIVATION, RESIDUAL)
        tl.atomic_xchg(flags_ptr + tile, 0)  # as found, for the next launch


def launch(task, config, inputs, outputs, workspace_buffer, flag_buffer):
    m, n, k = _problem(task)
    tiles_m, tiles_n = _tiles(task, config)
    per, _, l1 = _parts(task, config)
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    a, b = inputs[0], inputs[1]
    bias = inputs[2] if has_bias else a
    residual = inputs[2 + has_bias] if has_residual else a
    stride_bk, stride_bn = (1, k) if task.attr("trans_b", False) else (n, 1)
    _gemm_parts[(tiles_m * tiles_n * config["K_PARTS"],)](
        a, b, bias, residual, outputs[0], workspace_buffer, flag_buffer, m, n, k, stride_bk, stride_bn,
        BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], K_SLICE=config["BLOCK_K"] * l1,
        DEPTH=per * config["BLOCK_K"], PARTS=config["K_PARTS"], EPILOGUE_ROWS=config["EPILOGUE_ROWS"],
        ACTIVATION=task.attr("activation", "none"), HAS_BIAS=has_bias, RESIDUAL=_residual_join(task),
        EVEN_K=k % (config["BLOCK_K"] * l1) == 0 and per % l1 == 0,
        DOT_PRECISION="ieee" if task.dtype == "float32" else "tf32")
