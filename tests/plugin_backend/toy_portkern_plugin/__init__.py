"""A third-party portkern backend in one module: a made-up 'toy CPU' whose kernels are numpy.

It registers through the same entry points as the in-tree backends (see pyproject.toml):
`portkern.backends` -> ToyCpuBackend and `portkern.hwprofiles` -> PROFILE_PATH.
"""
from __future__ import annotations

import types
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Sequence

from portkern.backends.base import Artifact, Backend, Candidate, CompileError, Program, Variant
from portkern.backends.kernel_module import KernelSourceError, load_module, variant_from_source
from portkern.tasks import Task

PROFILE_PATH = str(Path(__file__).with_name("toycpu.yaml"))
ALLOWED_IMPORTS = frozenset({"numpy"})


@dataclass
class ToyProgram:
    module: types.ModuleType
    task: Task
    config: dict[str, Any]

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        self.module.launch(self.task, self.config, list(inputs), list(outputs))


class ToyCpuBackend(Backend):
    """Kernels are numpy source files; buffers are the default host numpy arrays."""

    name = "toycpu"
    device_kinds: ClassVar[frozenset[str]] = frozenset({"toy"})

    def variants(self, task: Task) -> list[Variant]:
        folder = resources.files(__package__).joinpath("kernels")
        found = []
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".py"):
                variant = variant_from_source(f"toy_{entry.name[:-3]}", entry.read_text(), self.name, "plugin",
                                              ALLOWED_IMPORTS)
                if variant.kind == task.kind:
                    found.append(variant)
        return found

    def check(self, candidate: Candidate, task: Task) -> str | None:
        try:
            module = load_module(candidate.variant, ALLOWED_IMPORTS)
        except KernelSourceError as exc:
            return str(exc)
        reason = module.constraints(task, candidate.params, self.target)
        return str(reason) if reason else None

    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        reason = self.check(candidate, task)
        if reason:
            raise CompileError(reason)
        return Artifact(backend=self.name, variant=candidate.variant.name, config=candidate.params,
                        source=candidate.variant.source)

    def load(self, artifact: Artifact, task: Task) -> Program:
        variant = variant_from_source(artifact.variant, artifact.source, self.name, "plugin", ALLOWED_IMPORTS)
        return ToyProgram(load_module(variant, ALLOWED_IMPORTS), task, dict(artifact.config))
