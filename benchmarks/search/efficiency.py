"""Search efficiency: how many trials portkern's search needs to get within 3% of the exhaustive
grid's best, against random search, over many shapes.

The objective of every configuration is computed once (the exhaustive grid), then each search is
replayed against that table through portkern's real strategy (search_workload: Optuna study,
seeds, dedupe, constraints): the search sees exactly the numbers a live run would, without the
wait - the same method Kernel Tuner uses to test its strategies. The table's source here is the
simulated Ascend-910B-like NPU's cost model (deterministic, runs on any CPU); `--backend` can name
another backend whose compile is cheap.

    python benchmarks/search/efficiency.py --out benchmarks/results/search-efficiency-npu.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import optuna

from portkern.backends import get_backend
from portkern.backends.base import Artifact, Backend, Candidate
from portkern.hwprofile import load_target
from portkern.search.records import Measurement, RecordLog, TrialRecord
from portkern.search.strategy import ArtifactStore, SearchOptions, all_configs, search_workload
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


def exhaustive(backend: Backend, task: Task) -> dict[str, float | None]:
    """Candidate key -> modeled seconds, or None where the target's constraints reject it."""
    table: dict[str, float | None] = {}
    for variant in backend.variants(task):
        for config in all_configs(variant):
            candidate = Candidate.of(variant, config)
            if backend.check(candidate, task) is not None:
                table[candidate.key()] = None
                continue
            seconds = backend.modeled_seconds(backend.load(backend.compile(candidate, task), task))
            table[candidate.key()] = seconds
    return table


class TableRunner:
    """A runner that answers from the exhaustive table instead of building and timing."""

    def __init__(self, table: dict[str, float | None], backend: str) -> None:
        self.table = table
        self.backend = backend

    def run(self, job: TrialJob) -> tuple[TrialRecord, Artifact | None]:
        seconds = self.table[job.candidate.key()]
        record = (job.record(self.backend, "ok") if seconds is not None
                  else job.record(self.backend, "invalid", "rejected by constraints"))
        if seconds is not None:
            record.measurement = Measurement(times=[seconds], method="replayed from the exhaustive table",
                                             simulated=True)
        return record, None


def trials_to_target(backend: Backend, task: Task, table: dict[str, float | None], sampler: str,
                     seed: int, target_seconds: float, budget: int) -> int | None:
    """Measured trials until the best is within the target; None if the budget ran out first."""
    with tempfile.TemporaryDirectory() as work:
        # the target as the "floor" with no margin: the search stops as soon as it gets there
        result = search_workload(
            task, backend.variants(task), TableRunner(table, backend.name),
            storage=optuna.storages.InMemoryStorage(), log=RecordLog(Path(work) / "records.jsonl"),
            store=ArtifactStore(Path(work) / "artifacts"), floor_seconds=target_seconds, backend=backend.name,
            options=SearchOptions(trials=budget, patience=budget + 1, sampler=sampler, seed=seed,
                                  floor_margin=0.0, max_duplicates=100))
    measured = 0
    for record in result.records:
        if record.status == "invalid":
            continue
        measured += 1
        if record.seconds is not None and record.seconds <= target_seconds:
            return measured
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="ascend910b")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--within", type=float, default=0.03)
    parser.add_argument("--out", default="search-efficiency.json")
    args = parser.parse_args()
    backend = get_backend(load_target(args.target))
    rows = []
    for name, task in SHAPES:
        started = time.time()
        table = exhaustive(backend, task)
        valid = {k: v for k, v in table.items() if v is not None}
        if not valid:
            print(f"{name}: no valid configuration", flush=True)
            continue
        best = min(valid.values())
        target_seconds = best * (1 + args.within)
        row: dict[str, Any] = {"case": name, "task": task.describe(), "grid": len(table), "valid": len(valid),
                               "grid_best_seconds": best, "table_seconds": time.time() - started}
        for sampler in ("tpe", "random"):
            counts = [trials_to_target(backend, task, table, sampler, seed, target_seconds, len(valid))
                      for seed in range(args.seeds)]
            reached = [c for c in counts if c is not None]
            row[sampler] = {"trials": counts, "median": statistics.median(reached) if reached else None,
                            "median_fraction_of_valid": statistics.median(reached) / len(valid) if reached else None}
        rows.append(row)
        print(f"{name:32s} grid {len(table):4d} valid {len(valid):4d} | trials to within {args.within:.0%}: "
              f"tpe {row['tpe']['trials']} (median {row['tpe']['median_fraction_of_valid']:.1%} of valid) | "
              f"random {row['random']['trials']} (median {row['random']['median_fraction_of_valid']:.1%})",
              flush=True)
    summary = {s: statistics.median(r[s]["median_fraction_of_valid"] for r in rows if r[s]["median"] is not None)
               for s in ("tpe", "random")}
    print(f"median over shapes, fraction of the valid grid needed: tpe {summary['tpe']:.1%}, "
          f"random {summary['random']:.1%}")
    Path(args.out).write_text(json.dumps({
        "benchmark": "search efficiency: trials to within 3% of the exhaustive grid's best",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv),
        "device": f"{args.target} ({'simulated cost model' if backend.simulated else 'real'}), computed on "
                  f"{platform.processor() or platform.machine()}",
        "fingerprint": backend.fingerprint(), "seeds": args.seeds, "within": args.within,
        "summary_median_fraction_of_valid": summary, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
