"""The LLM proposer against a real HTTP server replaying recorded chat-completions replies.

No model runs here: tests/llm_fixtures/replay.py serves the replies in tests/llm_fixtures/*.json
(a good Triton softmax, a syntax error, a boundary bug, cheats, malformed answers, rate limits,
server errors, a slow server, a server without structured output) on 127.0.0.1.
"""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from llm_fixtures.replay import ReplayServer, kernel_source
from portkern.backends.base import Artifact, Backend, Candidate, CompileError, Program, Variant
from portkern.hwprofile import load_target
from portkern.ir import Node, TensorSpec
from portkern.search.llm import (ChatClient, LlmBudget, LlmBudgetExhausted, LlmError, LlmProposer,
                                 MalformedReply, PreviousAttempt, build_prompt, parse_kernel_reply)
from portkern.search.llm.prompt import kind_signature, pick_examples
from portkern.search.proposers import Feedback
from portkern.search.records import Measurement, TrialRecord, Verdict
from portkern.tasks import Task

MODEL = "replay-coder-7b"
KERNELS = Path(__file__).parent / "llm_fixtures" / "kernels"


class SourceOnlyBackend(Backend):
    """A source-based backend for the prompt and the static check; kernels are never built here
    (the gate and the Triton backend do that in the search's end-to-end test)."""

    name = "triton"
    device_kinds = frozenset({"cuda"})
    allowed_imports = ("triton", "triton.language", "math")

    def variants(self, task: Task) -> list[Variant]:
        return []

    def compile(self, candidate: Candidate, task: Task) -> Artifact:
        raise CompileError("this test backend does not compile")

    def load(self, artifact: Artifact, task: Task) -> Program:
        raise CompileError("this test backend does not load")


def softmax_task(rows: int = 64, cols: int = 1000) -> Task:
    spec = TensorSpec((rows, cols), "float32")
    node = Node(name="/encoder/attn/Softmax", op_type="Softmax", inputs=["scores"], outputs=["probs"],
                attrs={"axis": -1})
    return Task(kind="softmax", inputs=(spec,), outputs=(spec,), attrs=(), flops=5 * rows * cols,
                min_bytes=2 * spec.nbytes, nodes=(node,), input_names=("scores",), output_names=("probs",))


@pytest.fixture
def backend() -> Backend:
    return SourceOnlyBackend(load_target("h200"))


@pytest.fixture
def feedback() -> Feedback:
    return Feedback(floor_seconds=61e-9, baseline_seconds=4.2e-6)


@pytest.fixture
def replay() -> Iterator[type[ReplayServer]]:
    """Start replay servers in a test: `with replay.from_fixtures("good_softmax") as server`."""
    yield ReplayServer


def make_client(server: ReplayServer, **overrides: Any) -> ChatClient:
    options: dict[str, Any] = {"timeout_s": 5, "max_retries": 2, "backoff_s": 0.01}
    options.update(overrides)
    return ChatClient(server.url, MODEL, **options)


def make_proposer(client: ChatClient, tmp_path: Path, **overrides: Any) -> LlmProposer:
    return LlmProposer(client, tmp_path / "transcripts", example_files=[KERNELS / "good_softmax.py"], **overrides)


def transcripts(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "transcripts").glob("*.json"))]


def trial(variant: str, status: str, reason: str = "", verdict: Verdict | None = None,
          seconds: float | None = None, number: int = 0) -> TrialRecord:
    return TrialRecord(task_key=softmax_task().key, backend="triton", variant=variant, origin="llm",
                       config={"num_warps": 4}, candidate_key=f"{variant}-{number}", status=status, reason=reason,
                       verdict=verdict, measurement=Measurement([seconds] * 5, "replayed") if seconds else None,
                       floor_seconds=61e-9, number=number)


# --- the client --------------------------------------------------------------------------------

def test_client_speaks_chat_completions_with_structured_output(replay, monkeypatch) -> None:
    monkeypatch.setenv("PORTKERN_LLM_API_KEY", "sk-replay-secret")
    with replay.from_fixtures("good_softmax") as server:
        reply = make_client(server).complete([{"role": "user", "content": "write a softmax"}])
    request = server.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.headers["Authorization"] == "Bearer sk-replay-secret"
    assert request.body["model"] == MODEL
    schema = request.body["response_format"]["json_schema"]["schema"]
    assert request.body["response_format"]["type"] == "json_schema"
    assert sorted(schema["required"]) == ["name", "rationale", "source"]
    assert reply.structured and reply.usage_reported and reply.tokens == 2740 and reply.attempts == 1
    kernel = parse_kernel_reply(reply.content)
    assert kernel.source == kernel_source("good_softmax.py") and kernel.extracted_from == "json"
    assert kernel.name == "softmax_row_masked"


def test_client_without_key_sends_no_authorization(replay, monkeypatch) -> None:
    monkeypatch.delenv("PORTKERN_LLM_API_KEY", raising=False)
    with replay.from_fixtures("good_softmax") as server:
        make_client(server).complete([{"role": "user", "content": "hi"}])
    assert "Authorization" not in server.requests[0].headers


def test_client_retries_429_honouring_retry_after(replay) -> None:
    with replay.from_fixtures("rate_limited") as server:
        start = time.monotonic()
        # backoff alone would wait >= 5 s: finishing in ~0.5 s shows Retry-After (0.5 s) was used
        reply = make_client(server, backoff_s=5.0).complete([{"role": "user", "content": "softmax"}])
        elapsed = time.monotonic() - start
    assert len(server.requests) == 2 and reply.attempts == 2
    assert 0.45 <= elapsed < 3.0
    assert parse_kernel_reply(reply.content).source == kernel_source("good_softmax.py")


def test_client_retries_500_then_succeeds(replay) -> None:
    with replay.from_fixtures("server_error") as server:
        reply = make_client(server).complete([{"role": "user", "content": "softmax"}])
    assert len(server.requests) == 2 and reply.attempts == 2 and reply.structured


def test_client_gives_up_after_max_retries_with_one_line(replay) -> None:
    with replay.from_fixtures("server_error", "server_error") as server:
        with pytest.raises(LlmError) as caught:
            make_client(server, max_retries=1).complete([{"role": "user", "content": "softmax"}])
    message = str(caught.value)
    assert message == (f"LLM endpoint {server.url}: HTTP 500 Internal Server Error: "
                       "Internal server error: engine is restarting (after 2 attempts)")
    assert len(server.requests) == 2


def test_client_times_out_cleanly(replay) -> None:
    with replay.from_fixtures("slow") as server:
        start = time.monotonic()
        with pytest.raises(LlmError) as caught:
            make_client(server, timeout_s=0.3, max_retries=1).complete([{"role": "user", "content": "softmax"}])
        elapsed = time.monotonic() - start
    assert str(caught.value) == f"LLM endpoint {server.url}: no complete answer within 0.3 s (after 2 attempts)"
    assert elapsed < 1.5  # two 0.3 s limits and a short backoff, not the server's 2 s


def test_client_falls_back_to_plain_text_when_response_format_is_rejected(replay) -> None:
    with replay.from_fixtures("rejects_response_format", "good_softmax_fenced") as server:
        client = make_client(server)
        first = client.complete([{"role": "user", "content": "softmax"}])
        second = client.complete([{"role": "user", "content": "softmax again"}])
    sent_schema = ["response_format" in r.body for r in server.requests]
    assert sent_schema == [True, False, False]  # refused once, then plain text without asking again
    assert not first.structured and not second.structured and client.structured_output is False
    assert not first.usage_reported and first.tokens > 0  # estimated from characters
    kernel = parse_kernel_reply(first.content, default_name="softmax")
    assert kernel.extracted_from == "fenced-code"
    assert kernel.source == kernel_source("good_softmax.py")


def test_client_endpoint_errors_are_one_line(replay) -> None:
    with replay.from_fixtures("unauthorized") as server:
        with pytest.raises(LlmError) as caught:
            make_client(server).complete([{"role": "user", "content": "softmax"}])
    assert str(caught.value) == f"LLM endpoint {server.url}: HTTP 401 Unauthorized: Invalid API key provided"
    assert len(server.requests) == 1  # a 401 is not retried


def test_client_rejects_a_non_json_answer(replay) -> None:
    with replay.from_fixtures("non_json_body") as server:
        with pytest.raises(LlmError, match=r"the answer is not JSON: <html>"):
            make_client(server).complete([{"role": "user", "content": "softmax"}])


def test_client_cannot_connect() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}/v1", MODEL, max_retries=1, backoff_s=0.01)
    with pytest.raises(LlmError, match=r"^LLM endpoint http://127\.0\.0\.1:\d+/v1: cannot connect .*\(after 2 attempts\)$"):
        client.complete([{"role": "user", "content": "softmax"}])
    with pytest.raises(LlmError, match="is not an http"):
        ChatClient("127.0.0.1:8000", MODEL)


def test_budget_stops_requests(replay) -> None:
    with replay.from_fixtures("good_softmax", "good_softmax", "good_softmax") as server:
        client = make_client(server, budget=LlmBudget(max_requests=2))
        client.complete([{"role": "user", "content": "one"}])
        client.complete([{"role": "user", "content": "two"}])
        with pytest.raises(LlmBudgetExhausted, match="2 of 2 requests used"):
            client.complete([{"role": "user", "content": "three"}])
    assert len(server.requests) == 2

    with replay.from_fixtures("good_softmax", "good_softmax") as server:
        budget = LlmBudget(max_tokens=3000)
        client = make_client(server, budget=budget)
        client.complete([{"role": "user", "content": "one"}])
        assert budget.tokens == 2740  # the server's usage
        assert server.requests[0].body["max_tokens"] < 3000  # the answer is bounded by what is left
        with pytest.raises(LlmBudgetExhausted, match="2740 of 3000 tokens used"):
            client.complete([{"role": "user", "content": "x" * 2000}])
    assert len(server.requests) == 1


def test_parse_kernel_reply_variants() -> None:
    source = kernel_source("good_softmax.py")
    wrapped = f"<think>rows fit</think>\n```json\n{json.dumps({'name': 'Soft Max!', 'source': source})}\n```"
    kernel = parse_kernel_reply(wrapped)
    assert kernel.source == source and kernel.name == "soft_max" and kernel.extracted_from == "json"
    with pytest.raises(MalformedReply, match="neither a JSON object"):
        parse_kernel_reply("I cannot help with that.")
    with pytest.raises(MalformedReply, match="no non-empty 'source'"):
        parse_kernel_reply('{"name": "x", "source": ""}')


# --- the prompt ----------------------------------------------------------------------------------

def test_prompt_holds_task_target_contract_and_performance(backend) -> None:
    task = softmax_task()
    best = trial("softmax_onepass", "ok", seconds=1.22e-6)
    feedback = Feedback(floor_seconds=61e-9, baseline_seconds=4.2e-6, best=best,
                        best_source="# BEST KERNEL SOURCE\n" + kernel_source("good_softmax.py"))
    messages = build_prompt(task, backend, feedback, [kernel_source("good_softmax.py")], None)
    system, user = messages[0]["content"], messages[1]["content"]
    assert [m["role"] for m in messages] == ["system", "user"]
    for needed in ("KIND", "PRECISION", "SPACE", "DEFAULT", "def launch(task, config, inputs, outputs)",
                   "Allowed imports: math, triton, triton.language", '"source"'):
        assert needed in system
    assert "probs[64x1000:float32] = Softmax(scores[64x1000:float32])  attrs: axis=-1" in user
    assert kind_signature("softmax") in user and "over the last axis" in user
    for needed in ("input 0: scores 64x1000:float32", "warp size 32", "132 cores", "shared_mem_per_block=232448",
                   "4.2 TB/s", "float16 7.9e+14", "Roofline floor for this task: 0.06 us",
                   "Baseline (framework/vendor) time: 4.20 us (1.5% of the floor)",
                   "`softmax_onepass` config {'num_warps': 4}, 1.22 us (5.0% of the floor)",
                   "# BEST KERNEL SOURCE", "Built-in kernels of this backend"):
        assert needed in user, needed
    assert "Previous attempt" not in user


def test_examples_prefer_the_task_kind_and_fall_back_to_any(tmp_path) -> None:
    gemm = tmp_path / "gemm_tiled.py"
    gemm.write_text(kernel_source("good_softmax.py").replace('KIND = "softmax"', 'KIND = "gemm"'))
    broken = tmp_path / "broken.py"
    broken.write_text("KIND = 'softmax'\n")  # no header: skipped, never shown as an example
    files = [gemm, broken, KERNELS / "good_softmax.py"]
    assert pick_examples(files, "softmax") == [kernel_source("good_softmax.py")]
    assert pick_examples(files, "layernorm") == [gemm.read_text(), kernel_source("good_softmax.py")]
    assert pick_examples([broken], "softmax") == []


def test_prompt_reports_gate_checks_failing_first(backend, feedback) -> None:
    checks = [{"seed": 11, "distribution": "normal", "passed": True, "rel_l2": 1.1e-7, "max_abs": 2e-8},
              {"seed": 23, "distribution": "negative", "run": "fresh", "output": 0, "passed": False,
               "rel_l2": 0.0700205, "max_abs": 0.00312, "reason": "relative L2 error 0.07 > 1e-05"}]
    attempt = PreviousAttempt(name="llm004_softmax_unmasked", source="SOURCE-OF-ATTEMPT", stage="rejected",
                              message="relative L2 error 0.07 > 1e-05", checks=checks, config={"num_warps": 4})
    user = build_prompt(softmax_task(), backend, feedback, [], attempt)[1]["content"]
    failing = user.index("seed=23 distribution=negative run=fresh output=0 passed=False rel_l2=0.07002 "
                         "max_abs=0.00312: relative L2 error 0.07 > 1e-05")
    assert failing < user.index("seed=11 distribution=normal passed=True rel_l2=1.1e-07")
    assert "failed verification (rejected, config {'num_warps': 4})" in user and "SOURCE-OF-ATTEMPT" in user


# --- the proposer ----------------------------------------------------------------------------------

def test_proposer_returns_only_variants_that_pass_the_static_check(replay, backend, feedback, tmp_path) -> None:
    answers = ["good_softmax", "syntax_error", "imports_torch", "other_stream", "no_tail_mask", "no_code",
               "bad_json", "good_softmax"]
    with replay.from_fixtures(*answers) as server:
        proposer = make_proposer(make_client(server), tmp_path, proposals_per_round=len(answers))
        variants = proposer.propose(softmax_task(), backend, feedback)
    assert [v.name for v in variants] == ["llm001_softmax_row_masked", "llm005_softmax_unmasked"]
    assert all(v.origin == "llm" and v.kind == "softmax" and v.backend == "triton" for v in variants)
    assert variants[0].source == kernel_source("good_softmax.py")
    assert variants[0].space == {"num_warps": (1, 2, 4, 8)} and variants[0].precision == "fp32"
    verdicts = [(t["static_check"]["stage"], t["static_check"]["passed"], t["static_check"]["reason"])
                for t in transcripts(tmp_path)]
    assert verdicts[0] == ("static_check", True, "")
    assert verdicts[1] == ("static_check", False, "syntax error: expected ':' (line 24)")
    assert verdicts[2][2].startswith("import of 'torch' is not allowed")
    assert verdicts[3][2] == "use of '.Stream' is not allowed in a kernel (line 28)"
    assert verdicts[4] == ("static_check", True, "")
    assert verdicts[5][:2] == verdicts[6][:2] == ("parse", False)
    assert verdicts[7][0] == "duplicate" and "llm001_softmax_row_masked" in verdicts[7][2]
    assert proposer.stop_reason is None


def test_next_prompt_carries_the_previous_failure(replay, backend, feedback, tmp_path) -> None:
    task = softmax_task()
    with replay.from_fixtures("syntax_error", "imports_torch", "no_code", "no_tail_mask", "no_tail_mask",
                              "good_softmax") as server:
        proposer = make_proposer(make_client(server), tmp_path)
        for _ in range(4):  # syntax error, torch cheat, no code, the boundary bug (passes the static check)
            variants = proposer.propose(task, backend, feedback)
        assert [v.name for v in variants] == ["llm004_softmax_unmasked"]
        verdict = Verdict(passed=False, reason="relative L2 error 0.0708 > 1e-05 (worst at (3, 999): got 0.00041, "
                          "want 0.00071)", precision="fp32", tolerance={"rel_l2": 1e-5},
                          checks=[{"seed": 11, "distribution": "normal", "run": "fresh", "output": 0,
                                   "passed": False, "rel_l2": 0.0708, "max_abs": 0.00093,
                                   "reason": "relative L2 error 0.0708 > 1e-05"}])
        proposer.record_outcome("llm004_softmax_unmasked", trial("llm004_softmax_unmasked", "rejected",
                                                                 verdict.reason, verdict))
        proposer.propose(task, backend, feedback)  # the same kernel again: refused as a duplicate
        proposer.propose(task, backend, feedback)
    prompts = server.user_prompts()
    assert "Previous attempt" not in prompts[0]
    assert "refused before compiling (static_check): syntax error: expected ':' (line 24)" in prompts[1]
    assert "def launch(task, config, inputs, outputs)\n" in prompts[1]  # the broken source itself
    assert "import of 'torch' is not allowed" in prompts[2]
    assert "could not be read from your answer: the reply holds no kernel source" in prompts[3]
    assert "Could you share the GPU model?" in prompts[3]
    assert ("failed verification (rejected, config {'num_warps': 4}): relative L2 error 0.0708 > 1e-05 "
            "(worst at (3, 999)") in prompts[4]
    assert "seed=11 distribution=normal run=fresh output=0 passed=False rel_l2=0.0708 max_abs=0.00093" in prompts[4]
    assert "refused before compiling (duplicate): identical to the earlier proposal llm004_softmax_unmasked" in prompts[5]


def test_compiler_error_and_success_reach_the_next_prompt(replay, backend, feedback, tmp_path) -> None:
    task = softmax_task()
    compiler_says = ("triton.compiler.errors.CompilationError: at 14:11:\n    cols = tl.arange(0, n_cols)\n"
                     "ValueError: arange's arguments must be of type tl.constexpr")
    with replay.from_fixtures("no_tail_mask", "good_softmax", "good_softmax") as server:
        proposer = make_proposer(make_client(server), tmp_path)
        [first] = proposer.propose(task, backend, feedback)
        proposer.record_outcome(first.name, trial(first.name, "compile_error", compiler_says))
        [second] = proposer.propose(task, backend, feedback)
        # the gate's verdict arrives through the feedback's history only (no record_outcome call)
        passed = trial(second.name, "ok", seconds=2.44e-7, number=7)
        proposer.propose(task, backend, Feedback(61e-9, 4.2e-6, history=[passed]))
    prompts = server.user_prompts()
    assert "failed to compile (config {'num_warps': 4}). The compiler said:" in prompts[1]
    assert "arange's arguments must be of type tl.constexpr" in prompts[1]
    assert "passed the gate and ran in 0.24 us (25.0% of the floor)" in prompts[2]


def test_transcripts_hold_the_whole_exchange_and_its_outcomes(replay, backend, feedback, tmp_path) -> None:
    task = softmax_task()
    with replay.from_fixtures("good_softmax") as server:
        proposer = make_proposer(make_client(server), tmp_path)
        [variant] = proposer.propose(task, backend, feedback)
    record = trial(variant.name, "ok", seconds=2.44e-7, number=3)
    proposer.record_outcome(variant.name, record)
    proposer.record_outcome(variant.name, record)  # heard twice: stored once
    proposer.propose(task, backend, Feedback(61e-9, 4.2e-6, history=[record]))  # and a third time
    proposer.record_outcome("builtin_softmax", trial("builtin_softmax", "ok", seconds=1e-6))  # not ours
    [transcript] = transcripts(tmp_path)[:1]
    assert transcript["format"] == "portkern-llm-transcript/1"
    assert transcript["endpoint"] == server.url and transcript["model"] == MODEL
    assert transcript["task"]["key"] == task.key and transcript["task"]["inputs"] == [[[64, 1000], "float32"]]
    assert transcript["backend"] == "triton" and transcript["target"] == "h200" and transcript["round"] == 0
    assert [m["role"] for m in transcript["messages"]] == ["system", "user"]
    assert transcript["response"]["raw"]["usage"]["total_tokens"] == 2740
    assert transcript["response"]["structured"] is True and transcript["response"]["attempts"] == 1
    assert transcript["parsed"]["source"] == variant.source and transcript["parsed"]["extracted_from"] == "json"
    assert transcript["static_check"] == {"passed": True, "stage": "static_check", "reason": ""}
    assert transcript["variant"] == variant.name and transcript["error"] is None
    assert transcript["budget"] == {"requests": 1, "max_requests": 32, "tokens": 2740, "max_tokens": 400000}
    assert len(transcript["outcomes"]) == 1
    outcome = transcript["outcomes"][0]
    assert outcome["status"] == "ok" and outcome["number"] == 3 and outcome["floor_fraction"] == pytest.approx(0.25)
    assert not list((tmp_path / "transcripts").glob("*.partial"))


def test_proposer_stops_cleanly_on_budget_and_endpoint_errors(replay, backend, feedback, tmp_path) -> None:
    with replay.from_fixtures("good_softmax", "good_softmax") as server:
        proposer = make_proposer(make_client(server, budget=LlmBudget(max_requests=1)), tmp_path / "budget",
                                 proposals_per_round=2)
        assert len(proposer.propose(softmax_task(), backend, feedback)) == 1
        assert proposer.stop_reason == "LLM budget spent: 1 of 1 requests used"
        assert proposer.propose(softmax_task(), backend, feedback) == []
    assert len(server.requests) == 1

    with replay.from_fixtures("unauthorized") as server:
        proposer = make_proposer(make_client(server), tmp_path / "auth")
        assert proposer.propose(softmax_task(), backend, feedback) == []
        assert proposer.propose(softmax_task(), backend, feedback) == []
    assert proposer.stop_reason == f"LLM endpoint {server.url}: HTTP 401 Unauthorized: Invalid API key provided"
    assert len(server.requests) == 1
    [transcript] = transcripts(tmp_path / "auth")
    assert transcript["error"] == proposer.stop_reason and transcript["response"] is None


def test_proposer_rejects_a_kernel_of_another_kind(replay, backend, feedback, tmp_path) -> None:
    task = softmax_task()
    layernorm_task = Task(kind="layernorm", inputs=task.inputs, outputs=task.outputs, attrs=(("eps", 1e-5),),
                          flops=0, min_bytes=0)
    with replay.from_fixtures("good_softmax") as server:
        proposer = make_proposer(make_client(server), tmp_path)
        assert proposer.propose(layernorm_task, backend, feedback) == []
    [transcript] = transcripts(tmp_path)
    assert transcript["static_check"]["reason"] == "the module declares KIND = 'softmax' but the task is 'layernorm'"


def test_good_fixture_is_a_correct_kernel_and_the_boundary_one_is_not() -> None:
    """The recorded kernels are what they claim, checked in the Triton interpreter (no GPU)."""
    script = f"""
import os
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch
from portkern.backends.kernel_module import load_module, variant_from_source
from portkern.ir import TensorSpec
from portkern.tasks import Task
spec = TensorSpec((5, 1000), "float32")
task = Task(kind="softmax", inputs=(spec,), outputs=(spec,), attrs=(), flops=0, min_bytes=0)
x = torch.from_numpy(np.random.default_rng(3).uniform(-3.0, 0.5, size=(5, 1000)).astype(np.float32))
ref = torch.softmax(x.double(), -1)
for name in ("good_softmax.py", "no_tail_mask.py"):
    source = open(os.path.join({str(KERNELS)!r}, name)).read()
    variant = variant_from_source(name[:-3], source, "triton", "llm", ["triton", "triton.language", "math"])
    y = torch.full((5, 1000), float("nan"))
    load_module(variant, ["triton", "triton.language", "math"]).launch(task, variant.default, [x], [y])
    print(name, float((y.double() - ref).norm() / ref.norm()))
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    errors = dict(line.split() for line in done.stdout.splitlines())
    assert float(errors["good_softmax.py"]) < 1e-6
    assert float(errors["no_tail_mask.py"]) > 1e-3
    assert np.isfinite(float(errors["no_tail_mask.py"]))
