"""Which valid configs of the GPU variants spill registers, and whether into their hot loops.

Each variant's valid configs (a seeded sample of its space, `--per-variant` of them) are compiled
for sm_90 on one representative task, here on the CPU; ptxas's spills (the stack frame) are
counted from the binary, and the spill loads/stores (STL/LDL) inside each innermost loop that
issues wgmma from its SASS (sass_loop_mix.py). A spill in an epilogue costs little; one in the K
or key loop is paid every step, so those configs are candidates for a constraint, once a GPU table
shows them slow. A config the constraints admit that does not build is recorded with its error: a
bug in the constraints (it would cost a tune a compile_error trial).

    python benchmarks/ops/spill_survey.py --out benchmarks/results/cpu-sm90-spill-survey-DATE.json
"""
from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import sass_loop_mix as mix  # noqa: E402

import triton  # noqa: E402

from portkern import synthetic  # noqa: E402
from portkern.backends import get_backend  # noqa: E402
from portkern.backends.base import Candidate, CompileError  # noqa: E402
from portkern.backends.triton.compile_only import compile_for  # noqa: E402
from portkern.hwprofile import load_target  # noqa: E402

BERT_FFN_DOWN = (4096, 768, 3072)  # M, N, K: the GEMM shape whose tiles fill 132 SMs least evenly
CASES = {
    "gemm_tma": synthetic.gemm_task(*BERT_FFN_DOWN, "float16", trans_b=True, bias=True, activation="gelu"),
    "gemm_tiled": synthetic.gemm_task(*BERT_FFN_DOWN, "float16", trans_b=True, bias=True, activation="gelu"),
    "gemm_wgmma": synthetic.gemm_task(*BERT_FFN_DOWN, "float16", trans_b=True, bias=True, activation="gelu"),
    "gemm_pingpong": synthetic.gemm_task(*BERT_FFN_DOWN, "float16", trans_b=True, bias=True, activation="gelu"),
    "gemm_tma_tf32x3": synthetic.gemm_task(*BERT_FFN_DOWN, "float32", trans_b=True, bias=True),
    "gemm_tiled_tf32x3": synthetic.gemm_task(*BERT_FFN_DOWN, "float32", trans_b=True, bias=True),
    "bmm_tiled_tf32x3": synthetic.bmm_task(96, 512, 512, 64, "float32"),
    "attention_flash": synthetic.attention_task(4, 32, 2048, 128, "float16", causal=True),
    "attention_pingpong": synthetic.attention_task(4, 32, 2048, 128, "float16", causal=True),
}


def survey(backend: Any, name: str, per_variant: int, seed: int, deadline: float) -> list[dict[str, Any]]:
    task = CASES[name]
    variant = next(v for v in backend.variants(task, runnable_here=False) if v.name == name)
    configs = [dict(zip(variant.space, values)) for values in itertools.product(*variant.space.values())]
    random.Random(seed).shuffle(configs)
    rows: list[dict[str, Any]] = []
    for config in configs:
        if len(rows) >= per_variant or time.time() > deadline:
            break
        candidate = Candidate.of(variant, config)
        if backend.target_problem(candidate, task):
            continue
        try:
            kernel = compile_for(candidate, task, "sm_90")["kernels"][0]
        except CompileError as exc:  # the constraints admitted a config that does not build: their bug
            rows.append({"config": config, "compile_error": str(exc)[:500]})
            continue
        rows.append({"config": config, "registers": kernel["n_regs"], "spills": kernel["n_spills"],
                     "hot_loop_spill_ops": mix.hot_loop_spill_ops(kernel["asm"]["cubin"])})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(CASES), help="comma-separated, of " + ", ".join(CASES))
    parser.add_argument("--per-variant", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-seconds", type=float, default=1200.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    deadline = time.time() + args.budget_seconds
    backend = get_backend(load_target("h200"))  # its sm_90 target; nothing runs here
    result = {"command": " ".join(sys.argv),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "device": f"none: cross-compiled for sm_90 on this host ({platform.machine()}, {os.cpu_count()} cores)",
              "triton": triton.__version__, "python": platform.python_version(), "arch": "sm_90", "variants": {}}
    for name in args.variants.split(","):
        task = CASES[name]
        rows = survey(backend, name, args.per_variant, args.seed, deadline)
        built = [row for row in rows if "compile_error" not in row]
        hot = [row for row in built if any(row["hot_loop_spill_ops"])]
        print(f"{name} on {task.label}: {len(built)} valid configs built, {len(rows) - len(built)} failed to "
              f"build, {sum(1 for row in built if row['spills'])} spill, {len(hot)} into a hot loop", flush=True)
        for row in [row for row in rows if "compile_error" in row] + hot:
            print("   ", row, flush=True)
        result["variants"][name] = {"task": task.label, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
