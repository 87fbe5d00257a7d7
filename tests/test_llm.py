"""The LLM proposer against a real HTTP server replaying recorded chat-completions replies.

No model runs here: tests/llm_fixtures/replay.py serves the replies in tests/llm_fixtures/*.json
(a good Triton softmax, a syntax error, a boundary bug, cheats, malformed answers, rate limits,
server errors, a slow server, a server without structured output) on 127.0.0.1.
"""
from __future__ import annotations

import email.utils
import hashlib
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from llm_fixtures.replay import REPLAY_MODEL as MODEL
from llm_fixtures.replay import ReplayServer, kernel_source, load_fixture, replay_client, replay_proposer
from portkern.backends import get_backend
from portkern.backends.base import Artifact, Backend, Candidate, CompileError, Program, Variant
from portkern.backends.kernel_module import variant_from_source
from portkern.hwprofile import load_target
from portkern.ir import Node, TensorSpec
from portkern.search.llm import (ChatClient, LlmBudget, LlmBudgetExhausted, LlmError, LlmProposer,
                                 MalformedReply, PreviousAttempt, build_prompt, parse_kernel_reply)
from portkern.search.llm.client import retry_after_seconds
from portkern.search.llm.prompt import (backend_notes, contract_imports, example_sources, kernel_files,
                                       kind_signature, pick_examples)
from portkern.search.proposers import Feedback
from portkern.search.records import Measurement, TrialRecord, Verdict
from portkern.tasks import Task

KERNELS = Path(__file__).parent / "llm_fixtures" / "kernels"


class SourceOnlyBackend(Backend):
    """A source-based backend for the prompt and the static check; it builds nothing (the last
    test runs the real Triton backend and the gate)."""

    name = "triton"
    device_kinds = frozenset({"cuda"})
    allowed_imports = ("triton", "triton.language", "math")

    def variants(self, task: Task) -> list[Variant]:
        """Its library: the recorded good softmax (the prompt's few-shot example for softmax)."""
        good = variant_from_source("softmax_row_masked", kernel_source("good_softmax.py"), self.name, "builtin",
                                   self.allowed_imports)
        return [good] if task.kind == good.kind else []

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


def make_proposer(server: ReplayServer, tmp_path: Path, budget: LlmBudget | None = None,
                  **options: Any) -> LlmProposer:
    client_options = {"budget": budget} if budget else {}
    return replay_proposer(server, tmp_path / "transcripts", client_options=client_options, **options)


def llm_name(name: str, kernel_file: str) -> str:
    """The variant name the proposer gives a recorded kernel: its name and a hash of its source."""
    return f"llm_{name}_{hashlib.sha256(kernel_source(kernel_file).encode()).hexdigest()[:8]}"


GOOD = llm_name("softmax_row_masked", "good_softmax.py")
UNMASKED = llm_name("softmax_unmasked", "no_tail_mask.py")


def transcripts(tmp_path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((tmp_path / "transcripts").glob("*.json"))]


def trial(variant: str, status: str, reason: str = "", verdict: Verdict | None = None,
          seconds: float | None = None, number: int = 0) -> TrialRecord:
    return TrialRecord(task_key=softmax_task().key, backend="triton", variant=variant, origin="llm",
                       config={"num_warps": 4}, candidate_key=f"{variant}-{number}", status=status, reason=reason,
                       verdict=verdict, measurement=Measurement([seconds] * 5, "replayed") if seconds else None,
                       floor_seconds=61e-9, number=number)


# --- the client --------------------------------------------------------------------------------

def test_client_speaks_chat_completions_with_structured_output(monkeypatch) -> None:
    monkeypatch.setenv("PORTKERN_LLM_API_KEY", "sk-replay-secret")
    with ReplayServer.from_fixtures("good_softmax") as server:
        reply = replay_client(server).complete([{"role": "user", "content": "write a softmax"}])
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


def test_client_without_key_sends_no_authorization(monkeypatch) -> None:
    monkeypatch.delenv("PORTKERN_LLM_API_KEY", raising=False)
    with ReplayServer.from_fixtures("good_softmax") as server:
        replay_client(server).complete([{"role": "user", "content": "hi"}])
    assert "Authorization" not in server.requests[0].headers


def test_client_retries_429_honouring_retry_after() -> None:
    with ReplayServer.from_fixtures("rate_limited") as server:
        start = time.monotonic()
        # backoff alone would wait >= 5 s: finishing in ~0.5 s shows Retry-After (0.5 s) was used
        reply = replay_client(server, backoff_s=5.0).complete([{"role": "user", "content": "softmax"}])
        elapsed = time.monotonic() - start
    assert len(server.requests) == 2 and reply.attempts == 2
    assert 0.45 <= elapsed < 3.0
    assert parse_kernel_reply(reply.content).source == kernel_source("good_softmax.py")


def test_client_retries_500_then_succeeds() -> None:
    with ReplayServer.from_fixtures("server_error") as server:
        reply = replay_client(server).complete([{"role": "user", "content": "softmax"}])
    assert len(server.requests) == 2 and reply.attempts == 2 and reply.structured


def test_client_gives_up_after_max_retries_with_one_line() -> None:
    failure = load_fixture("server_error")["replies"][0]  # the 500, without the recovery after it
    with ReplayServer([failure, failure, failure]) as server:
        with pytest.raises(LlmError) as caught:
            replay_client(server, max_retries=1).complete([{"role": "user", "content": "softmax"}])
    message = str(caught.value)
    assert message == (f"LLM endpoint {server.url}: HTTP 500 Internal Server Error: "
                       "Internal server error: engine is restarting (after 2 attempts)")
    assert len(server.requests) == 2


def test_client_times_out_cleanly() -> None:
    with ReplayServer.from_fixtures("slow") as server:
        start = time.monotonic()
        with pytest.raises(LlmError) as caught:
            replay_client(server, timeout_s=0.3, max_retries=1).complete([{"role": "user", "content": "softmax"}])
        elapsed = time.monotonic() - start
    assert str(caught.value) == f"LLM endpoint {server.url}: no complete answer within 0.3 s (after 2 attempts)"
    assert elapsed < 3.0  # two 0.3 s limits and a short backoff, not two of the server's 2 s waits


def test_client_falls_back_to_plain_text_when_response_format_is_rejected() -> None:
    with ReplayServer.from_fixtures("rejects_response_format", "good_softmax_fenced") as server:
        client = replay_client(server)
        first = client.complete([{"role": "user", "content": "softmax"}])
        second = client.complete([{"role": "user", "content": "softmax again"}])
    sent_schema = ["response_format" in r.body for r in server.requests]
    assert sent_schema == [True, False, False]  # refused once, then plain text without asking again
    assert not first.structured and not second.structured and client.structured_output is False
    assert not first.usage_reported and first.tokens > 0  # estimated from characters
    kernel = parse_kernel_reply(first.content, default_name="softmax")
    assert kernel.extracted_from == "fenced-code"
    assert kernel.source == kernel_source("good_softmax.py")


def test_client_endpoint_errors_are_one_line() -> None:
    with ReplayServer.from_fixtures("unauthorized") as server:
        with pytest.raises(LlmError) as caught:
            replay_client(server).complete([{"role": "user", "content": "softmax"}])
    assert str(caught.value) == f"LLM endpoint {server.url}: HTTP 401 Unauthorized: Invalid API key provided"
    assert len(server.requests) == 1  # a 401 is not retried


def test_client_rejects_answers_that_are_not_chat_completions() -> None:
    with ReplayServer.from_fixtures("non_json_body") as server:
        with pytest.raises(LlmError, match=r"the answer is not JSON: <html>"):
            replay_client(server).complete([{"role": "user", "content": "softmax"}])
    with ReplayServer([{"body": '{"object": "list", "data": []}'}]) as server:
        with pytest.raises(LlmError, match=r'the answer has no choices: {"object": "list"'):
            replay_client(server).complete([{"role": "user", "content": "softmax"}])


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_seconds("2") == 2.0 and retry_after_seconds("0.5") == 0.5
    in_ten_seconds = email.utils.formatdate(time.time() + 10, usegmt=True)
    assert 8.0 <= (retry_after_seconds(in_ten_seconds) or 0.0) <= 10.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_client_cannot_connect() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}/v1", MODEL, max_retries=1, backoff_s=0.01)
    refused = r"^LLM endpoint http://127\.0\.0\.1:\d+/v1: cannot connect .*\(after 2 attempts\)$"
    with pytest.raises(LlmError, match=refused):
        client.complete([{"role": "user", "content": "softmax"}])
    with pytest.raises(LlmError, match="is not an http"):
        ChatClient("127.0.0.1:8000", MODEL)


def test_budget_stops_requests() -> None:
    with ReplayServer.from_fixtures("good_softmax", "good_softmax", "good_softmax") as server:
        client = replay_client(server, budget=LlmBudget(max_requests=2))
        client.complete([{"role": "user", "content": "one"}])
        client.complete([{"role": "user", "content": "two"}])
        with pytest.raises(LlmBudgetExhausted, match="2 of 2 requests used"):
            client.complete([{"role": "user", "content": "three"}])
    assert len(server.requests) == 2

    with ReplayServer.from_fixtures("good_softmax", "good_softmax") as server:
        budget = LlmBudget(max_tokens=3000)
        client = replay_client(server, budget=budget)
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
    good = kernel_source("good_softmax.py")
    (tmp_path / "_masked_row.py").write_text("def _masked(x):\n    return x\n")
    gemm = tmp_path / "gemm_tiled.py"
    gemm.write_text(good.replace('KIND = "softmax"', 'KIND = "gemm"')
                    .replace("MAX_ROW =", "# include: masked_row\nMAX_ROW ="))
    broken = tmp_path / "broken.py"
    broken.write_text("KIND = 'softmax'\n")  # no full header: never shown as an example
    looped = tmp_path / "looped.py"
    looped.write_text("# include: looped_part\n")
    (tmp_path / "_looped_part.py").write_text("# include: looped_part\n")  # a cycle: skipped
    files = [gemm, broken, looped, KERNELS / "good_softmax.py"]
    assert pick_examples(files, "softmax") == [good]
    [gemm_example, softmax_example] = pick_examples(files, "layernorm")
    assert "def _masked(x):\n    return x\nMAX_ROW =" in gemm_example and "# include" not in gemm_example
    assert softmax_example == good
    assert pick_examples([broken, looped], "softmax") == []


def test_examples_and_contract_of_the_triton_backend() -> None:
    """On the real Triton backend: its declared imports, its notes, complete library sources."""
    from portkern.backends.triton.modules import builtin_variants

    triton_backend = get_backend(load_target("h200"))
    assert contract_imports(triton_backend) == (
        "math", "triton", "triton.experimental", "triton.experimental.gluon",
        "triton.experimental.gluon.language.nvidia.hopper", "triton.experimental.gluon.nvidia.hopper",
        "triton.language", "triton.tools.tensor_descriptor")
    assert "never imports torch" in backend_notes(triton_backend)
    library = {variant.name: variant.source for variant in builtin_variants()}
    fallback = pick_examples(kernel_files(triton_backend), "attention", limit=100)
    assert fallback and all(source in library.values() for source in fallback)
    offered = example_sources(triton_backend, softmax_task(), limit=2)
    assert len(offered) == 2 and all('KIND = "softmax"' in source and source in library.values() for source in offered)
    prompt = build_prompt(softmax_task(), triton_backend, Feedback(61e-9, 4.2e-6), offered, None)
    assert "## The `triton` backend" in prompt[0]["content"] and offered[0] in prompt[1]["content"]


def test_prompt_reports_gate_checks_failing_first(backend, feedback) -> None:
    checks = [{"seed": 11, "distribution": "normal", "passed": True, "rel_l2": 1.1e-7, "max_abs": 2e-8},
              {"seed": 23, "distribution": "negative", "run": "fresh", "output": 0, "passed": False,
               "rel_l2": 0.0700205, "max_abs": 0.00312, "reason": "relative L2 error 0.07 > 1e-05"}]
    attempt = PreviousAttempt(name=UNMASKED, source="SOURCE-OF-ATTEMPT", stage="rejected",
                              message="relative L2 error 0.07 > 1e-05", checks=checks, config={"num_warps": 4})
    user = build_prompt(softmax_task(), backend, feedback, [], attempt)[1]["content"]
    failing = user.index("seed=23 distribution=negative run=fresh output=0 passed=False rel_l2=0.07002 "
                         "max_abs=0.00312: relative L2 error 0.07 > 1e-05")
    assert failing < user.index("seed=11 distribution=normal passed=True rel_l2=1.1e-07")
    assert "failed verification (rejected, config {'num_warps': 4})" in user and "SOURCE-OF-ATTEMPT" in user


@pytest.mark.parametrize("stage, message, expected", [
    ("invalid", "32 warps exceed 1024 threads", "was not run with config {'num_warps': 4}: its constraints() or "
                                               "the target's limits refused it: 32 warps exceed 1024 threads"),
    ("runtime_error", "runtime error: IndexError: out of range", "crashed while running (config {'num_warps': 4}): "
                                                                 "runtime error: IndexError: out of range"),
    ("timeout", "no result within 300 s", "ran past the time limit (config {'num_warps': 4}): no result within 300 s"),
])
def test_prompt_names_what_went_wrong(backend, feedback, stage: str, message: str, expected: str) -> None:
    attempt = PreviousAttempt.from_record("SOURCE", trial(UNMASKED, stage, message))
    user = build_prompt(softmax_task(), backend, feedback, [], attempt)[1]["content"]
    assert f"Your previous kernel `{UNMASKED}` {expected}" in user and "Fix exactly this problem" in user


# --- the proposer ----------------------------------------------------------------------------------

def test_proposer_returns_only_variants_that_pass_the_static_check(backend, feedback, tmp_path) -> None:
    answers = ["good_softmax", "syntax_error", "imports_torch", "other_stream", "no_tail_mask", "no_code",
               "bad_json", "good_softmax"]
    with ReplayServer.from_fixtures(*answers) as server:
        proposer = make_proposer(server, tmp_path, proposals_per_round=len(answers))
        variants = proposer.propose(softmax_task(), backend, feedback)
    assert [v.name for v in variants] == [GOOD, UNMASKED]
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
    assert verdicts[5] == ("parse", False, "the reply holds no kernel source: neither a JSON object with 'source' "
                                           "nor a ```python fenced block")
    assert verdicts[6][:2] == ("parse", False) and verdicts[6][2].endswith(
        "(the answer was cut off at the token limit: write a shorter module)")
    assert verdicts[7] == ("duplicate", False, f"identical to the earlier proposal {GOOD}: write a different kernel")
    assert proposer.stop_reason is None


def test_static_check_refuses_framework_compute_through_tensor_methods(backend, feedback, tmp_path) -> None:
    with ReplayServer.from_fixtures("tensor_methods") as server:
        proposer = make_proposer(server, tmp_path, attempts_per_round=1)
        assert proposer.propose(softmax_task(), backend, feedback) == []


def test_next_prompt_carries_the_previous_failure(backend, feedback, tmp_path) -> None:
    task = softmax_task()
    with ReplayServer.from_fixtures("syntax_error", "imports_torch", "no_code", "no_tail_mask", "no_tail_mask",
                              "good_softmax") as server:
        proposer = make_proposer(server, tmp_path)  # 3 attempts per round
        # round 0: syntax error, torch cheat, no code: each reason goes straight into the next request
        assert proposer.propose(task, backend, feedback) == []
        # round 1: the boundary bug passes the static check and goes to the gate
        assert [v.name for v in proposer.propose(task, backend, feedback)] == [UNMASKED]
        verdict = Verdict(passed=False, reason="relative L2 error 0.0708 > 1e-05 (worst at (3, 999): got 0.00041, "
                          "want 0.00071)", precision="fp32", tolerance={"rel_l2": 1e-5},
                          checks=[{"seed": 11, "distribution": "normal", "run": "fresh", "output": 0,
                                   "passed": False, "rel_l2": 0.0708, "max_abs": 0.00093,
                                   "reason": "relative L2 error 0.0708 > 1e-05"}])
        proposer.record_outcome(UNMASKED, trial(UNMASKED, "rejected", verdict.reason, verdict))
        # round 2: the same kernel again (refused as a duplicate), then the good one
        assert [v.name for v in proposer.propose(task, backend, feedback)] == [GOOD]
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
    assert f"refused before compiling (duplicate): identical to the earlier proposal {UNMASKED}" in prompts[5]
    assert len(prompts) == 6


def test_compiler_error_and_success_reach_the_next_prompt(backend, feedback, tmp_path) -> None:
    task = softmax_task()
    compiler_says = ("triton.compiler.errors.CompilationError: at 14:11:\n    cols = tl.arange(0, n_cols)\n"
                     "ValueError: arange's arguments must be of type tl.constexpr")
    with ReplayServer.from_fixtures("no_tail_mask", "good_softmax", "good_softmax") as server:
        proposer = make_proposer(server, tmp_path)
        [first] = proposer.propose(task, backend, feedback)
        proposer.record_outcome(first.name, trial(first.name, "compile_error", compiler_says))
        [second] = proposer.propose(task, backend, feedback)
        # the gate's verdict arrives through the feedback's history only (no record_outcome call)
        passed = trial(second.name, "ok", seconds=2.44e-7, number=7)
        refused_config = trial(second.name, "invalid", "8 warps exceed the row's work", number=8)
        proposer.propose(task, backend, Feedback(61e-9, 4.2e-6, history=[passed, refused_config]))
    prompts = server.user_prompts()
    assert "failed to compile (config {'num_warps': 4}). The compiler said:" in prompts[1]
    assert "arange's arguments must be of type tl.constexpr" in prompts[1]
    assert "passed the gate and ran in 0.24 us (25.0% of the floor)" in prompts[2]


def test_transcripts_hold_the_whole_exchange_and_its_outcomes(backend, feedback, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PORTKERN_LLM_API_KEY", "sk-never-written")
    task = softmax_task()
    with ReplayServer.from_fixtures("good_softmax") as server:
        proposer = make_proposer(server, tmp_path)
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
    assert all("sk-never-written" not in p.read_text() for p in (tmp_path / "transcripts").iterdir())


def test_a_resumed_tune_appends_transcripts(backend, feedback, tmp_path) -> None:
    with ReplayServer.from_fixtures("no_code", "good_softmax") as server:
        first = LlmProposer.from_options(server.url, MODEL, tmp_path, max_requests=5, attempts_per_round=1)
        assert first.propose(softmax_task(), backend, feedback) == []
        resumed = LlmProposer.from_options(server.url, MODEL, tmp_path, max_requests=5)
        assert [v.name for v in resumed.propose(softmax_task(), backend, feedback)] == [GOOD]
    assert resumed.client.budget.max_requests == 5 and resumed.client.timeout_s == 120
    names = sorted(p.name for p in tmp_path.glob("*.json"))
    assert names == [f"0001-{softmax_task().key}.json", f"0002-{softmax_task().key}.json"]


def test_proposer_stops_cleanly_on_budget_and_endpoint_errors(backend, feedback, tmp_path) -> None:
    with ReplayServer.from_fixtures("good_softmax", "good_softmax") as server:
        proposer = make_proposer(server, budget=LlmBudget(max_requests=1), tmp_path=tmp_path / "budget",
                                 proposals_per_round=2)
        assert len(proposer.propose(softmax_task(), backend, feedback)) == 1
        assert proposer.stop_reason == "LLM budget spent: 1 of 1 requests used"
        assert proposer.propose(softmax_task(), backend, feedback) == []
    assert len(server.requests) == 1

    with ReplayServer.from_fixtures("unauthorized") as server:
        proposer = make_proposer(server, tmp_path / "auth")
        assert proposer.propose(softmax_task(), backend, feedback) == []
        assert proposer.propose(softmax_task(), backend, feedback) == []
    assert proposer.stop_reason == f"LLM endpoint {server.url}: HTTP 401 Unauthorized: Invalid API key provided"
    assert len(server.requests) == 1
    [transcript] = transcripts(tmp_path / "auth")
    assert transcript["error"] == proposer.stop_reason and transcript["response"] is None


def test_proposer_rejects_a_kernel_of_another_kind(backend, feedback, tmp_path) -> None:
    task = softmax_task()
    layernorm_task = Task(kind="layernorm", inputs=task.inputs, outputs=task.outputs, attrs=(("eps", 1e-5),),
                          flops=0, min_bytes=0)
    with ReplayServer.from_fixtures("good_softmax") as server:
        proposer = make_proposer(server, tmp_path, attempts_per_round=1)
        assert proposer.propose(layernorm_task, backend, feedback) == []
    [transcript] = transcripts(tmp_path)
    assert transcript["static_check"]["reason"] == "the module declares KIND = 'softmax' but the task is 'layernorm'"


@pytest.mark.parametrize("header, reason", [
    ('DEFAULT = 4', "DEFAULT must be a dict of parameter -> value"),
    ('PRECISION = ["fp32"]', "PRECISION must be a string"),
])
def test_proposer_refuses_a_malformed_header(backend, feedback, tmp_path, header: str, reason: str) -> None:
    good = kernel_source("good_softmax.py")
    field = header.split(" =")[0]
    source = "\n".join(header if line.startswith(f"{field} =") else line for line in good.splitlines())
    answer = {"content": json.dumps({"name": "softmax_odd", "source": source, "rationale": ""})}
    with ReplayServer([answer]) as server:
        proposer = make_proposer(server, tmp_path, attempts_per_round=1)
        assert proposer.propose(softmax_task(), backend, feedback) == []
    [transcript] = transcripts(tmp_path)
    assert transcript["static_check"] == {"passed": False, "stage": "static_check", "reason": reason}


def test_gate_keeps_only_the_good_kernel_and_its_verdict_reaches_the_prompt(tmp_path) -> None:
    """Proposer -> the real Triton backend (interpreter on CPU) -> the gate -> record_outcome -> prompt."""
    from portkern.search.worker import TrialJob, execute_trial

    triton_backend = get_backend(load_target("h200"))
    task = softmax_task(rows=8, cols=1000)
    floor = load_target("h200").profile.floor_seconds(task.flops, task.min_bytes, task.dtype)
    with ReplayServer.from_fixtures("imports_torch", "no_tail_mask", "good_softmax", "good_softmax") as server:
        proposer = make_proposer(server, tmp_path, proposals_per_round=3)
        variants = proposer.propose(task, triton_backend, Feedback(floor, None))
        statuses = {}
        for variant in variants:
            record, _ = execute_trial(triton_backend, TrialJob(task, Candidate.of(variant, variant.default), floor))
            proposer.record_outcome(variant.name, record)
            statuses[variant.name] = (record.status, record.reason)
        proposer.proposals_per_round = proposer.attempts_per_round = 1
        proposer.propose(task, triton_backend, Feedback(floor, None))
    assert list(statuses) == [UNMASKED, GOOD]  # the torch cheat never ran
    assert statuses[UNMASKED][0] == "rejected" and statuses[UNMASKED][1].startswith("relative L2 error")
    assert statuses[GOOD] == ("ok", "")
    last_prompt = server.user_prompts()[-1]
    assert f"Your previous kernel `{GOOD}` passed the gate" in last_prompt
    [unmasked] = [t for t in transcripts(tmp_path) if t["variant"] == UNMASKED]
    assert unmasked["outcomes"][0]["status"] == "rejected"
    assert unmasked["outcomes"][0]["verdict"]["checks"][-1]["rel_l2"] > 1e-3
