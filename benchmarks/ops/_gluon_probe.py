"""What the Gluon probes (gluon_attention_probe.py, gluon_gemm_probe.py) share: a portkern variant's
candidate and loaded program, the summary of a kernel cross-compiled for sm_90, and the result file
with the machine and versions it was measured on."""
from __future__ import annotations

import datetime
import json
import platform
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import triton

from portkern.backends import get_backend
from portkern.backends.base import Candidate
from portkern.hwprofile import load_target
from portkern.tasks import Task

BACKEND = get_backend(load_target("h200"))


def candidate(task: Task, variant: str, config: dict[str, Any]) -> Candidate:
    """The variant's candidate for the task, its config's other parameters at DEFAULT; variants this
    machine cannot run (Gluon without a GPU) too, for cross-compiling."""
    found = next(v for v in BACKEND.variants(task, runnable_here=False) if v.name == variant)
    return Candidate.of(found, {**found.default, **config})


def program(task: Task, variant: str, config: dict[str, Any]) -> Any:
    """portkern's compiled, loaded program for the variant and config."""
    return BACKEND.load(BACKEND.compile(candidate(task, variant, config), task), task)


def built(compile_kernel: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What a kernel compiled for sm_90 gives (compile_only's kernel report): resources, warps, the
    wgmma instructions and the distinct wgmma.wait_group counts, or the compiler's error."""
    try:
        kernel = compile_kernel()
    except Exception as exc:  # a config the compiler refuses is a result of the probe
        return {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[-400:]}"}
    ptx = kernel["asm"]["ptx"]
    return {"ok": True, "registers": kernel["n_regs"], "spills": kernel["n_spills"], "shared": kernel["shared"],
            "warps": kernel["num_warps"], "wgmma": ptx.count("wgmma.mma_async"), "waits": sorted(wait_groups(ptx))}


def wait_groups(ptx: str) -> set[str]:
    """The distinct counts a kernel's wgmma.wait_group instructions leave in flight."""
    return {line.split()[1].rstrip(";") for line in ptx.splitlines() if "wgmma.wait_group" in line}


def write_record(out: Path | None, probe: str, rows: list[dict[str, Any]], backend: Any = BACKEND) -> None:
    """The probe's rows, headed by when, how and on what they were obtained (`backend`: the one
    the probe ran, whose target the record names)."""
    if out is None:
        return
    record = {"probe": probe, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv), "python": platform.python_version(), "torch": torch.__version__,
              "triton": triton.__version__,
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (sm_90 cross-compile)",
              "machine": backend.fingerprint(),  # on a GPU: its driver and CUDA too
              "rows": rows}
    out.write_text(json.dumps(record, indent=1))
