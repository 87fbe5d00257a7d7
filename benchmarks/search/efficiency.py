"""Search efficiency: how many trials portkern's search needs to get within 3% of the exhaustive
grid's best, against random search, over many shapes.

The objective of every configuration is computed once (the exhaustive grid), then each search is
replayed against that table through portkern's real strategy (search_workload: Optuna study,
seeds, dedupe, constraints): the search sees exactly the numbers a live run would, without the
wait - the same method Kernel Tuner uses to test its strategies. Without --table the grid comes
from the simulated Ascend-910B-like NPU's cost model (deterministic, runs on any CPU; `--target`
can name another target whose backend models its time).

--table FILE (repeatable) replays grids measured on real hardware instead (cpu_table.py for TVM
on this CPU; a GPU script for Triton on an H200), a JSON file:

    {"device", "target" (hwprofile name), "backend", "date", "command", "versions", "method",
     "cases": [{"case", "task": {"kind": "gemm", "m", "n", "k", "dtype", "trans_b", "bias",
                                 "activation", "residual"},
                "entries": [{"variant", "config", "seconds" (or null), "status", "reason"}],
                "complete"}]}

status is a trial status (ok, invalid, compile_error, runtime_error, rejected); a failure other
than invalid costs a trial, as in a live search. Each variant named in a case is searched over the
sub-space its entries span (per parameter, the values that occur); a candidate of that sub-space
with no entry counts as invalid. Cases not marked complete are skipped.

A search stops by the live search's own rules (budget, patience, a sampler that keeps drawing what
was measured); a seed that stops before it gets within the target counts as worse than every seed
that got there, in the median over seeds and in the median over shapes.

    python benchmarks/search/efficiency.py --out benchmarks/results/search-efficiency-npu.json
    python benchmarks/search/efficiency.py --table benchmarks/results/search-table-cpu-tvm-2026-12-03.json \
        --seeds 7 --out benchmarks/results/search-efficiency-cpu-tvm-2026-12-03.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import optuna

from portkern.backends import get_backend
from portkern.backends.base import Artifact, Backend, Candidate, Variant
from portkern.hwprofile import load_target
from portkern.priors import table_task
from portkern.search.records import Measurement, RecordLog, TrialRecord
from portkern.search.strategy import (ArtifactStore, SearchOptions, all_configs, completed_config, search_workload,
                                     space_size)
from portkern.search.worker import TrialJob
from portkern.synthetic import gemm_task, layernorm_task, rmsnorm_task, softmax_task
from portkern.tasks import Task

SHAPES: list[tuple[str, Task]] = [
    *[(f"gemm {m}x{n}x{k}", gemm_task(m, n, k, "float16", trans_b=True))
      for m, n, k in ((128, 768, 768), (512, 768, 3072), (512, 3072, 768), (2048, 768, 768), (4096, 768, 3072),
                      (4096, 3072, 768), (1024, 4096, 4096), (256, 1024, 1024), (3000, 1000, 777),
                      (4096, 4096, 11008))],
    ("gemm+bias+gelu 4096x3072x768", gemm_task(4096, 3072, 768, "float16", trans_b=True, bias=True, activation="gelu")),
    ("layernorm 4096x768", layernorm_task(4096, 768, "float16")),
    ("rmsnorm 8192x4096", rmsnorm_task(8192, 4096, "float16")),
    ("softmax 49152x128", softmax_task(49152, 128, "float16")),
]


@dataclass(frozen=True)
class Outcome:
    """What one configuration gave, as the trial a live search would have recorded."""

    status: str  # ok | invalid | compile_error | runtime_error | rejected
    seconds: float | None = None
    reason: str = ""


NOT_IN_TABLE = Outcome("invalid", None, "not in the table")


@dataclass
class Case:
    """One shape's exhaustive grid, ready to replay: the variants searched and every outcome."""

    name: str
    task: Task
    variants: list[Variant]
    outcomes: dict[str, Outcome]  # candidate key -> outcome
    backend: str
    method: str  # how the times were taken
    simulated: bool
    table_seconds: float = 0.0  # spent computing the grid here (0 for a table read from a file)


def exhaustive(backend: Backend, task: Task) -> dict[str, Outcome]:
    """Candidate key -> modeled seconds, or invalid where the target's constraints reject it."""
    table: dict[str, Outcome] = {}
    for variant in backend.variants(task):
        for config in all_configs(variant):
            candidate = Candidate.of(variant, config)
            reason = backend.check(candidate, task)
            if reason is not None:
                table[candidate.key()] = Outcome("invalid", None, reason)
                continue
            seconds = backend.modeled_seconds(backend.load(backend.compile(candidate, task), task))
            table[candidate.key()] = Outcome("ok", seconds)
    return table


def _json(value: Any) -> str:
    """A config value as the table file spells it (tuples read back as lists)."""
    return json.dumps(value)


def sub_space(variant: Variant, configs: Sequence[Mapping[str, Any]]) -> Variant:
    """The variant over the values its table entries use, in the space's own order and types;
    replace() keeps the source, so candidate keys are those of the full variant."""
    seen = {name: {_json(c[name]) for c in configs if name in c} for name in variant.space}
    return replace(variant, space={name: tuple(v for v in values if _json(v) in seen[name])
                                   for name, values in variant.space.items()})


def table_cases(table: Mapping[str, Any]) -> Iterator[Case]:
    """The complete cases of a measured table, with the backend's variants cut to what it covers."""
    backend = get_backend(load_target(table["target"], table["backend"]))
    for case in table["cases"]:
        if not case["complete"]:
            print(f"{case['case']}: table not complete, skipped", flush=True)
            continue
        task = table_task(case["task"])
        library = {v.name: v for v in backend.variants(task)}
        # each entry's config as the variant's space holds it now: parameters added since the table
        # was measured take their defaults (the behaviour measured); a config that no longer fits is left out
        entries: dict[str, list[tuple[dict[str, Any], Mapping[str, Any]]]] = defaultdict(list)
        for entry in case["entries"]:
            variant = library.get(entry["variant"])
            config = completed_config(variant, entry["config"]) if variant is not None else None
            if config is not None:
                entries[variant.name].append((config, entry))
        variants = [sub_space(v, [config for config, _ in entries[v.name]]) for v in library.values() if entries[v.name]]
        outcomes: dict[str, Outcome] = {}
        for variant in variants:
            by_text = {name: {_json(v): v for v in values} for name, values in variant.space.items()}
            for config, entry in entries[variant.name]:
                candidate = Candidate.of(variant, {p: by_text[p][_json(config[p])] for p in config})
                outcomes[candidate.key()] = Outcome(entry["status"], entry["seconds"], entry.get("reason", ""))
        left_out = len(case["entries"]) - len(outcomes)
        if left_out:
            print(f"{case['case']}: {left_out} entries name no variant or config of this backend's", flush=True)
        yield Case(case["case"], task, variants, outcomes, backend.name, table["method"], simulated=False)


def model_cases(backend: Backend) -> Iterator[Case]:
    """The built-in shapes, each grid computed with the backend's cost model."""
    for name, task in SHAPES:
        started = time.time()
        outcomes = exhaustive(backend, task)
        yield Case(name, task, backend.variants(task), outcomes, backend.name, "replayed from the exhaustive table",
                   simulated=True, table_seconds=time.time() - started)


class TableRunner:
    """A runner that answers from the exhaustive table instead of building and timing."""

    def __init__(self, case: Case) -> None:
        self.case = case

    def run(self, job: TrialJob) -> tuple[TrialRecord, Artifact | None]:
        outcome = self.case.outcomes.get(job.candidate.key(), NOT_IN_TABLE)
        record = job.record(self.case.backend, outcome.status, outcome.reason)
        if outcome.seconds is not None:
            record.measurement = Measurement(times=[outcome.seconds], method=self.case.method,
                                             simulated=self.case.simulated)
        return record, None

    def prepare(self, job: TrialJob) -> None:
        """Nothing to prepare: the table holds the outcomes."""


def trials_to_target(case: Case, sampler: str, seed: int, target_seconds: float,
                     budget: int) -> tuple[int | None, str]:
    """Measured trials until the best is within the target (None if the search stopped first), and
    why the search stopped."""
    with tempfile.TemporaryDirectory() as work:
        # the target as the "floor" with no margin: the search stops as soon as it gets there
        result = search_workload(
            case.task, case.variants, TableRunner(case),
            storage=optuna.storages.InMemoryStorage(), log=RecordLog(Path(work) / "records.jsonl"),
            store=ArtifactStore(Path(work) / "artifacts"), floor_seconds=target_seconds, backend=case.backend,
            options=SearchOptions(trials=budget, patience=budget + 1, sampler=sampler, seed=seed,
                                  floor_margin=0.0, max_duplicates=100))
    measured = 0
    for record in result.records:
        if record.status == "invalid":
            continue
        measured += 1
        if record.seconds is not None and record.seconds <= target_seconds:
            return measured, result.stop_reason
    return None, result.stop_reason


def median_reached(values: Sequence[float | None]) -> float | None:
    """The median, a None (never got within the target) counting as worse than any number; None
    when the median itself is one: a median of only the runs that got there would flatter."""
    ordered = sorted(values, key=lambda v: math.inf if v is None else v)
    middle = [ordered[(len(ordered) - 1) // 2], ordered[len(ordered) // 2]] if ordered else [None]
    return None if None in middle else statistics.mean(v for v in middle if v is not None)


def _percent(fraction: float | None) -> str:
    return f"{fraction:.1%}" if fraction is not None else "not reached"


def replay(case: Case, seeds: int, within: float, max_fraction: float = 1.0) -> dict[str, Any] | None:
    """TPE and random search over the case's grid, `seeds` runs each: trials to within `within`."""
    valid = [o.seconds for o in case.outcomes.values() if o.status == "ok" and o.seconds is not None]
    if not valid:
        print(f"{case.name}: no valid configuration", flush=True)
        return None
    best = min(valid)
    target_seconds = best * (1 + within)
    size = space_size(case.variants)
    # every configuration a search may have to measure (failures cost a trial too), one short of
    # the space: a budget that covers the space makes search_workload enumerate it, not search it
    budget = min(sum(o.status != "invalid" for o in case.outcomes.values()), size - 1)
    if max_fraction < 1.0:  # a search not there within this share of the valid grid: not reached
        budget = min(budget, max(1, int(max_fraction * len(valid))))
    row: dict[str, Any] = {"case": case.name, "task": case.task.describe(), "grid": size, "valid": len(valid),
                           "grid_best_seconds": best, "table_seconds": case.table_seconds}
    for sampler in ("tpe", "random"):
        runs = [trials_to_target(case, sampler, seed, target_seconds, budget) for seed in range(seeds)]
        counts = [count for count, _ in runs]
        median = median_reached(counts)
        row[sampler] = {"trials": counts, "median": median,
                        "median_fraction_of_valid": median / len(valid) if median is not None else None,
                        "stopped_short": sorted({reason for count, reason in runs if count is None})}
    print(f"{case.name:32s} grid {size:4d} valid {len(valid):4d} | trials to within {within:.0%}: "
          f"tpe {row['tpe']['trials']} (median {_percent(row['tpe']['median_fraction_of_valid'])} of valid) | "
          f"random {row['random']['trials']} (median {_percent(row['random']['median_fraction_of_valid'])})",
          flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="ascend910b", help="the modeled target (without --table)")
    parser.add_argument("--table", action="append", type=Path, default=[],
                        help="a measured table (JSON) to replay instead of the model; repeatable")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--within", type=float, default=0.03)
    parser.add_argument("--max-fraction", type=float, default=1.0,
                        help="stop a search after this fraction of the valid grid (then: not reached); "
                             "large measured grids replay in minutes instead of hours")
    parser.add_argument("--out", default="search-efficiency.json")
    args = parser.parse_args(argv)
    about: dict[str, Any]
    if args.table:
        tables = [json.loads(path.read_text()) for path in args.table]
        cases = (case for table in tables for case in table_cases(table))
        about = {"device": "; ".join(dict.fromkeys(t["device"] for t in tables)),
                 "tables": [{"file": str(path), **{k: v for k, v in t.items() if k != "cases"}}
                            for path, t in zip(args.table, tables)]}
    else:
        backend = get_backend(load_target(args.target))
        cases = model_cases(backend)
        about = {"device": f"{args.target} ({'simulated cost model' if backend.simulated else 'real'}), computed on "
                           f"{platform.processor() or platform.machine()}",
                 "fingerprint": backend.fingerprint()}
    rows = [row for case in cases if (row := replay(case, args.seeds, args.within, args.max_fraction)) is not None]
    summary = {s: median_reached([r[s]["median_fraction_of_valid"] for r in rows]) for s in ("tpe", "random")}
    print(f"median over shapes, fraction of the valid grid needed: tpe {_percent(summary['tpe'])}, "
          f"random {_percent(summary['random'])}")
    Path(args.out).write_text(json.dumps({
        "benchmark": "search efficiency: trials to within 3% of the exhaustive grid's best",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "command": " ".join(sys.argv if argv is None else [__file__, *argv]),
        **about, "versions": {"optuna": optuna.__version__, "python": platform.python_version()},
        "seeds": args.seeds, "within": args.within, "max_fraction": args.max_fraction,
        "summary_median_fraction_of_valid": summary, "rows": rows},
        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
