"""The LLM proposer: asks a model for kernel modules and learns from what became of them.

Each request is one exchange: prompt -> reply -> parse -> static check -> variant. A reply that
cannot be read or that breaks the contract is a failed attempt, not an error: its reason goes into
the next prompt. The gate's verdicts come back through `record_outcome` (or the feedback's
history) and go into the next prompt too. Every exchange is written as a JSON transcript, so a
person can see what the model was told, what it said and what was done with it.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...backends.base import Backend, Variant
from ...backends.kernel_module import KernelSourceError, variant_from_source
from ...tasks import Task
from ..proposers import Feedback, Proposer
from ..records import TrialRecord
from .client import (ChatClient, ChatReply, LlmBudget, LlmBudgetExhausted, LlmError, MalformedReply,
                     parse_kernel_reply)
from .prompt import PreviousAttempt, build_prompt, contract_imports, example_sources

TRANSCRIPT_FORMAT = "portkern-llm-transcript/1"

log = logging.getLogger(__name__)


@dataclass
class _Proposal:
    """A variant this proposer returned: where its transcript is and which trials it has heard of."""

    task_key: str
    source: str
    transcript: Path
    heard: set[tuple[str, int, str]] = field(default_factory=set)


class LlmProposer(Proposer):
    """Kernel modules from an LLM through any OpenAI-compatible endpoint (see docs/llm.md)."""

    name = "llm"

    def __init__(self, client: ChatClient, transcript_dir: Path | str, *, proposals_per_round: int = 1,
                 attempts_per_round: int = 3, max_examples: int = 2) -> None:
        self.client = client
        self.transcript_dir = Path(transcript_dir)
        self.transcript_dir.mkdir(parents=True, exist_ok=True)
        self.proposals_per_round = proposals_per_round
        # a reply that cannot be read or breaks the contract is asked again at once, with the reason
        self.attempts_per_round = max(attempts_per_round, proposals_per_round)
        self.max_examples = max_examples
        self.stop_reason: str | None = None  # why no more requests are made (budget, endpoint)
        self._sequence = _last_sequence(self.transcript_dir)  # a resumed tune appends, never overwrites
        self._proposals: dict[str, _Proposal] = {}  # variant name -> proposal
        self._source_owner: dict[str, str] = {}  # source hash -> variant name (no duplicates)
        self._previous: dict[str, PreviousAttempt] = {}  # task key -> the last attempt's outcome

    @classmethod
    def from_options(cls, endpoint: str, model: str, transcript_dir: Path | str, *, max_requests: int = 32,
                     max_tokens: int = 400_000, timeout_s: float = 120, proposals_per_round: int = 1,
                     attempts_per_round: int = 3) -> "LlmProposer":
        """The proposer the CLI builds from --llm-endpoint, --llm-model and the budget flags."""
        client = ChatClient(endpoint, model, timeout_s=timeout_s,
                            budget=LlmBudget(max_requests=max_requests, max_tokens=max_tokens))
        return cls(client, transcript_dir, proposals_per_round=proposals_per_round,
                   attempts_per_round=attempts_per_round)

    # --- the Proposer interface --------------------------------------------------------------------
    def propose(self, task: Task, backend: Backend, feedback: Feedback) -> list[Variant]:
        """Up to `proposals_per_round` variants that passed the static check, in at most
        `attempts_per_round` requests; [] once stopped (budget spent, endpoint failed)."""
        for record in feedback.history:
            self.record_outcome(record.variant, record)
        if self.stop_reason:
            return []
        examples = example_sources(backend, task, self.max_examples)
        variants: list[Variant] = []
        for _ in range(self.attempts_per_round):
            if len(variants) == self.proposals_per_round or self.stop_reason:
                break
            variant = self._exchange(task, backend, feedback, examples)
            if variant is not None:
                variants.append(variant)
        return variants

    def record_outcome(self, variant_name: str, record: TrialRecord) -> None:
        """Attach a trial of one of this proposer's variants to its transcript and to the next prompt.
        Trials of other proposers' variants, and trials already heard of, are ignored."""
        proposal = self._proposals.get(variant_name)
        trial = (record.candidate_key, record.number, record.status)
        if proposal is None or trial in proposal.heard:
            return
        proposal.heard.add(trial)
        transcript = json.loads(proposal.transcript.read_text(encoding="utf-8"))
        transcript["outcomes"].append({
            "status": record.status, "reason": record.reason, "config": record.config,
            "seconds": record.seconds, "floor_fraction": record.floor_fraction, "number": record.number,
            "verdict": record.verdict.to_dict() if record.verdict else None,
        })
        _write_json(proposal.transcript, transcript)
        previous = self._previous.get(proposal.task_key)
        if record.status == "invalid" and previous is not None and previous.name == variant_name:
            return  # a configuration its constraints refused says less than the trial already known
        self._previous[proposal.task_key] = PreviousAttempt.from_record(proposal.source, record)

    # --- one exchange --------------------------------------------------------------------------------
    def _exchange(self, task: Task, backend: Backend, feedback: Feedback, examples: list[str]) -> Variant | None:
        self._sequence += 1
        messages = build_prompt(task, backend, feedback, examples, self._previous.get(task.key))
        transcript: dict[str, Any] = {
            "format": TRANSCRIPT_FORMAT, "sequence": self._sequence,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "endpoint": self.client.endpoint, "model": self.client.model,
            "task": {"key": task.key, "label": task.label, **task.describe()},
            "backend": backend.name, "target": backend.target.name, "round": feedback.round,
            "messages": messages, "response": None, "error": None, "parsed": None,
            "variant": None, "static_check": None, "outcomes": [],
        }
        path = self.transcript_dir / f"{self._sequence:04d}-{task.key}.json"
        try:
            variant = self._reply_to_variant(task, backend, self.client.complete(messages), transcript)
        except (LlmBudgetExhausted, LlmError) as exc:
            self.stop_reason = str(exc)
            transcript["error"] = self.stop_reason
            log.warning("LLM proposer stopped: %s", self.stop_reason)
            variant = None
        transcript["budget"] = asdict(self.client.budget)
        _write_json(path, transcript)
        if variant is not None:
            self._proposals[variant.name] = _Proposal(task.key, variant.source, path)
            self._source_owner[variant.source_hash] = variant.name
            self._previous.pop(task.key, None)  # its outcome arrives through record_outcome
        return variant

    def _reply_to_variant(self, task: Task, backend: Backend, reply: ChatReply,
                          transcript: dict[str, Any]) -> Variant | None:
        """Parse and statically check a reply; a failure becomes the next prompt's previous attempt."""
        transcript["response"] = {
            "content": reply.content, "raw": reply.raw, "tokens": reply.tokens,
            "usage_reported": reply.usage_reported, "structured": reply.structured,
            "attempts": reply.attempts, "elapsed_s": round(reply.elapsed_s, 3), "finish_reason": reply.finish_reason,
        }
        try:
            kernel = parse_kernel_reply(reply.content, default_name=task.kind)
        except MalformedReply as exc:
            reason = str(exc)
            if reply.finish_reason == "length":
                reason += " (the answer was cut off at the token limit: write a shorter module)"
            transcript["static_check"] = {"passed": False, "stage": "parse", "reason": reason}
            self._previous[task.key] = PreviousAttempt(name=f"answer #{self._sequence}", source=reply.content,
                                                       stage="parse", message=reason)
            return None
        # named by content: the same source is the same variant in any run (and a resumed tune)
        name = f"llm_{kernel.name}_{hashlib.sha256(kernel.source.encode()).hexdigest()[:8]}"
        transcript["parsed"] = {"name": kernel.name, "source": kernel.source, "rationale": kernel.rationale,
                                "extracted_from": kernel.extracted_from}
        stage, reason, variant = "static_check", "", None
        try:
            variant = variant_from_source(name, kernel.source, backend.name, "llm", contract_imports(backend))
        except KernelSourceError as exc:  # includes a header of the wrong shape, e.g. DEFAULT = 4
            reason = str(exc)
        except RecursionError:
            reason = "the module is nested too deeply to parse"
        if variant is not None and variant.kind != task.kind:
            reason = f"the module declares KIND = {variant.kind!r} but the task is '{task.kind}'"
        elif variant is not None and variant.source_hash in self._source_owner:
            stage = "duplicate"
            earlier = self._source_owner[variant.source_hash]
            reason = f"identical to the earlier proposal {earlier}: write a different kernel"
        if reason:
            transcript["static_check"] = {"passed": False, "stage": stage, "reason": reason}
            self._previous[task.key] = PreviousAttempt(name=name, source=kernel.source, stage=stage, message=reason)
            return None
        transcript["static_check"] = {"passed": True, "stage": "static_check", "reason": ""}
        transcript["variant"] = name
        return variant


def _last_sequence(transcript_dir: Path) -> int:
    """The highest NNNN of the NNNN-<task>.json transcripts already in the folder (0 when none)."""
    prefixes = (path.name.split("-", 1)[0] for path in transcript_dir.glob("*-*.json"))
    return max((int(prefix) for prefix in prefixes if prefix.isdigit()), default=0)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write whole or not at all: a reader never sees half a transcript."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(partial, path)
