"""The Ascend-like NPU backend, simulated: triton-ascend-style kernels, run functionally in Triton's
CPU interpreter, timed by a cost model instead of a clock.

A variant is a kernel module (kernel_module.py's contract) plus `schedule(task, config, target)`,
the data movement one program's tile loop declares; `check` rejects a configuration the chip
cannot hold (grid over the core count, tiles over UB/L1/L0, unaligned tail axes) before anything
runs, and `load` attaches the modeled time that the search uses in place of a measurement.
"""
from __future__ import annotations

import contextlib
import os
import types
from dataclasses import dataclass
from importlib import resources
from typing import Any, ClassVar, Iterator, Sequence

import numpy as np

from ...hwprofile import Target
from ...ir import TensorSpec
from ...tasks import Task
from ..base import Artifact, Backend, Candidate, CompileError, Program, Variant
from ..kernel_module import KernelSourceError, load_module, variant_from_source
from .simulator import COST_MODEL_VERSION, Chip, Estimate, Schedule, ScheduleError, simulate, violations

__all__ = ["NpuBackend"]

ALLOWED_IMPORTS = frozenset({"triton", "triton.language", "math"})
SUPPORTED_DTYPES = ("float16", "float32")


@contextlib.contextmanager
def _interpreter() -> Iterator[None]:
    """Triton reads the switch when a kernel is decorated and again when it launches (its first
    launch imports modules that check it): set it around both, not for the whole process, so the
    GPU backend's compile-only paths in the same process are unaffected."""
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


@dataclass
class NpuProgram:
    """A loaded variant: runs in the interpreter on torch CPU tensors; carries its modeled time."""

    module: types.ModuleType
    task: Task
    config: dict[str, Any]
    estimate: Estimate

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        with _interpreter():
            self.module.launch(self.task, self.config, list(inputs), list(outputs))


class NpuBackend(Backend):
    """Simulated Ascend 910B-like NPU: functional runs in the interpreter, time from the cost model."""

    name = "npu"
    device_kinds: ClassVar[frozenset[str]] = frozenset({"npu"})
    simulated = True

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.chip = Chip.from_profile(target.profile)
        self._modules: dict[str, types.ModuleType] = {}

    # --- kernels ---------------------------------------------------------------------------
    @staticmethod
    def builtin_sources() -> dict[str, str]:
        """kernels/*.py by name: the built-in variant library."""
        folder = resources.files(__package__).joinpath("kernels")
        return {entry.name[:-3]: entry.read_text() for entry in sorted(folder.iterdir(), key=lambda e: e.name)
                if entry.name.endswith(".py") and not entry.name.startswith("_")}

    def variants(self, task: Task) -> list[Variant]:
        found = []
        for name, source in self.builtin_sources().items():
            variant = variant_from_source(f"npu_{name}", source, self.name, "builtin", ALLOWED_IMPORTS)
            if variant.kind == task.kind:
                found.append(variant)
        return found

    def _module(self, variant: Variant) -> types.ModuleType:
        """Each source is executed once per process (the interpreter's kernels are cheap to keep)."""
        module = self._modules.get(variant.source_hash)
        if module is None:
            with _interpreter():
                module = load_module(variant, ALLOWED_IMPORTS)
            missing = [f for f in ("schedule",) if not callable(getattr(module, f, None))]
            if missing:
                raise KernelSourceError(f"an NPU kernel module needs {', '.join(missing)}(task, config, target)")
            self._modules[variant.source_hash] = module
        return module

    def _schedule(self, module: types.ModuleType, candidate: Candidate, task: Task) -> Schedule:
        return Schedule.parse(module.schedule(task, candidate.params, self.target))

    def check(self, candidate: Candidate, task: Task) -> str | None:
        unsupported = [s.dtype for s in task.inputs + task.outputs
                       if s.dtype in ("bfloat16", "float64", "float8_e4m3fn", "float8_e5m2")]
        if unsupported:
            return (f"{unsupported[0]} is refused on the simulated NPU: kernels run in Triton's interpreter, "
                    "which is exact for fp32/fp16 only (its bf16 tl.dot is wrong)")
        try:
            module = self._module(candidate.variant)
            reason = module.constraints(task, candidate.params, self.target)
            if reason:
                return str(reason)
            problems = violations(self._schedule(module, candidate, task), self.chip)
        except (KernelSourceError, ScheduleError) as exc:
            return f"variant {candidate.variant.name}: {exc}"
        except Exception as exc:  # a proposal's schedule() can be wrong in any way: that is its reason
            return f"variant {candidate.variant.name}: schedule/constraints failed: {type(exc).__name__}: {exc}"
        return "; ".join(problems) if problems else None

    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        reason = self.check(candidate, task)
        if reason:
            raise CompileError(reason)
        module = self._module(candidate.variant)
        estimate = simulate(self._schedule(module, candidate, task), self.chip)
        return Artifact(backend=self.name, variant=candidate.variant.name, config=candidate.params,
                        source=candidate.variant.source,
                        meta={"modeled": estimate.to_dict(), "precision": candidate.variant.precision,
                              "kind": candidate.variant.kind})

    def load(self, artifact: Artifact, task: Task) -> Program:
        variant = variant_from_source(artifact.variant, artifact.source, self.name, "pack", ALLOWED_IMPORTS)
        candidate = Candidate.of(variant, artifact.config)
        reason = self.check(candidate, task)
        if reason:
            raise CompileError(reason)
        module = self._module(variant)
        estimate = simulate(self._schedule(module, candidate, task), self.chip)
        return NpuProgram(module, task, dict(artifact.config), estimate)

    def modeled_seconds(self, program: Program) -> float | None:
        return program.estimate.seconds if isinstance(program, NpuProgram) else None

    # --- buffers: torch CPU tensors (the interpreter reads and writes them in place) -------------
    def to_device(self, array: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.array(array, copy=True))

    def to_host(self, buffer: Any) -> np.ndarray:
        return buffer.detach().numpy().copy()

    def empty(self, spec: TensorSpec, fill: float) -> Any:
        import torch

        return torch.from_numpy(np.full(spec.shape, fill, dtype=spec.dtype))

    def copy_into(self, buffer: Any, array: np.ndarray) -> None:
        import torch

        buffer.copy_(torch.from_numpy(np.ascontiguousarray(array)))

    # --- identity ------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        import triton

        return {"backend": self.name, "target": self.target.name,
                "device": f"simulated {self.target.profile.arch}, cost model version {COST_MODEL_VERSION}",
                "triton": triton.__version__, "mode": "triton interpreter (functional), cost model (time)"}
