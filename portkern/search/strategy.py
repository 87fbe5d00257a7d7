"""The search: one Optuna study per workload and variant set, ask -> build -> verify -> time -> tell.

The space is categorical over variants, each with its own (conditional) parameters. Seeds are
enqueued first: each variant's default and the best configuration of the nearest tuned shape; each
new best enqueues its on/off-switch neighbours.
A configuration already measured (same source, same config) is never measured again: its recorded
result is told to the study instead. A search stops at the trial budget, the deadline, when the best
time is within `floor_margin` of the roofline floor, or after `patience` trials without a gain.
With a CompilePool, trials are asked ahead and built in parallel while the runner verifies and
times one at a time (the only process that touches the device).
"""
from __future__ import annotations

import itertools
import os
import socket
import json
import logging
import math
import random
import time
import warnings
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import optuna

from ..backends.base import Artifact, Backend, Candidate, Variant
from ..measure import MeasureOptions
from ..verify import GateOptions
from ..tasks import Task
from .records import RecordLog, TrialRecord
from .worker import CompilePool, TrialJob

optuna.logging.set_verbosity(optuna.logging.WARNING)
log = logging.getLogger("portkern.search")

FAILED_VALUE = 1e3  # seconds told to the study for a failed trial: worse than any real kernel
# trials left RUNNING by a killed tune on this host are failed on resume; other hosts' are theirs
_WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


class Runner(Protocol):
    def run(self, job: TrialJob) -> tuple[TrialRecord, Artifact | None]: ...

    def prepare(self, job: TrialJob) -> None:
        """Start what the job's trial needs before its candidate (building elsewhere) arrives."""


@dataclass(frozen=True)
class SearchOptions:
    trials: int = 40  # per workload
    deadline: float | None = None  # time.time() after which no trial starts
    patience: int = 16  # trials without a gain larger than the noise before stopping
    floor_margin: float = 0.1  # stop once best <= floor * (1 + margin)
    # the least time a kernel of this task is measured at, where longer than the roofline floor (a
    # launch-bound task: HwProfile.reachable_seconds); reaching it stops the search the same way
    reachable_seconds: float = 0.0
    sampler: str = "tpe"  # tpe | random; small spaces are enumerated whatever this says
    seed: int = 0
    max_duplicates: int = 50  # consecutive already-measured samples: the space is exhausted
    # stop once best <= this: the cost model's best of the space, where the backend's time is
    # that model (model_ranked); None elsewhere
    model_best_seconds: float | None = None


@dataclass
class SearchResult:
    task: Task
    best: TrialRecord | None
    artifact: Artifact | None
    records: list[TrialRecord] = field(default_factory=list)
    measured: int = 0
    duplicates: int = 0
    invalid: int = 0  # rejected by constraints before compiling: cheap, not charged to the budget
    stop_reason: str = ""
    wall_seconds: float = 0.0


ProgressFn = Callable[[Task, TrialRecord, "TrialRecord | None", int, int], None]


def space_size(variants: Sequence[Variant]) -> int:
    return sum(math.prod(len(c) for c in v.space.values()) for v in variants)


def all_configs(variant: Variant) -> Iterable[dict[str, Any]]:
    names = list(variant.space)
    for values in itertools.product(*(variant.space[n] for n in names)):
        yield dict(zip(names, values))


MODEL_RANKED_SEEDS = 3  # the cost model's best configurations tried first, where there is one
MAX_RANKED = 20_000  # configurations ranked at most per task (a seeded sample of a larger space)


def model_ranked(backend: Backend, task: Task, variants: Sequence[Variant],
                 count: int = MODEL_RANKED_SEEDS, seed: int = 0) -> list[tuple[float, Candidate]]:
    """Where the backend knows a candidate's time before it runs (a simulated chip's cost model:
    Backend.predicted_seconds), the `count` configurations it ranks fastest with their predicted
    seconds, best first: seeds, so the slow part of a trial (the gate, in an interpreter there) is
    spent on them first. Every one still passes the gate before its time counts. Empty for a
    backend without a model."""
    if all(backend.predicted_seconds(Candidate.of(v, v.default), task) is None for v in variants):
        return []
    rng = random.Random(seed)
    share = max(1, MAX_RANKED // max(1, len(variants)))
    ranked: list[tuple[float, int, Candidate]] = []
    for variant in variants:
        size = math.prod(len(choices) for choices in variant.space.values())
        if size > share:  # said out loud: a sample can miss the model's best (seen on the NPU GEMM)
            log.warning("%s: the cost model ranks a sample of %d of its %d configurations for %s",
                        variant.name, share, size, task.label)
        configs: Iterable[dict[str, Any]] = all_configs(variant) if size <= share else (
            {name: rng.choice(choices) for name, choices in variant.space.items()} for _ in range(share))
        for config in configs:
            candidate = Candidate.of(variant, config)
            predicted = backend.predicted_seconds(candidate, task)
            if predicted is not None:
                ranked.append((predicted, len(ranked), candidate))
    ranked.sort(key=lambda item: item[:2])
    return [(predicted, candidate) for predicted, _, candidate in ranked[:count]]


def completed_config(variant: Variant, config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A seed's config as this variant's space holds it, or None where it does not fit: what a
    seed from another shape, round or an older library must be to be enqueued. Parameters the
    variant gained since the seed was measured take their defaults (a new parameter's default
    keeps the old behaviour, the one measured); a value outside the space is no seed."""
    if not set(config) <= set(variant.space):
        return None
    full = {**variant.default, **config}
    return full if all(full[p] in choices for p, choices in variant.space.items()) else None


def _params(variant: Variant, config: Mapping[str, Any]) -> dict[str, Any]:
    return {"variant": variant.name, **{f"{variant.name}:{k}": v for k, v in config.items()}}


def switch_neighbours(candidate: Candidate) -> list[dict[str, Any]]:
    """The configs one on/off switch away from the candidate's. A switch (TMA_STORE, FLATTEN,
    HALF_TAIL, ...) often pays only on top of the right tile, and a tile found late in a short
    search rarely gets its switches sampled: they are tried next, after each new best."""
    space = candidate.variant.space
    return [{**candidate.params, name: not value} for name, value in candidate.params.items()
            if isinstance(value, bool) and set(space.get(name, ())) == {False, True}]


def study_name(task: Task, backend: str, variants: Sequence[Variant]) -> str:
    """A changed variant library is a new study (its space changed: its source, its parameters or
    their choices, which the task and target can pin); records still dedupe."""
    import hashlib

    blob = json.dumps(sorted((v.name, v.source_hash, sorted(v.space.items())) for v in variants), default=str)
    return f"{task.key}:{backend}:{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


class ArtifactStore:
    """Artifacts of successful trials on disk, so a resumed tune can pack without recompiling."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def save(self, key: str, artifact: Artifact) -> None:
        folder = self.root / key
        folder.mkdir(parents=True, exist_ok=True)
        if artifact.binary is not None:
            (folder / (artifact.binary_name or "kernel.bin")).write_bytes(artifact.binary)
        meta = {"backend": artifact.backend, "variant": artifact.variant, "config": artifact.config,
                "binary_name": artifact.binary_name if artifact.binary is not None else "",
                "meta": artifact.meta}
        (folder / "source.txt").write_text(artifact.source)
        (folder / "artifact.json").write_text(json.dumps(meta, indent=1, default=str))

    def load(self, key: str) -> Artifact | None:
        folder = self.root / key
        if not (folder / "artifact.json").exists():
            return None
        meta = json.loads((folder / "artifact.json").read_text())
        binary = (folder / meta["binary_name"]).read_bytes() if meta["binary_name"] else None
        return Artifact(backend=meta["backend"], variant=meta["variant"], config=meta["config"],
                        source=(folder / "source.txt").read_text(), binary=binary,
                        binary_name=meta["binary_name"], meta=meta["meta"])


def _abandoned(worker: str) -> bool:
    """A RUNNING trial whose tuner process on this host is gone (killed mid-trial)."""
    host, _, pid = worker.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _value(record: TrialRecord) -> float:
    return record.seconds if record.seconds is not None else FAILED_VALUE


def _better(record: TrialRecord, best: TrialRecord | None) -> bool:
    """A gain counts only if larger than the best's own spread (noise is not a gain)."""
    if record.seconds is None:
        return False
    if best is None or best.seconds is None:
        return True
    noise = best.measurement.spread if best.measurement else 0.0
    return record.seconds < best.seconds * (1 - min(noise, 0.05))


@dataclass
class _InFlight:
    trial: Any  # optuna.Trial
    key: str
    job: TrialJob
    ticket: int | None  # the compile pool's, None without a pool


def _measure(item: _InFlight, runner: Runner, pool: CompilePool | None, backend: str,
             deadline: float | None, first: bool) -> tuple[TrialRecord, Artifact | None] | None:
    """The trial's verdict and time: built by the pool first where there is one. None if its
    build is still running at the deadline (time.time()): a new variant's first build can take
    seconds past a search's time slice."""
    if item.ticket is None:
        return runner.run(item.job)
    assert pool is not None  # a ticket is the pool's
    if first:  # the gate's references for the task, while its first candidate builds
        runner.prepare(item.job)
    waited = time.perf_counter()
    until = None if deadline is None else waited + max(0.0, deadline - time.time())
    built = pool.collect(item.ticket, until=until)
    if built is None:
        return None
    artifact, status, reason = built
    waited = time.perf_counter() - waited
    if artifact is None:
        record = item.job.record(backend, status, reason)
        record.wall_seconds = waited
        return record, None
    record, artifact = runner.run(replace(item.job, artifact=artifact))
    record.phases["wait"] = waited
    record.wall_seconds += waited
    return record, artifact


def _stop_reason(result: SearchResult, options: SearchOptions, floor_seconds: float, since_gain: int,
                 consecutive_duplicates: int, in_flight: int, size: int) -> tuple[str | None, bool]:
    """Why no further trial starts (None: go on), and whether the trials in flight still finish."""
    best = result.best
    # the deadline first: a budget filled by trials still building must not outlast it
    if options.deadline is not None and time.time() >= options.deadline:
        return "time budget spent", False
    # a modeled clock's best first: it is exact where the floors are bounds
    if best is not None and best.seconds is not None and options.model_best_seconds is not None \
            and best.seconds <= options.model_best_seconds:
        return "at the cost model's best of the space", False
    reachable = max(floor_seconds, options.reachable_seconds)
    if best is not None and best.seconds is not None and reachable > 0 \
            and best.seconds <= reachable * (1 + options.floor_margin):
        floor = "roofline" if reachable == floor_seconds else "launch"
        return f"within {options.floor_margin:.0%} of the {floor} floor", False
    if result.measured + in_flight >= options.trials:
        return f"trial budget ({options.trials}) spent", True
    if since_gain >= options.patience:
        return f"no gain in {options.patience} trials", False
    if consecutive_duplicates >= options.max_duplicates or \
            result.duplicates + result.measured + result.invalid + in_flight >= size + options.max_duplicates:
        return "space exhausted", True
    if result.invalid >= max(50, 4 * options.trials):
        return "the space is mostly invalid for this task", True
    return None, True


class VariantAllocator:
    """Which variant the next trial samples: the one asked least so far among those still in the
    running (fewer than MIN_TRIALS measured, or a best within KEEP_RATIO of the best of all).

    Left to TPE, the categorical variant choice locks onto whichever variant its first good
    samples came from: replayed on an H200 GEMM table (2026-12-03) it gave gemm_tiled 249 of 258
    trials while gemm_tma held the best configurations, and missed the best within 30% of the
    grid on 3 of 10 shapes; balanced this way, on 1 of 10. An enqueued seed keeps its variant."""

    MIN_TRIALS = 4
    KEEP_RATIO = 1.5

    def __init__(self, names: Sequence[str], records: Sequence[TrialRecord]) -> None:
        self.names = list(names)
        self.records = records  # the search's measured records, as it appends them
        self.asked_count = {name: 0 for name in self.names}

    def asked(self, name: str) -> None:
        self.asked_count[name] += 1

    def next(self) -> str:
        best: dict[str, float] = {}
        measured = {name: 0 for name in self.names}
        for record in self.records:
            if record.variant in measured and record.status != "invalid":
                measured[record.variant] += 1
                if record.seconds is not None:
                    best[record.variant] = min(best.get(record.variant, math.inf), record.seconds)
        overall = min(best.values(), default=math.inf)
        running = [n for n in self.names
                   if measured[n] < self.MIN_TRIALS or best.get(n, math.inf) <= overall * self.KEEP_RATIO]
        return min(running or self.names, key=lambda n: (self.asked_count[n], self.names.index(n)))


def search_workload(task: Task, variants: Sequence[Variant], runner: Runner, *,
                    storage: str | optuna.storages.BaseStorage,
                    log: RecordLog, store: ArtifactStore, floor_seconds: float, backend: str,
                    options: SearchOptions, seeds: Sequence[Candidate] = (),
                    gate: GateOptions = GateOptions(), measure: MeasureOptions = MeasureOptions(),
                    progress: ProgressFn | None = None, pool: CompilePool | None = None) -> SearchResult:
    """Tune one workload over `variants` with up to `options.trials` new measurements. With a
    compile pool, as many trials as it has workers are asked ahead (TPE's constant liar keeps
    them apart) and built there while the runner verifies and times the oldest."""
    started = time.time()
    result = SearchResult(task=task, best=None, artifact=None)
    by_name = {v.name: v for v in variants}
    if not by_name:
        result.stop_reason = "no variants"
        return result
    known: dict[str, TrialRecord] = {}
    for record in log:  # resume, and never re-measure what any earlier study measured
        if record.task_key == task.key and record.backend == backend:
            known[record.candidate_key] = record
            if record.variant in by_name and _better(record, result.best):
                result.best = record
    if result.best is not None:
        result.artifact = store.load(result.best.candidate_key)
    sampler: optuna.samplers.BaseSampler
    if options.sampler == "random":
        sampler = optuna.samplers.RandomSampler(seed=options.seed)
    else:
        with warnings.catch_warnings():  # multivariate/group are marked experimental in Optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=options.seed, multivariate=True, group=True,
                                                 constant_liar=True, n_startup_trials=8)
    study = optuna.create_study(study_name=study_name(task, backend, variants), storage=storage,
                                direction="minimize", sampler=sampler, load_if_exists=True)
    allocator = VariantAllocator(list(by_name), result.records) if options.sampler != "random" else None
    # what other workers sharing this storage measured (a distributed tune): told, never re-measured
    measured_elsewhere: dict[str, float] = {}
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        key = frozen.user_attrs.get("candidate_key")
        if key and key not in known and frozen.value is not None:
            measured_elsewhere[key] = frozen.value
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if _abandoned(frozen.user_attrs.get("worker", "")):
            study.tell(frozen.number, state=optuna.trial.TrialState.FAIL)  # interrupted by a kill
    seeded = list(seeds) + [Candidate.of(v, v.default) for v in variants]
    if space_size(variants) <= options.trials:  # small space: measure all of it (grid)
        seeded += [Candidate.of(v, c) for v in variants for c in all_configs(v)]
    for candidate in seeded:
        variant = by_name.get(candidate.variant.name)
        config = completed_config(variant, candidate.params) if variant is not None else None
        if config is not None:
            study.enqueue_trial(_params(variant, config), skip_if_exists=True)
    names = sorted(by_name)
    since_gain = 0
    consecutive_duplicates = 0
    pending: deque[_InFlight] = deque()  # asked, building in the pool (at most one without a pool)
    while True:
        reason, finish_in_flight = _stop_reason(result, options, floor_seconds, since_gain,
                                                consecutive_duplicates, len(pending), space_size(variants))
        if pool is not None and reason is None and not pending:
            pool.wait_idle()  # every worker still finishing an earlier search's abandoned build
        room = pool.idle() if pool is not None else not pending
        if reason is None and room:
            if allocator is not None:  # TPE then samples the chosen variant's parameters
                with warnings.catch_warnings():  # PartialFixedSampler is marked experimental
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                    study.sampler = optuna.samplers.PartialFixedSampler({"variant": allocator.next()}, sampler)
            trial = study.ask()
            variant = by_name[trial.suggest_categorical("variant", names)]
            if allocator is not None:
                allocator.asked(variant.name)
            config = {p: trial.suggest_categorical(f"{variant.name}:{p}", list(choices))
                      for p, choices in variant.space.items()}
            candidate = Candidate.of(variant, config)
            key = candidate.key()
            in_flight = {item.key for item in pending}
            if key in known or key in measured_elsewhere or key in in_flight:
                trial.set_user_attr("duplicate_of", key)
                if key in in_flight:  # its value is not known yet: the sampler must not count it
                    study.tell(trial, state=optuna.trial.TrialState.FAIL)
                else:
                    study.tell(trial, _value(known[key]) if key in known else measured_elsewhere[key])
                result.duplicates += 1
                consecutive_duplicates += 1
                continue
            consecutive_duplicates = 0
            trial.set_user_attr("worker", _WORKER_ID)
            trial.set_user_attr("candidate_key", key)
            job = TrialJob(task=task, candidate=candidate, floor_seconds=floor_seconds, gate=gate, measure=measure)
            pending.append(_InFlight(trial, key, job, pool.submit(job) if pool is not None else None))
            if pool is not None and pool.idle():
                continue  # ask further ahead while compile workers are free
        if reason is not None and not finish_in_flight:
            for item in pending:  # stopped for good: what is still building is not measured
                study.tell(item.trial, state=optuna.trial.TrialState.FAIL)
                if pool is not None and item.ticket is not None:
                    pool.abandon(item.ticket)
            pending.clear()
        if not pending:
            result.stop_reason = reason or ""
            break
        item = pending.popleft()
        trial, key = item.trial, item.key
        measured = _measure(item, runner, pool, backend, options.deadline, first=not result.records)
        if measured is None:  # still building when the time ran out: not measured, the search stops
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            if pool is not None and item.ticket is not None:
                pool.abandon(item.ticket)
            continue
        record, artifact = measured
        record.number = trial.number
        trial.set_user_attr("status", record.status)
        if record.reason:
            trial.set_user_attr("reason", record.reason[:500])
        log.append(record)
        study.tell(trial, _value(record))
        known[key] = record
        result.records.append(record)
        if record.status == "invalid":
            result.invalid += 1
            continue
        result.measured += 1
        if _better(record, result.best):
            result.best = record
            since_gain = 0
            if artifact is not None:
                store.save(key, artifact)
                result.artifact = artifact
            for neighbour in switch_neighbours(item.job.candidate):
                study.enqueue_trial(_params(item.job.candidate.variant, neighbour), skip_if_exists=True)
        else:
            since_gain += 1
        if progress is not None:
            progress(task, record, result.best, result.measured, options.trials)
    result.wall_seconds = time.time() - started
    return result
