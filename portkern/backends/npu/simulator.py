"""The simulated NPU's clock: a generic pipeline cost model fed by each variant's declared schedule.

There is no Ascend silicon here, so an NPU kernel's time is modeled, never measured. Every variant
declares, per program, what one trip of its tile loop moves and computes (`schedule(task, config,
target)`); this module turns that into seconds with one model for all kernels:

  * queues: MTE2 (GM->UB and GM->L1), MTE1 (L1->L0A/L0B), FIXPIPE (L0C->GM), MTE3 (UB->GM), and
    the cube and vector units; a DMA instruction costs a fixed setup, so small transfers waste
    bandwidth, and GM rows that are not 512-byte aligned move at a lower rate (all of a kernel's
    rows by `gm_alignment`, or the bytes it names in `unaligned`: tiles cut from a row at a
    misaligned column);
  * shared bandwidth: the active programs split HBM and L2; re-reads hit L2 while the launch's
    footprint fits there;
  * N-buffering: each tile holds one buffer from its load to its store, so in steady state a tile
    costs max(busiest stage, sum of stages / buffers); the first tile costs the whole sum
    (prologue + epilogue);
  * once-per-program setup (gamma loads) runs before the tile loop, not overlapped, its DMA
    instructions charged like any other;
  * lead trips: the first trips of a program may carry extra work on top of every trip's (a GEMM's
    L1 panel streams in under its first tile), so they run at their own steady rate;
  * load granularity: one GM load may feed several trips (a cube kernel's L1 slice holds L1_STEPS
    K steps), so the pipeline fills and empties by whole loads: where the cube is the slower side
    the first trip waits for all of its first loads (`first_load`); where the lead waits on its
    reads, the `load_trips` trips of its last load run after that load arrives; the first trip's
    bytes share L2/HBM like every other's;
  * exposed work: what no trip overlaps, after the loop (the last tile's drain from L0C and its
    vector epilogue, which the per-trip share spreads over a tile's K steps in steady state);
  * reads and writes at their own per-core rates (MTE2 reads, FIXPIPE's and MTE3's writes);
  * serial stages: stages that hold one resource in turn (a single L0C accumulator: the cube fills
    it, FIXPIPE drains it) add up instead of overlapping;
  * cross-core handshakes (`syncs`): a program that must see what other cores wrote to GM (the
    last of a tile's split-K parts, which finishes the tile) pays a GM round trip per handshake,
    in series after its loop: an atomic on a flag in GM and the fence that makes the other cores'
    partial sums visible (cost model 5);
  * waves when programs exceed cores, and a fixed cost per launch.

Every number it reports is simulated. The rates come from the hwprofile (estimates are labeled
there); docs/bring-up.md says which shapes were calibrated against public measurements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ...errors import PortkernError
from ...hwprofile import HwProfile

COST_MODEL_VERSION = "5"

GM_READ_QUEUES = ("gm_to_ub", "gm_to_l1")
GM_WRITE_QUEUES = ("l0c_to_gm", "ub_to_gm")
GM_QUEUES = GM_READ_QUEUES + GM_WRITE_QUEUES
QUEUES = GM_READ_QUEUES + ("l1_to_l0",) + GM_WRITE_QUEUES
WORK = ("cube_macs", "vector_ops")
MEMORIES = ("ub", "l1", "l0a", "l0b", "l0c")
STAGES = ("mte2_l1", "mte1", "cube", "fixpipe", "mte2_ub", "vector", "mte3")  # the pipeline's queues and units
CORE_KINDS = ("vector", "cube", "mixed")  # mixed: one cube core driving its two vector cores
GM_BEST_ALIGNMENT = 512  # GM row starts aligned to this move at the full rate (Atlas A2)
# estimate (no public measurement found): one cross-core handshake through GM, an atomic on a flag
# at L2 plus the fence (dcci/dsb) that makes the other cores' writes visible: ~900 cycles at
# 1.8 GHz. Ascend C's soft SyncAll is this GM flag-and-poll protocol (CANN pto-isa SYNCALL.md);
# a hwprofile may give its own `gm_sync_seconds`.
GM_SYNC_SECONDS = 0.5e-6
UNALIGNED_TABLES = ("per_tile", "lead", "setup", "exposed", "first_load")
# a schedule's tables of QUEUES bytes / WORK units and their DMA instruction counts (per_tile required)
WORK_TABLES = ("per_tile", "setup", "transfers", "setup_transfers", "lead", "lead_transfers", "exposed",
               "exposed_transfers", "first_load", "first_load_transfers")


class ScheduleError(PortkernError):
    """A variant's schedule() returned something the cost model cannot read."""


@dataclass(frozen=True)
class Chip:
    """The rates and capacities the model needs, read from the hwprofile's limits."""

    clock_hz: float
    cube_cores: int
    vector_cores: int
    hbm_bandwidth: float
    l2_bandwidth: float
    l2_bytes: float
    core_gm_bandwidth: float  # bytes/s one core's MTE2 reads from GM (L2 hits) at best
    ub_gm_bandwidth: float  # bytes/s one vector core's MTE3 writes UB -> GM at best
    fixpipe_gm_bandwidth: float  # bytes/s one cube core's FIXPIPE writes L0C -> GM at best (GM side)
    mte1_bytes_per_cycle: float
    fixpipe_bytes_per_cycle: float
    cube_macs_per_cycle: Mapping[str, float]
    vector_bytes_per_cycle: float
    dma_setup_bytes: float  # per DMA instruction, in bytes of transfer time at the core's rate
    unaligned_gm_efficiency: float  # rate of GM rows aligned to 32 B but not 512 B
    launch_seconds: float
    capacity: Mapping[str, float]  # ub, l1, l0a, l0b, l0c bytes
    ub_alignment: int
    mixed_alignment: int
    gm_sync_seconds: float = GM_SYNC_SECONDS  # one cross-core handshake through GM (estimate)

    @classmethod
    def from_profile(cls, profile: HwProfile) -> "Chip":
        limit = profile.limit
        clock = limit("clock_hz")
        read = limit("core_gm_bandwidth")
        # the write rates default to the read rate (a profile that gives one GM rate per core)
        return cls(
            clock_hz=clock, cube_cores=int(limit("cube_cores")), vector_cores=int(limit("vector_cores")),
            hbm_bandwidth=profile.mem_bandwidth, l2_bandwidth=limit("l2_bandwidth"),
            l2_bytes=limit("l2_bytes"), core_gm_bandwidth=read,
            ub_gm_bandwidth=profile.limits.get("ub_gm_bandwidth", read),
            fixpipe_gm_bandwidth=profile.limits.get("fixpipe_gm_bandwidth", read),
            mte1_bytes_per_cycle=limit("mte1_bytes_per_cycle"),
            fixpipe_bytes_per_cycle=limit("fixpipe_bytes_per_cycle"),
            # from the profile's peaks, so the model can never run the cube faster than the roofline
            cube_macs_per_cycle={dtype: profile.peak(dtype) / (2 * limit("cube_cores") * clock)
                                 for dtype in ("float16", "float32")},
            vector_bytes_per_cycle=limit("vector_bytes_per_cycle"),
            dma_setup_bytes=limit("dma_setup_bytes"),
            unaligned_gm_efficiency=limit("unaligned_gm_efficiency"),
            launch_seconds=limit("launch_seconds"),
            capacity={m: limit(f"{m}_bytes") for m in MEMORIES},
            ub_alignment=int(limit("ub_alignment")), mixed_alignment=int(limit("mixed_alignment")),
            gm_sync_seconds=float(profile.limits.get("gm_sync_seconds", GM_SYNC_SECONDS)),
        )

    def cores(self, core_kind: str) -> int:
        """Physical cores a program of this kind occupies one of."""
        return self.vector_cores if core_kind == "vector" else self.cube_cores


@dataclass(frozen=True)
class Schedule:
    """One program's declared data movement and work (what `schedule()` in a kernel module returns)."""

    core: str
    programs: int  # programs launched (the grid)
    tiles: int  # tile-loop trips of the busiest program
    total_tiles: int  # tile-loop trips summed over all programs
    buffers: int  # 1 = serial, 2 = double, 3 = triple buffering
    per_tile: Mapping[str, float]  # QUEUES bytes and WORK units of one trip
    transfers: Mapping[str, float]  # DMA instructions per trip, per queue (default 1 if bytes move)
    live: Mapping[str, float]  # MEMORIES bytes live at once in one program (all buffers)
    tails: Mapping[str, tuple[int, ...]]  # per memory ('ub', 'l1'): innermost-axis bytes of each tile
    gm_alignment: int  # the largest power of two <= 512 dividing every GM row start touched
    footprint_bytes: float  # distinct GM bytes the launch touches (what HBM must move)
    cube_dtype: str = "float16"
    vector_op_bytes: int = 4  # element width the vector unit computes in
    setup: Mapping[str, float] = field(default_factory=dict)  # once per program (e.g. gamma loads)
    setup_transfers: Mapping[str, float] = field(default_factory=dict)  # its DMA instructions (default 1)
    lead_tiles: int = 0  # trips of the busiest program that also carry `lead`
    # extra QUEUES bytes / WORK units of a lead trip; negative: what a lead trip does not carry (the
    # epilogue of tiles that have not finished yet), at most every trip's
    lead: Mapping[str, float] = field(default_factory=dict)
    lead_transfers: Mapping[str, float] = field(default_factory=dict)  # its extra DMA instructions
    serial: tuple[str, ...] = ()  # stage names (as in Estimate.stage_seconds) that cannot overlap
    load_trips: int = 1  # trips one GM load of the first (lead) trips feeds: the pipeline fills by whole loads
    exposed: Mapping[str, float] = field(default_factory=dict)  # QUEUES bytes / WORK units no trip overlaps
    exposed_transfers: Mapping[str, float] = field(default_factory=dict)  # its DMA instructions (default 1)
    exposed_chunks: int = 1  # the vector side streams the exposed work in this many chunks (pipelined)
    first_load: Mapping[str, float] = field(default_factory=dict)  # bytes the first trip waits for in all
    first_load_transfers: Mapping[str, float] = field(default_factory=dict)  # its DMA instructions
    # per table ("per_tile", "lead", "setup", "exposed", "first_load"): the bytes of each queue whose
    # GM rows start misaligned although `gm_alignment` (the rows' strides) is 512: they move at the
    # unaligned rate
    unaligned: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # cross-core handshakes through GM the busiest program waits on, in series after its loop and
    # before its exposed vector work (the last split-K part: its flag, then the others' partials)
    syncs: int = 0

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> "Schedule":
        """Validate a kernel module's dict; a typo there must not become a silently wrong time."""
        required = ("core", "programs", "tiles", "total_tiles", "buffers", "per_tile", "live",
                    "tails", "gm_alignment", "footprint_bytes")
        optional = (*(name for name in WORK_TABLES if name not in required), "cube_dtype", "vector_op_bytes", "lead_tiles", "serial", "load_trips",
                    "exposed_chunks", "unaligned", "syncs")
        missing = [k for k in required if k not in raw]
        if missing:
            raise ScheduleError(f"schedule is missing {', '.join(missing)}")
        unknown_keys = set(raw) - set(required) - set(optional)
        if unknown_keys:
            raise ScheduleError(f"schedule has unknown keys {sorted(unknown_keys)}")
        if raw["core"] not in CORE_KINDS:
            raise ScheduleError(f"schedule core must be one of {CORE_KINDS}, not {raw['core']!r}")
        known = set(QUEUES) | set(WORK)
        for name, table in (*((name, raw.get(name, {})) for name in WORK_TABLES),
                            *((f"unaligned {t}", q) for t, q in raw.get("unaligned", {}).items())):
            unknown = set(table) - known
            if unknown:
                raise ScheduleError(f"schedule {name} has unknown entries {sorted(unknown)}")
        unknown_tables = set(raw.get("unaligned", {})) - set(UNALIGNED_TABLES)
        if unknown_tables:
            raise ScheduleError(f"schedule unaligned names unknown tables {sorted(unknown_tables)}")
        unknown_memories = (set(raw["live"]) | set(raw["tails"])) - set(MEMORIES)
        if unknown_memories:
            raise ScheduleError(f"schedule live/tails name unknown memories {sorted(unknown_memories)}")
        if int(raw["programs"]) < 1 or int(raw["buffers"]) < 1 or int(raw["tiles"]) < 0:
            raise ScheduleError("schedule needs programs >= 1, buffers >= 1, tiles >= 0")
        if not 0 <= int(raw.get("lead_tiles", 0)) <= int(raw["tiles"]):
            raise ScheduleError("schedule lead_tiles must lie between 0 and tiles")
        if any(float(v) < 0 and float(v) < -float(raw["per_tile"].get(k, 0.0)) * (1 + 1e-9)
               for k, v in raw.get("lead", {}).items()):
            raise ScheduleError("schedule lead may take away at most what every trip carries")
        if int(raw.get("load_trips", 1)) < 1 or int(raw.get("exposed_chunks", 1)) < 1:
            raise ScheduleError("schedule needs load_trips >= 1 and exposed_chunks >= 1")
        if int(raw.get("syncs", 0)) < 0:
            raise ScheduleError("schedule needs syncs >= 0")
        unknown_stages = set(raw.get("serial", ())) - set(STAGES)
        if unknown_stages:
            raise ScheduleError(f"schedule serial names unknown stages {sorted(unknown_stages)}")
        return cls(
            core=raw["core"], programs=int(raw["programs"]), tiles=int(raw["tiles"]),
            total_tiles=int(raw["total_tiles"]), buffers=int(raw["buffers"]),
            **{name: {k: float(v) for k, v in raw.get(name, {}).items()} for name in WORK_TABLES},
            live={k: float(v) for k, v in raw["live"].items()},
            tails={memory: tuple(int(t) for t in sizes) for memory, sizes in raw["tails"].items()},
            gm_alignment=int(raw["gm_alignment"]),
            footprint_bytes=float(raw["footprint_bytes"]), cube_dtype=str(raw.get("cube_dtype", "float16")),
            vector_op_bytes=int(raw.get("vector_op_bytes", 4)),
            lead_tiles=int(raw.get("lead_tiles", 0)), serial=tuple(str(stage) for stage in raw.get("serial", ())),
            load_trips=int(raw.get("load_trips", 1)), exposed_chunks=int(raw.get("exposed_chunks", 1)),
            unaligned={table: {k: float(v) for k, v in queues.items()}
                       for table, queues in raw.get("unaligned", {}).items()},
            syncs=int(raw.get("syncs", 0)),
        )

    def bytes_per_tile(self, queues: tuple[str, ...]) -> float:
        return sum(self.per_tile.get(q, 0.0) for q in queues)


def violations(schedule: Schedule, chip: Chip) -> list[str]:
    """Why this schedule cannot run on the chip: too many programs, on-chip overflow, bad alignment."""
    reasons = []
    cores = chip.cores(schedule.core)
    if schedule.programs > cores:
        unit = "cube" if schedule.core == "mixed" else schedule.core
        reasons.append(f"grid of {schedule.programs} programs exceeds the {cores} {unit} cores "
                       "(one program per physical core; loop over tiles inside)")
    for memory in MEMORIES:
        live = schedule.live.get(memory, 0.0)
        if live > chip.capacity[memory]:
            reasons.append(f"live tiles need {int(live)} B of {memory.upper()} "
                           f"but it holds {int(chip.capacity[memory])} B")
    for memory, tails in schedule.tails.items():
        # UB tiles of a cube+vector kernel are exchanged with the cube: 512 B; otherwise 32 B
        alignment = chip.mixed_alignment if memory == "ub" and schedule.core == "mixed" else chip.ub_alignment
        misaligned = [t for t in tails if t % alignment]
        if misaligned:
            kind = "cube+vector kernel" if alignment == chip.mixed_alignment else "on-chip"
            reasons.append(f"{memory.upper()} tile tail axis of {misaligned[0]} B is not {alignment}-byte aligned "
                           f"({kind} rule)")
    return reasons


def _gm_rate(schedule: Schedule, chip: Chip) -> float:
    """One core's GM rate: misaligned rows cost up to 30% (Ascend C best-practice measurements)."""
    aligned = schedule.gm_alignment % GM_BEST_ALIGNMENT == 0
    return chip.core_gm_bandwidth * (1.0 if aligned else chip.unaligned_gm_efficiency)


def _shared_seconds_per_byte(schedule: Schedule, chip: Chip, active: int) -> float:
    """Seconds per GM byte for one program when `active` programs share L2 and HBM."""
    traffic = schedule.total_tiles * schedule.bytes_per_tile(GM_QUEUES)
    traffic += schedule.programs * sum(schedule.setup.get(q, 0.0) + schedule.lead_tiles * schedule.lead.get(q, 0.0)
                                       + schedule.exposed.get(q, 0.0) for q in GM_QUEUES)
    if traffic <= 0:
        return 0.0
    fits_l2 = schedule.footprint_bytes <= chip.l2_bytes
    hbm_bytes = min(traffic, schedule.footprint_bytes) if fits_l2 else traffic
    hbm_fraction = hbm_bytes / traffic
    return active * max(hbm_fraction / chip.hbm_bandwidth, 1.0 / chip.l2_bandwidth)


def _stage_seconds(work: Mapping[str, float], transfers: Mapping[str, float], schedule: Schedule,
                   chip: Chip, shared_per_byte: float, unaligned: Mapping[str, float] | None = None) -> dict[str, float]:
    """Seconds each queue/unit is busy for one batch of work (a tile, or a program's setup).

    In a mixed program the cube core's queues (MTE2 to L1, MTE1, FIXPIPE) and its two vector
    cores' queues (MTE2 to UB, MTE3) run side by side; the vector side has twice the units.
    """
    gm_rate = _gm_rate(schedule, chip)
    scale = gm_rate / chip.core_gm_bandwidth  # the alignment's cost applies to writes too
    vector_units = 2 if schedule.core == "mixed" else 1
    slow = 1.0 / chip.unaligned_gm_efficiency - 1.0  # extra time of a misaligned byte, in aligned bytes

    def dma(queue: str, rate: float) -> float:
        moved = work.get(queue, 0.0)
        if moved <= 0:
            return 0.0
        count = transfers.get(queue, 1.0)
        extra = slow * min((unaligned or {}).get(queue, 0.0), moved) if queue in GM_QUEUES and scale == 1.0 else 0.0
        return (moved + extra + count * chip.dma_setup_bytes) / rate

    macs_per_cycle = chip.cube_macs_per_cycle.get(schedule.cube_dtype, chip.cube_macs_per_cycle["float32"])
    gm_bytes = sum(work.get(q, 0.0) for q in GM_QUEUES)
    return {
        "mte2_l1": dma("gm_to_l1", gm_rate),
        "mte1": dma("l1_to_l0", chip.mte1_bytes_per_cycle * chip.clock_hz),
        "cube": work.get("cube_macs", 0.0) / (macs_per_cycle * chip.clock_hz),
        "fixpipe": dma("l0c_to_gm", min(chip.fixpipe_bytes_per_cycle * chip.clock_hz, chip.fixpipe_gm_bandwidth * scale)),
        "mte2_ub": dma("gm_to_ub", gm_rate * vector_units),
        "vector": work.get("vector_ops", 0.0) * schedule.vector_op_bytes
        / (chip.vector_bytes_per_cycle * chip.clock_hz * vector_units),
        "mte3": dma("ub_to_gm", chip.ub_gm_bandwidth * scale * vector_units),
        "gm": gm_bytes * shared_per_byte,  # this program's share of L2/HBM: a limit, not a queue
    }


@dataclass(frozen=True)
class _Trip:
    """One tile-loop trip: per-stage seconds, its lifetime (all stages in turn) and steady cost."""

    stages: dict[str, float]
    lifetime: float
    steady: float
    bound: str


def _trip(work: Mapping[str, float], transfers: Mapping[str, float], schedule: Schedule, chip: Chip,
          shared_per_byte: float, unaligned: Mapping[str, float] | None = None) -> _Trip:
    stages = _stage_seconds(work, transfers, schedule, chip, shared_per_byte, unaligned)
    if schedule.serial:  # one resource held in turn: its stages add up into one
        stages["+".join(schedule.serial)] = sum(stages.pop(name) for name in schedule.serial)
    lifetime = sum(v for k, v in stages.items() if k != "gm")  # one tile from its first load to its last store
    busiest = max(stages, key=lambda k: stages[k])
    steady = max(stages[busiest], lifetime / schedule.buffers)
    return _Trip(stages, lifetime, steady, busiest if stages[busiest] >= lifetime / schedule.buffers else "pipeline")


def _with_lead(schedule: Schedule) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """A lead trip's work, DMA instructions and misaligned bytes: every trip's plus the lead's
    (DMAs default to 1)."""
    work, transfers = dict(schedule.per_tile), {}
    for queue in QUEUES:
        for table, dmas in ((schedule.per_tile, schedule.transfers), (schedule.lead, schedule.lead_transfers)):
            if table.get(queue, 0.0) > 0:
                transfers[queue] = transfers.get(queue, 0.0) + dmas.get(queue, 1.0)
    for name, amount in schedule.lead.items():
        work[name] = max(0.0, work.get(name, 0.0) + amount)
        if work[name] == 0.0:
            transfers.pop(name, None)
    unaligned = dict(schedule.unaligned.get("per_tile", {}))
    for queue, amount in schedule.unaligned.get("lead", {}).items():
        unaligned[queue] = unaligned.get(queue, 0.0) + amount
    return work, transfers, unaligned


READ_STAGES = ("mte2_l1", "mte2_ub", "gm")


def _fill_seconds(first: _Trip, load_trips: int, first_load: Mapping[str, float] | None) -> float:
    """What whole loads add to the first trip's lifetime, which holds one trip's reads.

    The trips of a load wait for all of it. Where the first trips are bound by their GM reads (a
    GEMM's panel streaming in beside its first tile), the cube runs the trips of the lead's last
    load after it arrives: `load_trips - 1` trips of the rest are exposed. Where the cube is the
    slower side, the reads run ahead and only the first wait counts: the first trip waits for all
    of `first_load` (by default `load_trips` trips' reads).
    """
    read = max(first.stages.get(name, 0.0) for name in READ_STAGES)
    rest = max((v for k, v in first.stages.items() if k not in READ_STAGES), default=0.0)
    if read >= rest:
        return (load_trips - 1) * rest
    waited = load_trips * read if first_load is None else max(first_load.get(name, 0.0) for name in READ_STAGES)
    return max(0.0, waited - read)


def _exposed_seconds(schedule: Schedule, chip: Chip, shared_per_byte: float) -> float:
    """Work no trip overlaps (the last tile's drain and epilogue): the cube core's part in turn,
    then `syncs` handshakes with the other cores, then the vector side streaming its part in
    `exposed_chunks` chunks, pipelined across them."""
    handshakes = schedule.syncs * chip.gm_sync_seconds
    if not schedule.exposed:
        return handshakes
    stages = _stage_seconds(schedule.exposed, schedule.exposed_transfers, schedule, chip, shared_per_byte,
                            schedule.unaligned.get("exposed"))
    cube_side = sum(stages[name] for name in ("mte2_l1", "mte1", "cube", "fixpipe"))
    vector_side = [stages[name] for name in ("mte2_ub", "vector", "mte3")]
    chunks = schedule.exposed_chunks
    pipelined = sum(vector_side) / chunks + (chunks - 1) * max(vector_side) / chunks
    return max(cube_side + pipelined, stages["gm"]) + handshakes


@dataclass(frozen=True)
class Estimate:
    """A modeled launch: its time and where the time goes (all simulated)."""

    seconds: float
    program_seconds: float
    steady_tile_seconds: float
    first_tile_seconds: float
    lead_tile_seconds: float  # steady cost of a lead trip (0 without lead trips)
    stage_seconds: Mapping[str, float]  # per tile, per queue/unit (incl. the shared 'gm' share)
    bound: str  # the stage that sets the steady-state rate ('pipeline' when buffers are too few)
    waves: int
    exposed_seconds: float = 0.0  # after the loop, overlapped by nothing (the last tile's drain)

    def to_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "program_seconds": self.program_seconds,
                "steady_tile_seconds": self.steady_tile_seconds,
                "first_tile_seconds": self.first_tile_seconds, "lead_tile_seconds": self.lead_tile_seconds,
                "stage_seconds": dict(self.stage_seconds), "bound": self.bound, "waves": self.waves,
                "exposed_seconds": self.exposed_seconds,
                "cost_model": COST_MODEL_VERSION, "simulated": True}


def simulate(schedule: Schedule, chip: Chip) -> Estimate:
    """Modeled seconds of one launch. Deterministic: the same schedule always costs the same."""
    cores = chip.cores(schedule.core)
    active = min(schedule.programs, cores)
    waves = math.ceil(schedule.programs / cores)
    shared = _shared_seconds_per_byte(schedule, chip, active)
    trip = _trip(schedule.per_tile, schedule.transfers, schedule, chip, shared, schedule.unaligned.get("per_tile"))
    if schedule.lead_tiles:
        work, transfers, unaligned = _with_lead(schedule)
        lead = _trip(work, transfers, schedule, chip, shared, unaligned)
    else:
        lead = trip
    setup_stages = _stage_seconds(schedule.setup, schedule.setup_transfers, schedule, chip, shared,
                                  schedule.unaligned.get("setup"))
    first_load = None
    if schedule.first_load:
        first_load = _stage_seconds(schedule.first_load, schedule.first_load_transfers, schedule, chip, shared,
                                    schedule.unaligned.get("first_load"))
    setup = max(sum(v for k, v in setup_stages.items() if k != "gm"), setup_stages["gm"])
    loop = first = 0.0
    if schedule.tiles > 0:  # the first trip runs alone (prologue + epilogue); lead trips come first
        leading = max(schedule.lead_tiles, 1)
        first = lead.lifetime + _fill_seconds(lead, min(schedule.load_trips, schedule.tiles), first_load)
        first = max(first, lead.stages["gm"])  # the first trip's bytes share L2/HBM like every other's
        loop = first + (leading - 1) * lead.steady + (schedule.tiles - leading) * trip.steady
    exposed = _exposed_seconds(schedule, chip, shared)
    program = setup + loop + exposed
    return Estimate(seconds=chip.launch_seconds + waves * program, program_seconds=program,
                    steady_tile_seconds=trip.steady, first_tile_seconds=first,
                    lead_tile_seconds=lead.steady if schedule.lead_tiles else 0.0, stage_seconds=trip.stages,
                    bound=trip.bound, waves=waves, exposed_seconds=exposed)


def roofline_seconds(flops: float, nbytes: float, dtype: str, profile: HwProfile) -> float:
    """The simulated floor: one launch plus the profile's roofline (no kernel can beat it)."""
    return profile.limit("launch_seconds") + profile.floor_seconds(flops, nbytes, dtype)
