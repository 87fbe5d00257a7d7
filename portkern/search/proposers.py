"""Proposers: where candidates come from. Built-in variants, rule-derived variants, an LLM.

A proposer gets the task (with its reference semantics), the backend (its contract and target) and
structured feedback from the search so far, and returns new variants to search. It never decides
what is correct or fast: the gate and the measurements do.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from ..backends.base import Backend, Variant
from ..tasks import Task
from .records import TrialRecord


@dataclass
class Feedback:
    """What the search has learned about one task, handed to a proposer each round."""

    floor_seconds: float
    baseline_seconds: float | None
    best: TrialRecord | None = None
    best_source: str | None = None
    history: list[TrialRecord] = field(default_factory=list)  # newest last
    round: int = 0

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
