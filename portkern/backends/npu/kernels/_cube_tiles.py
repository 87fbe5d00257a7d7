"""Shared by the cube kernels (gemm, and conv2d as an implicit GEMM): their tile loop, the schedule
it declares, the semantic constraints and the epilogue's activations. The including module defines
`_problem(task) -> (m, n, k, groups)`, the GEMM it computes per group.

The loop: each program walks one contiguous run of the BLOCK_M x BLOCK_N output tiles (runs differ
by at most one tile, so no core idles while another finishes). A tile accumulates its whole K
reduction in L0C, BLOCK_K columns at a time through L0A/L0B; one GM->L1 load brings L1_STEPS such
steps, so DMA setup is paid once per slice. L1_PANEL picks what stays in L1 across the run:
"none" streams both operands for every tile; "a" walks the run along N, so consecutive tiles share
their A rows and the A panel (BLOCK_M rows x all of K) is loaded once per row of tiles; "b" walks
along M and keeps the B panel (all of K x BLOCK_N). The first tile of a run loads the panel's first
K slice as it walks it, one L1 load per step beside its own streamed operand (lead trips: both
operands stream there, so the start is MTE2-bound); later slices and a run that crosses into
another row (column) prefetch the next panel (slice) behind the current one, so L1 holds two.

L0C holds two accumulators when two fit (FIXPIPE drains one tile while the cube fills the next);
a 128x256 fp32 accumulator fills L0C alone, so the cube waits for each tile's drain.

LEAD (variants that declare it; unsplit K) shapes the start, where the panel streams in beside the
first tile's own operand and MTE2 sets the pace: "whole" loads it in whole L1 loads (L1_STEPS deep),
as every later load; "steps2" brings the panel's first slice in loads 2 K steps deep (the tile's own
operand keeps whole L1 loads, whose rows stay 512-byte aligned), so the cube starts sooner and, at
the end of the lead, waits on two steps instead of a whole L1 load (more DMA setups); "pair2" does
that for the run's first two tiles together, their K steps interleaved in the two L0C accumulators:
each step of the panel serves both tiles, so the panel arrives under twice the cube work. A pair's
tiles finish at once, so one drain waits (the next tile needs an accumulator).

What the schedule charges beyond the steady trips (cost model 4): the pipeline fills and empties by
whole L1 loads (`load_trips`, `first_load`); the last tile's drain from L0C and its vector epilogue
overlap nothing (`exposed`), except its residual rows, which the vector cores load into their UB
buffers while the cube still works on the tile; no tile drains during the lead, so the run's
epilogues fall on the later trips; and rows a tile cuts at a column that is not 512-byte aligned
(a 128-wide fp16 B or output tile, a 128-deep fp16 A load) move at the unaligned rate (`unaligned`).

A full-K panel of a K = 3072 GEMM does not fit L1 at a width that pays, and L0C caps the tile at
128x256, whose two streamed operands outrun one core's MTE2. K_SPLIT (variants that declare it;
conv2d keeps one slice) cuts K into slices of whole L1 loads: the run's tiles that share a panel
take the K slices in turn, only that slice of the panel stays in L1, and each tile's partial sum
leaves L0C per slice through FIXPIPE, accumulated into an fp32 GM workspace. The vector cores then
finish every tile once (cast, activation, residual), EPILOGUE_ROWS rows of it per UB chunk, so UB
holds a chunk and not the whole tile. Unsplit, STAGING "output" has FIXPIPE cast the finished sum
to the output's dtype on its way to the workspace (as it does for a plain GEMM's output, and as an
fp16 model rounds a MatMul before its Add), halving the epilogue's GM round trip for fp16.
"""
# include: cube_common

EPILOGUE_ROWS_UNUSED = 64  # what a kernel without a vector epilogue keeps (one value: no duplicate configs)
STAGING_UNUSED = "float32"  # likewise for STAGING


def _k_slices(task, config):
    """(depth, slices): K cut into K_SPLIT slices of whole L1 loads (BLOCK_K x L1_STEPS deep)."""
    _, _, k, _ = _problem(task)
    load = config["BLOCK_K"] * config["L1_STEPS"]
    depth = triton.cdiv(triton.cdiv(k, config.get("K_SPLIT", 1)), load) * load
    return depth, triton.cdiv(k, depth)


def _uses_vector(task, config):
    """A vector epilogue: an activation, a residual, or the final cast of partial sums in GM."""
    return (task.attr("activation", "none") != "none" or bool(task.attr("residual", False))
            or _k_slices(task, config)[1] > 1)


def _staging(task, config):
    """The dtype the accumulator crosses to the vector cores in: fp32, or the output's."""
    return task.outputs[0].dtype if config.get("STAGING", STAGING_UNUSED) == "output" else "float32"


def _tile_grid(task, config):
    """(tiles_m, tiles_n, groups, programs): the output tiles per group and the grid."""
    m, n, _, groups = _problem(task)
    tiles_m, tiles_n = triton.cdiv(m, config["BLOCK_M"]), triton.cdiv(n, config["BLOCK_N"])
    return tiles_m, tiles_n, groups, min(config["PROGRAMS"], groups * tiles_m * tiles_n)


def _segments(task, config):
    """Per program, the tiles of each line (row, or column with L1_PANEL b) its run crosses: the
    tiles that share one panel."""
    tiles_m, tiles_n, groups, programs = _tile_grid(task, config)
    total = groups * tiles_m * tiles_n
    line = tiles_m if config["L1_PANEL"] == "b" else tiles_n
    bounds = [(p * total // programs, (p + 1) * total // programs) for p in range(programs)]
    return [[min(last, (j + 1) * line) - max(first, j * line) for j in range(first // line, (last - 1) // line + 1)]
            for first, last in bounds]


def _runs(task, config):
    """(longest run, most panels one run loads): the busiest program's tiles and panel loads."""
    segments = _segments(task, config)
    return max(sum(s) for s in segments), max(len(s) for s in segments)


LEADS = {"whole": 1, "steps2": 1, "pair2": 2}  # LEAD -> tiles that share the panel's first load


def _lead(config):
    """(tiles, steps): the tiles that take the panel's first load together, and the depth in K steps
    of their L1 loads (L1_STEPS for a "whole" lead)."""
    lead = config.get("LEAD", "whole")
    return LEADS[lead], config["L1_STEPS"] if lead == "whole" else min(2, config["L1_STEPS"])


def _workspace_slots(task, config):
    """Tiles of GM workspace one program's accumulator crosses to the vector cores through: none
    without a vector epilogue, one (two with a lead pair: both tiles finish at once), or with K split
    every tile of its longest segment (their sums build up there)."""
    if not _uses_vector(task, config):
        return 0
    if _k_slices(task, config)[1] > 1:
        return max(max(s) for s in _segments(task, config))
    return 2 if _lead(config)[0] == 2 else 1


def constraints(task, config, target):
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    if task.attr("activation", "none") not in ACTIVATION_VECTOR_OPS:
        return f"activation {task.attr('activation')} is not implemented by this variant"
    if config["L1_PANEL"] != "none":
        run, panels = _runs(task, config)
        if panels >= run:
            return (f"L1_PANEL {config['L1_PANEL']}: no two consecutive tiles of a program's run share "
                    f"the panel ({run} tile(s), {panels} panel(s)), so holding it in L1 saves nothing")
    split = config.get("K_SPLIT", 1)
    if split > 1:
        if config["L1_PANEL"] == "none":
            return (f"K_SPLIT {split} without an L1 panel: every tile streams both operands anyway, so the "
                    "split only adds partial-sum traffic")
        load = config["BLOCK_K"] * config["L1_STEPS"]
        slices = _k_slices(task, config)[1]
        if slices < split:
            return (f"K_SPLIT {split}: K = {_problem(task)[2]} makes only {slices} slice(s) of whole "
                    f"L1 loads ({load} deep)")
    if config.get("STAGING", STAGING_UNUSED) != STAGING_UNUSED:
        if not _uses_vector(task, config):
            return (f"STAGING {config['STAGING']}: this GEMM has no vector epilogue, so the knob stays at "
                    f"{STAGING_UNUSED}")
        if split > 1:
            return f"STAGING {config['STAGING']} with K_SPLIT {split}: partial sums accumulate in fp32"
        if task.outputs[0].dtype == "float32":
            return f"STAGING {config['STAGING']}: the output is fp32 already (the same as {STAGING_UNUSED})"
    lead = config.get("LEAD", "whole")
    if lead not in LEADS:
        return f"LEAD {lead} is none of {', '.join(LEADS)}"
    if lead != "whole":
        if config["L1_PANEL"] == "none":
            return f"LEAD {lead} without an L1 panel: nothing streams in under the first tile but its own operands"
        if split > 1:
            return (f"LEAD {lead} with K_SPLIT {split}: the panel already streams one K slice at a time under "
                    "every tile of its segment")
        if lead == "steps2" and config["L1_STEPS"] <= 2:
            return f"LEAD steps2 with L1_STEPS {config['L1_STEPS']}: the L1 loads are that deep already (the same as whole)"
    if lead == "pair2":
        if config["BUFFERS"] < 3:
            return (f"LEAD pair2 with BUFFERS {config['BUFFERS']}: the two tiles' current slices and the next "
                    "need 3 buffers")
        shortest = min(s[0] for s in _segments(task, config))
        if shortest < 2:
            return (f"LEAD pair2: a program's run starts with a line segment of {shortest} tile(s), so no "
                    "second tile shares the panel's first load")
    rows = config.get("EPILOGUE_ROWS")
    if rows is not None and rows > config["BLOCK_M"]:
        return f"EPILOGUE_ROWS {rows} exceeds BLOCK_M {config['BLOCK_M']}: a UB chunk is part of the tile's rows"
    if rows is not None and not _uses_vector(task, config) and rows != EPILOGUE_ROWS_UNUSED:
        return (f"EPILOGUE_ROWS {rows}: this GEMM has no vector epilogue (its accumulator goes from L0C "
                f"to the output), so the knob stays at {EPILOGUE_ROWS_UNUSED}")
    return None


def _cube_schedule(task, config, target, a_dmas, gm_alignment, ub_lanes, misaligned=None):
    """One program's tile loop as the cost model reads it; a trip is one BLOCK_K step of one tile.

    a_dmas(depth): GM->L1 DMA instructions that bring `depth` K-columns of an A tile (1 for a
    row-major GEMM's 2-D copy; one per input channel for an im2col gather). ub_lanes: the tile axis
    innermost in the output (BLOCK_N for a row-major GEMM, BLOCK_M for an NCHW convolution).
    gm_alignment: what the GM rows' strides allow; misaligned(operand, depth): whether the rows of
    an "a" or "b" load `depth` K-columns deep, or of an "out" tile (output, residual, bias), start
    off 512 bytes where the tile cuts a row (their bytes are declared `unaligned`).
    """
    m, n, k, groups = _problem(task)
    misaligned = misaligned or (lambda operand, depth: False)
    tiles_m, tiles_n, _, programs = _tile_grid(task, config)
    run, panels = _runs(task, config)
    size, out_size = ITEMSIZE[task.dtype], ITEMSIZE[task.outputs[0].dtype]
    buffers, l1_steps, resident = config["BUFFERS"], config["L1_STEPS"], config["L1_PANEL"]
    tile_m, tile_n, tile_k = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    # masked loads move only the in-bounds part of a tile; the cube works on 16-aligned fractals
    bm, bn, bk, k_all = min(tile_m, _fractal(m)), min(tile_n, _fractal(n)), min(tile_k, _fractal(k)), _fractal(k)
    k_steps = triton.cdiv(k, tile_k)
    trips = run * k_steps
    depth, slices = _k_slices(task, config)
    vector = _uses_vector(task, config)
    slices_per_trip = triton.cdiv(k_steps, l1_steps) / k_steps  # GM->L1 loads of the streamed operands
    has_bias, has_residual = bool(task.attr("bias", False)), bool(task.attr("residual", False))
    # bytes moved per trip and DMA instructions per L1 slice, of A and of B
    moved = {"a": (bm * bk * size, a_dmas(min(bk * l1_steps, k_all))), "b": (bk * bn * size, 1)}
    allocated = {"a": tile_m * tile_k * size, "b": tile_k * tile_n * size}  # of one L0 step
    streamed = [operand for operand in ("a", "b") if operand != resident]
    per_tile = {"gm_to_l1": sum(moved[o][0] for o in streamed), "l1_to_l0": moved["a"][0] + moved["b"][0],
                "cube_macs": bm * bn * bk}
    transfers = {"gm_to_l1": slices_per_trip * sum(moved[o][1] for o in streamed), "l1_to_l0": 2}
    out_cut = misaligned("out", 0)
    unaligned = {"per_tile": {"gm_to_l1": sum(moved[o][0] for o in streamed if misaligned(o, bk * l1_steps))}}
    live_l1 = buffers * l1_steps * sum(allocated[o] for o in streamed) + (tile_n * size if has_bias else 0)
    lead_tiles, lead, lead_transfers = 0, {}, {}
    pair, lead_steps = _lead(config)  # constraints() admit a lead other than "whole" only with a panel, unsplit
    pair = pair == 2
    # the trips one L1 load feeds: L1_STEPS K steps of a tile (the lead's loads: of both its tiles)
    load_trips = min(lead_steps if resident != "none" else l1_steps, k_steps) * (2 if pair else 1)
    first_load, first_load_transfers = {}, {}
    if resident != "none":
        # each of the run's panels comes in one K slice at a time: `loads` slice loads in all
        slice_k, loads = min(depth, k_all), panels * slices
        panel_rows = bm if resident == "a" else bn
        share = 2 if pair else 1  # a lead pair's tiles share each step of the panel
        # the first slice streams in under the first tile's trips over it (the pair's: each step of
        # it serves both), in loads `lead_steps` deep, beside the tiles' own operand in whole L1 loads
        lead_tiles = triton.cdiv(min(slice_k, k), tile_k) * share
        panel_lead_dmas = a_dmas(min(bk * lead_steps, k_all)) if resident == "a" else 1
        lead = {"gm_to_l1": moved[resident][0] / share}
        lead_transfers = {"gm_to_l1": triton.cdiv(k_steps, lead_steps) / k_steps * panel_lead_dmas / share}
        unaligned["lead"] = {"gm_to_l1": lead["gm_to_l1"] * misaligned(resident, bk * lead_steps)}
        first_slice = lead_tiles * lead["gm_to_l1"]
        panel_dmas = a_dmas(slice_k) if resident == "a" else 1
        # the further slices stream in behind the current one, spread over the run's trips
        spread = (panels * panel_rows * k_all * size - first_slice) / trips
        per_tile["gm_to_l1"] += spread
        unaligned["per_tile"]["gm_to_l1"] += spread * misaligned(resident, slice_k)
        transfers["gm_to_l1"] += (loads - 1) * panel_dmas / trips
        live_l1 += min(loads, 2) * (tile_m if resident == "a" else tile_n) * slice_k * size
        # the first trip waits for its first loads: an L1 load of its own operand (both tiles' for a
        # pair: the second trip is the other tile's) and the panel's first `lead_steps`
        own, steps = min(l1_steps, k_steps), min(lead_steps, k_steps)
        first_load = {"gm_to_l1": share * own * sum(moved[o][0] for o in streamed) + steps * moved[resident][0]}
        first_load_transfers = {"gm_to_l1": share * sum(moved[o][1] for o in streamed) + panel_lead_dmas}
        unaligned["first_load"] = {"gm_to_l1": share * own * sum(
            moved[o][0] for o in streamed if misaligned(o, bk * l1_steps))
            + steps * moved[resident][0] * misaligned(resident, bk * lead_steps)}
    if has_bias:  # a BLOCK_N slice of the bias per tile, into the cube's bias table
        per_tile["gm_to_l1"] += bn * size / k_steps
        transfers["gm_to_l1"] += 1 / k_steps
        unaligned["per_tile"]["gm_to_l1"] += bn * size / k_steps * out_cut
    accumulator = tile_m * tile_n * 4
    accumulators = 2 if buffers > 1 and 2 * accumulator <= target.profile.limit("l0c_bytes") else 1
    if pair:  # the pair accumulates at once: two accumulators, whether or not they fit (check() says)
        accumulators = 2
    live = {"l1": live_l1, "l0a": buffers * allocated["a"], "l0b": buffers * allocated["b"],
            "l0c": accumulators * accumulator}
    tails = {"l1": [tile_k * size, tile_n * size]}
    footprint = sum(spec.nbytes for spec in task.inputs) + task.outputs[0].nbytes
    if vector:
        # the accumulator goes L0C -> GM workspace (once per K slice, accumulated there) -> UB of the
        # two vector cores (half of each chunk each), which read the finished sum once; the final
        # slice's epilogue is spread over all trips like every other per-tile cost
        elementwise = ACTIVATION_VECTOR_OPS[task.attr("activation", "none")]
        rows = config.get("EPILOGUE_ROWS", tile_m)
        chunks = triton.cdiv(bm, rows)
        stage = ITEMSIZE[_staging(task, config)]
        tile = {"l0c_to_gm": bm * bn * stage, "gm_to_ub": bm * bn * (stage + size * has_residual),
                "vector_ops": bm * bn * (elementwise + has_residual + 1), "ub_to_gm": bm * bn * out_size}
        tile_dmas = {"l0c_to_gm": 1, "gm_to_ub": (1 + has_residual) * chunks, "ub_to_gm": chunks}
        # the workspace's tiles are dense (aligned); the residual's and the output's rows are cut
        tile_unaligned = {"gm_to_ub": bm * bn * size * has_residual * out_cut, "ub_to_gm": bm * bn * out_size * out_cut}
        per_tile.update({name: amount / k_steps for name, amount in tile.items()})
        per_tile["l0c_to_gm"] *= slices  # FIXPIPE drains every K slice's partial sum
        transfers.update(l0c_to_gm=slices / k_steps, gm_to_ub=(1 + has_residual) * chunks / k_steps,
                         ub_to_gm=chunks / k_steps)
        live["ub"] = buffers * rows * tile_n // 2 * (stage + out_size + size * has_residual)
        tails["ub"] = [ub_lanes * stage, ub_lanes * out_size]
        footprint += programs * _workspace_slots(task, config) * tile_m * tile_n * stage
    else:
        tile, tile_dmas, chunks = {"l0c_to_gm": bm * bn * out_size}, {"l0c_to_gm": 1}, 1
        tile_unaligned = {"l0c_to_gm": bm * bn * out_size * out_cut}
        per_tile["l0c_to_gm"] = tile["l0c_to_gm"] / k_steps
        transfers["l0c_to_gm"] = 1 / k_steps
    unaligned["per_tile"].update({name: amount / k_steps for name, amount in tile_unaligned.items()})
    if lead_tiles:
        # no tile finishes during the lead, so its trips drain nothing: the run's epilogues fall on
        # the other trips
        later = trips / (trips - lead_tiles) if trips > lead_tiles else 1.0
        for name, amount in list(per_tile.items()):
            if name in tile:
                per_tile[name] = amount * later
                lead[name] = -per_tile[name]
        for name in tile_unaligned:
            unaligned["per_tile"][name] *= later
        for name in tile_dmas:
            transfers[name] *= later
    # exposed: the last tile's drain from L0C (its last slice, when K is split) and its vector
    # epilogue, less the share the first trip's lifetime already holds (none after a lead); a lead
    # pair's tiles finish at once, so one more drain waits (the next tile needs an accumulator)
    held = 0.0 if lead_tiles else 1 / k_steps
    exposed = {name: amount - (per_tile[name] if held else 0.0) for name, amount in tile.items()}
    exposed_transfers = dict(tile_dmas)
    unaligned["exposed"] = {name: amount * (1 - held) for name, amount in tile_unaligned.items()}
    if vector and has_residual:
        # the residual does not wait for the sum: the vector cores fill their UB buffers with the
        # last tile's residual rows while the cube still works on it, so those rows are not exposed
        ahead = min(bm, buffers * rows) / bm
        exposed["gm_to_ub"] -= bm * bn * size * (1 - held) * ahead
        exposed_transfers["gm_to_ub"] -= chunks * ahead
        unaligned["exposed"]["gm_to_ub"] *= 1 - ahead
    if pair:
        exposed["l0c_to_gm"] += tile["l0c_to_gm"]
        exposed_transfers["l0c_to_gm"] += 1
        if not vector:
            unaligned["exposed"]["l0c_to_gm"] += tile_unaligned["l0c_to_gm"]
    return {
        "core": "mixed" if vector else "cube", "programs": programs, "tiles": trips,
        "total_tiles": groups * tiles_m * tiles_n * k_steps, "buffers": buffers, "per_tile": per_tile,
        "transfers": transfers, "lead_tiles": lead_tiles, "lead": lead, "lead_transfers": lead_transfers,
        "serial": ("cube", "fixpipe") if accumulators == 1 and buffers > 1 else (), "live": live, "tails": tails,
        "load_trips": load_trips, "first_load": first_load, "first_load_transfers": first_load_transfers,
        "exposed": exposed, "exposed_transfers": exposed_transfers, "exposed_chunks": chunks,
        "unaligned": {table: {q: b for q, b in queues.items() if b > 0} for table, queues in unaligned.items()},
        "gm_alignment": gm_alignment, "footprint_bytes": footprint, "cube_dtype": task.dtype, "vector_op_bytes": 4,
    }


@triton.jit
def _run_bounds(total):
    """This program's contiguous run of tiles [first, last)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    return pid * total // programs, (pid + 1) * total // programs


@triton.jit
def _tile_coords(tile, tiles_m, tiles_n, ALONG_M: tl.constexpr):
    """(row, column) of a tile: runs walk along M when the B panel stays in L1, else along N."""
    if ALONG_M:
        row, column = tile % tiles_m, tile // tiles_m
    else:
        row, column = tile // tiles_n, tile % tiles_n
    return row, column
