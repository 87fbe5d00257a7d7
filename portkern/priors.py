"""Priors: configurations measured best on a target for other shapes, shipped with its hwprofile.

A search of a few trials over thousands of GEMM configurations rarely finds the best one on its
own (measured on an H200, 2026-12-03: the exhaustive grid beat the search's 16-trial pick on every
BERT/LLaMA shape). What won on nearby shapes of the same kind on the same chip is the best first
guess, as TVM's tophub logs and Inductor's config lists are. A prior only seeds a study: the
candidate is verified and measured like any other, and it is skipped where the variant's source
or space no longer admits it.

Files: portkern/hwprofiles/priors/<target>.jsonl, one measured configuration per line:
    {"task": Task.describe(), "variant": name, "config": {...}, "seconds": float, "evidence": path}
made from measured tables (benchmarks/search/gpu_table.py's GEMM tables, benchmarks/ops/grid_matrix.py's
grids of any kind) and tuned packs (`--pack`: every kernel a tune kept, at its measured median) by

    python -m portkern.priors --table benchmarks/results/h200-gemm-table-2026-12-03.json \
        --table benchmarks/results/h200-grid-conv-nhwc-2026-12-03.json --top 3 \
        --out portkern/hwprofiles/priors/h200.jsonl

A target's file holds what was measured on that card only (H100 tables make h100.jsonl, H200 ones
h200.jsonl); priors_for lends each target its siblings' measurements of what it lacks.

A variant that gained a parameter after its prior was measured admits the prior with that parameter
at its default (a new parameter's default keeps the old behaviour: the one that was measured).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .errors import PortkernError, TargetError
from .hwprofile import Target, load_target
from .ir import TensorSpec
from .pack import Pack, load_pack
from .synthetic import gemm_task
from .tasks import Task

PRIORS_DIR = Path(__file__).parent / "hwprofiles" / "priors"


@dataclass(frozen=True)
class Measured:
    """A configuration measured on a task: a tune's record or a shipped prior."""

    task: dict[str, Any]  # Task.describe()
    variant: str
    config: dict[str, Any]
    seconds: float
    evidence: str = ""


def load_priors(target: str, folder: Path = PRIORS_DIR) -> list[Measured]:
    path = folder / f"{target}.jsonl"
    if not path.exists():
        return []
    return [Measured(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def priors_for(target: Target, folder: Path = PRIORS_DIR) -> list[Measured]:
    """The target's own priors, then those of the built-in targets of its architecture and backend
    for what it has not measured itself (an H100 starts from the H200's conv and attention winners:
    the same SMs and ISA, so the tiles that won there are far better first guesses than a library's
    defaults; where it has measured a variant on a shape, its own winners of that variant are used).
    Each one is still verified and measured on the target before it counts."""
    own = load_priors(target.name, folder)
    measured_here = {_measured_id(item) for item in own}
    borrowed: list[Measured] = []
    for path in sorted(folder.glob("*.jsonl")):
        if path.stem == target.name:
            continue
        try:
            sibling = load_target(path.stem)
        except TargetError:
            continue  # priors of a plugin target that is not installed here
        if sibling.profile.arch == target.profile.arch and sibling.backend == target.backend:
            borrowed += [item for item in load_priors(path.stem, folder) if _measured_id(item) not in measured_here]
    return own + borrowed


def _measured_id(item: Measured) -> str:
    """What a measurement is of: the task and the variant (not the config)."""
    return json.dumps([item.task, item.variant], sort_keys=True, default=str)


def problem_dims(described: dict[str, Any]) -> tuple[int, ...] | None:
    """The sizes that decide a kernel's best tiling: (M, N, K) for a GEMM whatever its layout and
    epilogue; the input shapes for other kinds."""
    inputs = [shape for shape, _ in described["inputs"]]
    if described["kind"] == "gemm":
        a, out = inputs[0], described["outputs"][0][0]
        return math.prod(a[:-1]), out[-1], a[-1]
    return tuple(size for shape in inputs for size in shape)


# float types of one width tile alike (the same bytes per tile, the same tensor-core shapes): what
# won in fp16 is a fair first guess in bf16, one step behind a same-dtype measurement
_SAME_WIDTH = ({"float16", "bfloat16"},)
_OTHER_DTYPE_STEP = 1.0
# a GEMM whose rows are not 16-byte aligned runs other kernels (no TMA, no 16-byte loads) than
# one whose rows are: its winners say little about the other's, whatever the sizes
_OTHER_ALIGNMENT_STEP = 2.0
# a GEMM's epilogue (bias, activation, residual) moves its best kernel: a GELU behind the K loop
# favours kernels that overlap it with the next tile's products (gemm_pingpong: 1.05-1.13x gemm_tma
# on BERT's and GPT-2's FFN GEMMs with it, 0.94-0.99x without, H100 2026-12-07), so a winner measured
# with the same epilogue comes before one of a plain GEMM of the same sizes
_OTHER_EPILOGUE_STEP = 0.5
_EPILOGUE_ATTRS = ("bias", "activation", "residual", "residual_op")
_ROW_ALIGNMENT_BYTES = 16


def shape_distance(a: dict[str, Any], b: dict[str, Any]) -> float | None:
    """log2 distance between two tasks of the same kind and dtype (or another float type of the
    same width, one step further); None if not comparable."""
    dtype_a, dtype_b = a["inputs"][0][1], b["inputs"][0][1]
    if a["kind"] != b["kind"]:
        return None
    if dtype_a != dtype_b and not any({dtype_a, dtype_b} <= group for group in _SAME_WIDTH):
        return None
    dims_a, dims_b = problem_dims(a), problem_dims(b)
    if dims_a is None or dims_b is None or len(dims_a) != len(dims_b):
        return None
    return (sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(dims_a, dims_b))
            + (_OTHER_DTYPE_STEP if dtype_a != dtype_b else 0.0)
            + (_OTHER_ALIGNMENT_STEP if _rows_aligned(a) != _rows_aligned(b) else 0.0)
            + (_OTHER_EPILOGUE_STEP if _epilogue(a) != _epilogue(b) else 0.0))


def _epilogue(described: dict[str, Any]) -> tuple[Any, ...]:
    """What a task computes after its main loop (a GEMM's bias, activation and residual); () for
    kinds whose attributes say nothing of an epilogue."""
    attrs = described.get("attrs", {})
    return tuple(attrs.get(name) for name in _EPILOGUE_ATTRS if name in attrs)


def _rows_aligned(described: dict[str, Any]) -> bool | None:
    """Whether a GEMM's operand rows (K, and N of an untransposed B) start 16 bytes apart; None
    for other kinds."""
    if described["kind"] != "gemm":
        return None
    _, n, k = problem_dims(described)
    rows = (k,) if described["attrs"].get("trans_b") else (k, n)
    itemsize = TensorSpec((1,), described["inputs"][0][1]).nbytes
    return all(r * itemsize % _ROW_ALIGNMENT_BYTES == 0 for r in rows)


def nearest_configs(task: dict[str, Any], measured: Iterable[Measured], count: int) -> list[Measured]:
    """Up to `count` distinct (variant, config) pairs, closest shape first, faster first."""
    scored = []
    for item in measured:
        distance = shape_distance(item.task, task)
        if distance is not None:
            scored.append((distance, item.seconds, item))
    chosen: list[Measured] = []
    seen: set[str] = set()
    for _, _, item in sorted(scored, key=lambda entry: entry[:2]):
        key = json.dumps([item.variant, item.config], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            chosen.append(item)
        if len(chosen) == count:
            break
    return chosen


def table_task(spec: Mapping[str, Any]) -> Task:
    """The task a measured table's case names (benchmarks/search/*_table.py), made the way a
    model's task is (synthetic.gemm_task)."""
    if spec["kind"] != "gemm":
        raise PortkernError(f"table task kind {spec['kind']!r}: the table format has GEMMs only")
    return gemm_task(spec["m"], spec["n"], spec["k"], spec["dtype"], trans_b=spec["trans_b"], bias=spec["bias"],
                     activation=spec["activation"], residual=spec["residual"])


def priors_from_table(table: dict[str, Any], top: int, evidence: str) -> list[Measured]:
    """The `top` fastest ok entries of each complete case of a measured table."""
    found = []
    for case in table["cases"]:
        if not case.get("complete"):
            continue
        task = table_task(case["task"])
        timed = sorted((e for e in case["entries"] if e["status"] == "ok" and e["seconds"]),
                       key=lambda e: e["seconds"])
        found += [Measured(task.describe(), e["variant"], e["config"], e["seconds"], evidence) for e in timed[:top]]
    return found


def priors_from_grid(report: dict[str, Any], top: int, evidence: str) -> list[Measured]:
    """The `top` fastest passing rows of each op of a grid (benchmarks/ops/grid_matrix.py), whose
    tasks are recorded as Task.describe(); rows without a config are the vendor baselines."""
    found = []
    for result in report["results"]:
        timed = sorted((row for row in result["rows"] if row.get("config") is not None and row["passed"]
                        and row["ms"]), key=lambda row: row["ms"])
        found += [Measured(result["task"], row["name"], row["config"], row["ms"] * 1e-3, evidence)
                  for row in timed[:top]]
    return found


def priors_from_pack(pack: Pack, evidence: str) -> list[Measured]:
    """Each kernel of a tuned pack, at its measured median: a tune's winners seed the next
    tune of nearby shapes on the same chip (a shape tuned before starts where it ended)."""
    return [Measured(entry.task, entry.variant, entry.config, entry.seconds, evidence)
            for entry in pack.entries.values()]


def priors_from(report: dict[str, Any], top: int, evidence: str) -> list[Measured]:
    """Priors from either measured format: a search table ("cases") or an op grid ("results")."""
    if "cases" in report:
        return priors_from_table(report, top, evidence)
    if "results" in report:
        return priors_from_grid(report, top, evidence)
    raise PortkernError(f"{evidence}: neither a search table (cases) nor an op grid (results)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a target's priors file from measured tables, "
                                                 "op grids and tuned packs.")
    parser.add_argument("--table", type=Path, action="append", default=[],
                        help="a search table or op grid (JSON); repeatable")
    parser.add_argument("--pack", type=Path, action="append", default=[],
                        help="a tuned kernel pack of the same target; repeatable")
    parser.add_argument("--top", type=int, default=3, help="fastest configurations kept per shape")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.table and not args.pack:
        parser.error("give at least one --table or --pack")
    found = [item for path in args.table for item in priors_from(json.loads(path.read_text()), args.top, str(path))]
    packs = {path: load_pack(path) for path in args.pack}
    targets = sorted({pack.target.get("name", "?") for pack in packs.values()})
    if len(targets) > 1:
        parser.error(f"the packs are of several targets ({', '.join(targets)}): a priors file serves one")
    found += [item for path, pack in packs.items() for item in priors_from_pack(pack, str(path))]
    lines = [json.dumps(item.__dict__, sort_keys=True, default=str) for item in found]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} priors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
