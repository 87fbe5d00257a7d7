"""The Ascend-like NPU backend, simulated: triton-ascend-style kernels, run functionally in Triton's
CPU interpreter, timed by a cost model instead of a clock.

A variant is a kernel module (kernel_module.py's contract) plus `schedule(task, config, target)`,
the data movement one program's tile loop declares, and optionally `workspace(task, config)`, the
GM scratch it needs as (elements, dtype) (passed to `launch` as a fifth argument), `flags(task,
config)`, the int32 cross-core flags it keeps zero between launches (passed after the workspace),
and `serves(task, target)`, whether the variant is offered for a task at all; `check` rejects
a configuration the chip cannot hold (grid over the core count, tiles over UB/L1/L0, unaligned tail
axes) before anything runs, and `load` attaches the modeled time that the search uses in place of a
measurement.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, ClassVar, Sequence

import numpy as np
import torch
import triton

from ...hwprofile import Target
from ...ir import TensorSpec
from ...tasks import Task
from ..base import Artifact, Backend, Candidate, CompileError, Program, Variant
from ..kernel_module import KernelSourceError, expand_includes, narrowed, variant_from_source
from ..triton.modules import ALLOWED_IMPORTS, interpreted_language, kernel_module
from .simulator import COST_MODEL_VERSION, Chip, Estimate, Schedule, ScheduleError, simulate, violations

__all__ = ["NpuBackend"]

INTERPRETER_BF16 = ("bfloat16 is refused on the simulated NPU: its kernels run in Triton's interpreter, "
                    "whose bf16 tl.dot is wrong (fp32/fp16 only)")
NO_UNITS = ("float64", "float8_e4m3fn", "float8_e5m2")  # the chip has no fp64 or fp8 units


@dataclass
class NpuProgram:
    """A loaded variant: runs in the interpreter on torch CPU tensors; carries its modeled time."""

    module: types.ModuleType
    task: Task
    config: dict[str, Any]
    estimate: Estimate
    flags: Any = field(default=None, init=False)  # int32, zeroed once at load, as a runtime would

    def __post_init__(self) -> None:
        declared = getattr(self.module, "flags", None)
        if declared is not None:
            self.flags = torch.zeros((int(declared(self.task, self.config)),), dtype=torch.int32)

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        # a module that declares workspace() gets its GM scratch fresh and NaN-poisoned every run, so
        # a kernel that reads a partial sum it did not write this run fails the gate
        declared = getattr(self.module, "workspace", None)
        scratch = []
        if declared is not None:
            elements, dtype = declared(self.task, self.config)
            scratch.append(torch.full((int(elements),), float("nan"), dtype=getattr(torch, dtype)))
        if self.flags is not None:
            scratch.append(self.flags)
        with interpreted_language():
            self.module.launch(self.task, self.config, list(inputs), list(outputs), *scratch)
        # flags persist across launches (zeroed once): a kernel that leaves one set would hand the
        # next launch a stale arrival count, so the run is an error
        if self.flags is not None and bool(self.flags.any()):
            raise RuntimeError(f"{self.module.__name__}: the launch left cross-core flags set "
                               f"({int(self.flags.count_nonzero())} of {self.flags.numel()}); they must end at zero")


class NpuBackend(Backend):
    """Simulated Ascend 910B-like NPU: functional runs in the interpreter, time from the cost model."""

    name = "npu"
    device_kinds: ClassVar[frozenset[str]] = frozenset({"npu"})
    simulated = True
    interprets_kernels = True

    def __init__(self, target: Target) -> None:
        super().__init__(target)
        self.chip = Chip.from_profile(target.profile)

    # --- kernels ---------------------------------------------------------------------------
    @staticmethod
    def builtin_sources() -> dict[str, str]:
        """kernels/*.py by name: the built-in variant library (`# include: NAME` lines expanded
        from kernels/_NAME.py, as for Triton's built-ins, so each source stands alone)."""
        folder = resources.files(__package__).joinpath("kernels")

        def read(name: str) -> str:
            return str(folder.joinpath(f"_{name}.py").read_text())

        return {entry.name[:-3]: expand_includes(entry.read_text(), read)
                for entry in sorted(folder.iterdir(), key=lambda e: e.name)
                if entry.name.endswith(".py") and not entry.name.startswith("_")}

    def variants(self, task: Task) -> list[Variant]:
        found = []
        for name, source in self.builtin_sources().items():
            variant = variant_from_source(f"npu_{name}", source, self.name, "builtin", ALLOWED_IMPORTS)
            if variant.kind == task.kind and self._serves(variant, task):
                found.append(self.for_task(variant, task))
        return found

    def for_task(self, variant: Variant, task: Task) -> Variant:
        return narrowed(variant, self._module, task, self.target)

    def _serves(self, variant: Variant, task: Task) -> bool:
        """A module's optional serves(task, target): a variant no configuration of which could run
        the task (a grid that cannot fit the cores at any tile size) is not offered, so it neither
        costs the search its ranking budget nor shows up as an always-rejected choice."""
        serves = getattr(self._module(variant), "serves", None)
        return serves is None or bool(serves(task, self.target))

    @staticmethod
    def _module(variant: Variant) -> types.ModuleType:
        """The variant's module, executed once per source with Triton in interpreter mode."""
        module = kernel_module(variant, interpret=True)
        if not callable(getattr(module, "schedule", None)):
            raise KernelSourceError("an NPU kernel module needs schedule(task, config, target)")
        return module

    def _schedule(self, module: types.ModuleType, candidate: Candidate, task: Task) -> Schedule:
        return Schedule.parse(module.schedule(task, candidate.params, self.target))

    def check(self, candidate: Candidate, task: Task) -> str | None:
        dtypes = {spec.dtype for spec in task.inputs + task.outputs}
        if "bfloat16" in dtypes:
            return INTERPRETER_BF16
        if dtypes & set(NO_UNITS):
            return f"{min(dtypes & set(NO_UNITS))} is not computed by the Ascend 910B-like NPU"
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

    def _checked(self, candidate: Candidate, task: Task) -> tuple[types.ModuleType, Estimate]:
        """The module and its modeled time, for a candidate check() accepts (else CompileError)."""
        reason = self.check(candidate, task)
        if reason:
            raise CompileError(reason)
        module = self._module(candidate.variant)
        return module, simulate(self._schedule(module, candidate, task), self.chip)

    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        _, estimate = self._checked(candidate, task)
        return Artifact(backend=self.name, variant=candidate.variant.name, config=candidate.params,
                        source=candidate.variant.source,
                        meta={"modeled": estimate.to_dict(), "precision": candidate.variant.precision,
                              "kind": candidate.variant.kind})

    def load(self, artifact: Artifact, task: Task) -> Program:
        """Also loads an artifact read back from a pack: the source is checked and modeled again."""
        variant = variant_from_source(artifact.variant, artifact.source, self.name, "pack", ALLOWED_IMPORTS)
        module, estimate = self._checked(Candidate.of(variant, artifact.config), task)
        return NpuProgram(module, task, dict(artifact.config), estimate)

    def modeled_seconds(self, program: Program) -> float | None:
        return program.estimate.seconds if isinstance(program, NpuProgram) else None

    def predicted_seconds(self, candidate: Candidate, task: Task) -> float | None:
        try:
            return self._checked(candidate, task)[1].seconds
        except CompileError:
            return None

    # --- buffers: torch CPU tensors (the interpreter reads and writes them in place) -------------
    def to_device(self, array: np.ndarray) -> Any:
        return torch.from_numpy(np.array(array, copy=True))

    def to_host(self, buffer: Any) -> np.ndarray:
        return buffer.detach().numpy().copy()

    def empty(self, spec: TensorSpec, fill: float) -> Any:
        return torch.from_numpy(np.full(spec.shape, fill, dtype=spec.dtype))

    def copy_into(self, buffer: Any, array: np.ndarray) -> None:
        buffer.copy_(torch.from_numpy(np.ascontiguousarray(array)))

    # --- identity ------------------------------------------------------------------------------
    def fingerprint(self) -> dict[str, str]:
        return {"backend": self.name, "target": self.target.name,
                "device": f"simulated {self.target.profile.arch}, cost model version {COST_MODEL_VERSION}",
                "triton": triton.__version__, "mode": "triton interpreter (functional), cost model (time)"}
