"""Proposers: where candidates come from. Built-in variants, rule-derived variants, an LLM.

A proposer gets the task (with its reference semantics), the backend (its contract and target) and
structured feedback from the search so far, and returns new variants to search. It never decides
what is correct or fast: the gate and the measurements do.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import ClassVar

from ..backends.base import Backend, Variant
from ..tasks import Task
from .records import TrialRecord

# a variant a proposer derives from a library one is named base + DERIVED_SEPARATOR + how it differs
DERIVED_SEPARATOR = "~"


def base_variant_name(name: str) -> str:
    """The library variant a derived one was made from ('gemm_tma~rules-1a2b3c' -> 'gemm_tma')."""
    return name.split(DERIVED_SEPARATOR, 1)[0]


@dataclass
class Feedback:
    """What the search has learned about one task, handed to a proposer each round."""

    floor_seconds: float
    baseline_seconds: float | None
    best: TrialRecord | None = None
    best_source: str | None = None
    history: list[TrialRecord] = field(default_factory=list)  # newest last
    round: int = 0
    library: dict[str, Variant] = field(default_factory=dict)  # every variant searched so far, by name
    first_round: list[str] = field(default_factory=list)  # its variants, by name: what a further pass resumes

    def failures(self, limit: int = 5) -> list[TrialRecord]:
        return [r for r in self.history if r.status != "ok"][-limit:]


class Proposer(ABC):
    name: ClassVar[str]

    @abstractmethod
    def propose(self, task: Task, backend: Backend, feedback: Feedback) -> list[Variant]:
        """New variants to search for this task (may be empty: nothing more to offer)."""


class BuiltinProposer(Proposer):
    """The backend's own parametric variant library, offered once."""

    name = "builtin"

    def propose(self, task: Task, backend: Backend, feedback: Feedback) -> list[Variant]:
        return backend.variants(task) if feedback.round == 0 else []


class RulesProposer(Proposer):
    """Offline rules: derive a variant from the current best by moving past the edges of its space.

    When the best configuration sits on the edge of a numeric parameter's choices (the largest
    tile, the deepest pipeline, the widest vector), the optimum may lie beyond it: the derived
    variant keeps the source and searches a local space around the best with the edge doubled or
    halved. Its constraints still reject what the target cannot hold.
    """

    name = "rules"

    def propose(self, task: Task, backend: Backend, feedback: Feedback) -> list[Variant]:
        best = feedback.best
        if best is None or best.status != "ok" or best.variant not in feedback.library:
            return []
        base = feedback.library[best.variant]
        space: dict[str, tuple] = {}
        widened = False
        for param, choices in base.space.items():
            value = best.config[param]
            numeric = [c for c in choices if isinstance(c, int) and not isinstance(c, bool)]
            # one choice is a value the task and target decide (kernel_module.narrowed), not an edge
            if len(choices) == 1 or len(numeric) != len(choices) or not numeric or value not in numeric:
                space[param] = (value,)
                continue
            local = {value}
            position = sorted(numeric).index(value)
            neighbours = sorted(numeric)[max(0, position - 1): position + 2]
            local.update(neighbours)
            if value == max(numeric):
                local.add(value * 2)
                widened = True
            if value == min(numeric) and value >= 2 and value % 2 == 0:
                local.add(value // 2)
                widened = True
            space[param] = tuple(sorted(local))
        if not widened:
            return []
        digest = hashlib.sha256(repr(sorted(space.items())).encode()).hexdigest()[:6]
        name = f"{base.name}{DERIVED_SEPARATOR}rules-{digest}"  # unique per derived space, across tasks and rounds
        if name in feedback.library:
            return []
        return [dataclasses.replace(base, name=name, space=space, default=dict(best.config), origin="rules")]
