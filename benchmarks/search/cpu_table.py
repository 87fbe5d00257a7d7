"""A measured search table for the TVM CPU GEMM space on this machine, for efficiency.py --table.

Every configuration of a sub-space of tvm_gemm is built through the backend (compile, load),
its output checked once against the task's float64 reference, and timed with the shared harness
(portkern.measure.time_program; an entry's time is its fastest run, the table's "method" says why),
for BERT-mini / MiniLM / BERT-base-like linear layers at small M.
The tasks are those partition makes of an exporter's MatMul of a weight (b is (K, N): trans_b
False) followed by the bias Add; one case adds the erf GELU, one is an odd shape.

The full space has 3,600-7,300 valid configurations per shape (7,300 when b is not transposed,
since pack_b=False is then allowed): hours per shape here. SUBSPACE keeps a deterministic subset
of each parameter's values, 272 valid configurations per shape (240 where 48 does not divide N,
which rules out pack_b=False with tile_n=48; 136 on the odd shape, where N=1000 rules it out
altogether):

  tile_m        2 4 6 8 12   drops 1 (a one-row tile reloads every b vector per row: a GEMV) and 16
                             (at 16 lanes it fits the registers only with tile_n=16)
  tile_n        16 32 48 64  drops 8 (narrower than one AVX-512 vector)
  vector_lanes  16           the host's AVX-512 width; 8 was 1.2-2x slower than the best on every
                             shape of a first two-core table, 4 is narrower still
  row_tiles     1 4          no reuse of a b panel across tiles, and the default's reuse
  unroll_k      1 4          none, and twice the default's
  pack_b        both
  order         both         on one core the order of the tile loops is the walk through a and b
  parallel      True         one thread: parallel changes nothing

The kernels run on one pinned core (--cores 1, the last CPU this process may use): this 2-core
machine is shared with another process that keeps about one core busy, and a two-thread kernel
then waits for the thread that shares its core: re-timed minutes later, the best entries of a
first two-core table (search-table-cpu-tvm-2026-12-03-2cores.json) took 1.5-2x their recorded
times, while a kernel's one-core times stayed within about 5% of each other.

The table is rewritten (atomically) every few seconds and after each case, so a kill keeps what
was measured; a rerun with the same --out resumes, measuring only the entries it lacks.
Afterwards (--recheck N) the best N entries of each case and N others are timed again, and the
ratios new / recorded kept with the case: the table's own noise, next to the 3% it is judged by.

    python benchmarks/search/cpu_table.py --out benchmarks/results/search-table-cpu-tvm-2026-12-03.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import optuna
import tvm

from portkern.backends import get_backend
from portkern.backends.base import Backend, Candidate, CompileError, Variant
from portkern.hwprofile import load_target
from portkern.measure import MeasureOptions, device_inputs, time_program
from portkern.priors import table_task
from portkern.search.strategy import all_configs
from portkern.tasks import Task
from portkern.verify import compare, make_inputs, tolerance_for

SUBSPACE: dict[str, tuple[Any, ...]] = {
    "tile_m": (2, 4, 6, 8, 12), "tile_n": (16, 32, 48, 64), "vector_lanes": (16,), "row_tiles": (1, 4),
    "unroll_k": (1, 4), "pack_b": (True, False), "order": ("mn", "nm"), "parallel": (True,),
}
MEASURE = MeasureOptions(warmup=2, repeats=30, input_sets=2, max_seconds=0.3)
INPUT_SEED = 7  # device_inputs' first set: the checked run reads the inputs the reference saw
SAVE_EVERY_S = 5.0


def _gemm(m: int, n: int, k: int, bias: bool = True, activation: str = "none") -> dict[str, Any]:
    return {"kind": "gemm", "m": m, "n": n, "k": k, "dtype": "float32", "trans_b": False, "bias": bias,
            "activation": activation, "residual": False}


CASES: list[tuple[str, dict[str, Any]]] = [
    ("bert-mini qkv 128x256x256 +bias", _gemm(128, 256, 256)),
    ("bert-mini ffn1 128x1024x256 +bias", _gemm(128, 1024, 256)),
    ("bert-mini ffn2 128x256x1024 +bias", _gemm(128, 256, 1024)),
    ("minilm qkv 32x384x384 +bias", _gemm(32, 384, 384)),
    ("minilm qkv 128x384x384 +bias", _gemm(128, 384, 384)),
    ("minilm ffn1 128x1536x384 +bias+gelu", _gemm(128, 1536, 384, activation="gelu")),
    ("minilm ffn2 128x384x1536 +bias", _gemm(128, 384, 1536)),
    ("minilm ffn2 512x384x1536 +bias", _gemm(512, 384, 1536)),
    ("bert-base qkv 64x768x768 +bias", _gemm(64, 768, 768)),
    ("bert-base qkv 256x768x768 +bias", _gemm(256, 768, 768)),
    ("bert-base qkv 512x768x768 +bias", _gemm(512, 768, 768)),
    ("odd 250x1000x780", _gemm(250, 1000, 780, bias=False)),
]


def measure_entry(backend: Backend, variant: Variant, config: Mapping[str, Any], task: Task,
                  inputs: list[list[Any]], reference: np.ndarray) -> dict[str, Any]:
    """One configuration's table entry: built, checked once, timed; a failure is the entry's status."""
    entry: dict[str, Any] = {"variant": variant.name, "config": dict(config), "seconds": None}
    candidate = Candidate.of(variant, config)
    reason = backend.check(candidate, task)
    if reason is not None:
        return {**entry, "status": "invalid", "reason": reason}
    try:
        program = backend.load(backend.compile(candidate, task), task)
    except CompileError as exc:
        return {**entry, "status": "compile_error", "reason": str(exc)}
    outputs = [backend.empty(spec, float("nan")) for spec in task.outputs]
    try:
        program(inputs[0], outputs)
        backend.synchronize()
    except Exception as exc:  # the kernel's own failure: this entry's evidence
        return {**entry, "status": "runtime_error", "reason": f"{type(exc).__name__}: {exc}"[:500]}
    check = compare(backend.to_host(outputs[0]), reference, tolerance_for(variant.precision, task))
    if not check["passed"]:
        return {**entry, "status": "rejected", "reason": check["reason"]}
    measurement = time_program(backend, program, task, MEASURE, inputs)
    return {**entry, "seconds": min(measurement.times), "status": "ok", "reason": "", "median": measurement.median,
            "spread": measurement.spread, "runs": len(measurement.times)}


def _dumps(table: Mapping[str, Any]) -> str:
    """The table as indented JSON with one line per entry, so a person can read and diff it."""
    head = json.dumps({k: v for k, v in table.items() if k != "cases"}, indent=1)[:-2]
    cases = []
    for case in table["cases"]:
        fields = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in case.items() if k != "entries")
        entries = ",\n".join(f"   {json.dumps(e)}" for e in case["entries"])
        cases.append(f"  {{{fields},\n   \"entries\": [\n{entries}]}}")
    return head + ',\n "cases": [\n' + ",\n".join(cases) + "]\n}\n"


def save(table: Mapping[str, Any], path: Path) -> None:
    """Rewrite the file whole, atomically: a kill mid-write leaves the previous version."""
    scratch = path.with_suffix(".partial")
    scratch.write_text(_dumps(table))
    os.replace(scratch, path)


def _why() -> str:
    """The docstring's account of the sub-space and the core it runs on, for the table file."""
    text = __doc__ or ""
    return text[text.find("The full space"):text.find("The table is rewritten")].strip()


def header(backend: Backend, command: str) -> dict[str, Any]:
    fingerprint = backend.fingerprint()
    return {
        "device": f"{fingerprint['cpu']}, {fingerprint['cores']} of its {os.cpu_count()} cores pinned "
                  f"(CPUs {sorted(os.sched_getaffinity(0))}; another process shares the machine)",
        "target": backend.target.name, "backend": backend.name,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "command": command,
        "versions": {**fingerprint, "numpy": np.__version__, "optuna": optuna.__version__,
                     "python": platform.python_version(), "tvm_threads": str(tvm.runtime.num_threads())},
        "method": (f"backend.compile + load; output checked once against the float64 reference "
                   f"(verify.compare, tolerance_for); portkern.measure.time_program with warmup={MEASURE.warmup}, "
                   f"repeats={MEASURE.repeats}, input_sets={MEASURE.input_sets}, "
                   f"max_seconds={MEASURE.max_seconds} (at least 5 runs). seconds is the fastest run: another "
                   "process's bursts on this shared machine only ever slow a run, so medians taken minutes apart "
                   "rank kernels by the load they met; the median and the spread (relative IQR) of the runs are "
                   "kept beside it"),
        "subspace": {"values": SUBSPACE, "why": _why()},
        "cases": [],
    }


def build_case(backend: Backend, name: str, spec: dict[str, Any], done: list[dict[str, Any]],
               table: dict[str, Any], out: Path) -> dict[str, Any]:
    """Measure the entries the case lacks (resume), saving as it goes."""
    task = table_task(spec)
    case = {"case": name, "task": spec, "complete": False, "load_average": [os.getloadavg()[0]], "entries": done}
    table["cases"].append(case)
    have = {(e["variant"], json.dumps(e["config"], sort_keys=True)) for e in done}
    inputs = device_inputs(backend, task, MEASURE.input_sets, seed=INPUT_SEED)
    reference = task.reference(make_inputs(task, INPUT_SEED, "normal"))[0]
    started = saved = time.time()
    for variant in backend.variants(task):
        configs = list(all_configs(replace(variant, space=SUBSPACE)))
        for i, config in enumerate(configs):
            if (variant.name, json.dumps(config, sort_keys=True)) in have:
                continue
            done.append(measure_entry(backend, variant, config, task, inputs, reference))
            if time.time() - saved > SAVE_EVERY_S:
                save(table, out)
                saved = time.time()
            if (i + 1) % 40 == 0:
                print(f"  {name}: {i + 1}/{len(configs)} ({time.time() - started:.0f} s)", flush=True)
    case["complete"] = True
    case["load_average"].append(os.getloadavg()[0])
    save(table, out)
    ok = [e for e in done if e["status"] == "ok"]
    best = min(ok, key=lambda e: e["seconds"]) if ok else None
    print(f"{name}: {len(ok)} ok of {len(done)}, best {best['seconds'] * 1e3:.3f} ms {best['config']} "
          f"({time.time() - started:.0f} s)" if best else f"{name}: nothing valid", flush=True)
    return case


def recheck(backend: Backend, case: dict[str, Any], count: int) -> dict[str, list[float]]:
    """The table's own noise: its best `count` entries and `count` others (seeded) built and timed
    again the same way; new time / recorded time for each."""
    task = table_task(case["task"])
    variants = {v.name: v for v in backend.variants(task)}
    ok = sorted((e for e in case["entries"] if e["status"] == "ok"), key=lambda e: e["seconds"])
    picked = ok[:count] + random.Random(0).sample(ok[count:], min(count, len(ok[count:])))
    inputs = device_inputs(backend, task, MEASURE.input_sets, seed=INPUT_SEED)
    ratios = []
    for entry in picked:
        candidate = Candidate.of(variants[entry["variant"]], entry["config"])
        program = backend.load(backend.compile(candidate, task), task)
        ratios.append(min(time_program(backend, program, task, MEASURE, inputs).times) / entry["seconds"])
    return {"best": ratios[:count], "others": ratios[count:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--out", type=Path, required=True, help="the table; an existing one is resumed")
    parser.add_argument("--only", default="", help="build only the cases whose name contains this")
    parser.add_argument("--cores", type=int, default=1, help="pin to the last N CPUs this process may use")
    parser.add_argument("--recheck", type=int, default=5,
                        help="afterwards, time the best N and N other entries of each case again (0: none)")
    args = parser.parse_args()
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-args.cores:])  # the host profile reads it
    backend = get_backend(load_target(args.target, "tvm"))
    command = " ".join([Path(sys.executable).name, *sys.argv])
    earlier = json.loads(args.out.read_text()) if args.out.exists() else None
    if earlier is not None and (earlier["subspace"]["values"] != json.loads(json.dumps(SUBSPACE))
                                or earlier["method"] != header(backend, command)["method"]):
        raise SystemExit(f"{args.out} was measured over another sub-space or method: give a new --out")
    table = header(backend, command)
    if earlier is not None:  # measured from the earlier date on
        table.update(date=earlier["date"], command=earlier["command"] + " ; resumed: " + command)
    previous = {c["case"]: c for c in earlier["cases"]} if earlier else {}
    started = time.time()
    for name, spec in CASES:
        if (args.only and args.only not in name) or previous.get(name, {}).get("complete"):
            if name in previous:
                table["cases"].append(previous[name])
            continue
        build_case(backend, name, spec, previous.get(name, {}).get("entries", []), table, args.out)
    table["build_seconds"] = time.time() - started + (earlier or {}).get("build_seconds", 0.0)
    save(table, args.out)
    for case in table["cases"] if args.recheck else ():
        case["recheck"] = recheck(backend, case, args.recheck)
        print(f"{case['case']}: timed again / recorded: best {[round(r, 3) for r in case['recheck']['best']]}, "
              f"others {[round(r, 3) for r in case['recheck']['others']]}", flush=True)
        save(table, args.out)
    print(f"wrote {args.out} ({time.time() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
