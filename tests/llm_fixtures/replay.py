"""A real chat-completions HTTP server for tests, replaying the replies recorded in this folder.

Each fixture file `<name>.json` holds {"description", "replies": [...], "reject_response_format"?}.
A reply is answered to one POST /v1/chat/completions, in order; its fields:

    status        HTTP status (default 200)
    headers       extra response headers (e.g. Retry-After)
    delay_s       seconds to wait before answering (a slow server)
    error         for an error status: the server's message, sent as {"error": {"message": ...}}
    kernel        a file in kernels/: the answer is that module, as JSON {name, source, rationale}
                  (style "json", what structured output returns) or prose + a ```python block
                  (style "fenced", what a plain-text model writes); with name and rationale
    content       the assistant message verbatim (malformed answers)
    body          the raw HTTP body verbatim (a proxy that does not speak JSON)
    usage         the usage object to report; omitted: the server reports none
    finish_reason the choice's finish_reason (default "stop"; "length": cut off at max_tokens)

With "reject_response_format" the server answers 400 to any request that carries response_format
(without using up a reply), as servers without structured output do.

Use it from any test (the search's end-to-end test: the gate must keep only the good kernel):

    with ReplayServer.from_fixtures("syntax_error", "no_tail_mask", "good_softmax") as server:
        proposer = replay_proposer(server, tmp_path / "llm")   # an LlmProposer on server.url
        ...                                                    # run the search with it
        server.user_prompts()                                  # what was sent
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Sequence

from portkern.search.llm import ChatClient, LlmProposer

FIXTURES = Path(__file__).parent
KERNELS = FIXTURES / "kernels"
CHAT_PATH = "/v1/chat/completions"
REPLAY_MODEL = "replay-coder-7b"
_Answer = tuple[int, dict[str, str], bytes, float]  # status, headers, body, delay


def load_fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def kernel_source(file_name: str) -> str:
    return (KERNELS / file_name).read_text(encoding="utf-8")


def replay_client(server: "ReplayServer", **options: Any) -> ChatClient:
    """A client for the replay server with test-sized waits (options override them)."""
    settings: dict[str, Any] = {"timeout_s": 5, "max_retries": 2, "backoff_s": 0.01, **options}
    return ChatClient(server.url, REPLAY_MODEL, **settings)


def replay_proposer(server: "ReplayServer", transcript_dir: Path, *, client_options: dict[str, Any] | None = None,
                    **proposer_options: Any) -> LlmProposer:
    """An LLM proposer talking to the replay server, writing transcripts to `transcript_dir`."""
    return LlmProposer(replay_client(server, **(client_options or {})), transcript_dir, **proposer_options)


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class ReplayServer:
    """Answers chat-completions requests on 127.0.0.1 (ephemeral port) with recorded replies."""

    def __init__(self, replies: Sequence[dict[str, Any]], *, reject_response_format: bool = False) -> None:
        self.replies = list(replies)
        self.reject_response_format = reject_response_format
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_fixtures(cls, *names: str) -> "ReplayServer":
        fixtures = [load_fixture(name) for name in names]
        return cls([reply for f in fixtures for reply in f["replies"]],
                   reject_response_format=any(f.get("reject_response_format") for f in fixtures))

    def add(self, *names: str) -> None:
        """Queue the replies of more fixtures after those not yet used."""
        with self._lock:
            self.replies += [reply for name in names for reply in load_fixture(name)["replies"]]

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start the server first (use it as a context manager)"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def user_prompts(self) -> list[str]:
        """The last user message of every chat request received, in order."""
        return [[m["content"] for m in r.body.get("messages", []) if m.get("role") == "user"][-1]
                for r in self.requests if r.path == CHAT_PATH]

    def __enter__(self) -> "ReplayServer":
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.replay = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopping.set()  # cut short any reply still waiting out its delay
        assert self._httpd is not None and self._thread is not None
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # --- called from the handler thread ----------------------------------------------------------
    def _answer(self, path: str, headers: dict[str, str], raw_body: bytes) -> _Answer:
        try:
            body = json.loads(raw_body or b"{}")
        except ValueError:
            return _error(400, "request body is not JSON")
        with self._lock:
            self.requests.append(RecordedRequest(path, headers, body))
            if path != CHAT_PATH:
                return _error(404, f"no route {path}")
            if self.reject_response_format and "response_format" in body:
                return _error(400, "response_format 'json_schema' is not supported by this server")
            if not self.replies:
                return _error(404, "replay exhausted: no recorded reply left for this request")
            reply = self.replies.pop(0)
        return _render(reply, str(body.get("model", "")))

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> _Answer:
    body = json.dumps({"error": {"message": message, "type": "replay_error", "code": status}}).encode()
    return status, {"Content-Type": "application/json", **(headers or {})}, body, 0.0


def _render(reply: dict[str, Any], model: str) -> _Answer:
    """The HTTP answer a reply spec stands for: status, headers, body, delay."""
    status = int(reply.get("status", 200))
    headers = dict(reply.get("headers", {}))
    delay = float(reply.get("delay_s", 0.0))
    if "error" in reply:
        status, headers, body, _ = _error(status, reply["error"], headers)
        return status, headers, body, delay
    if "body" in reply:
        return status, headers, reply["body"].encode(), delay
    content = reply["content"] if "content" in reply else _kernel_content(reply)
    completion: dict[str, Any] = {
        "id": f"chatcmpl-replay-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                     "finish_reason": reply.get("finish_reason", "stop")}],
    }
    if "usage" in reply:
        completion["usage"] = reply["usage"]
    return status, {"Content-Type": "application/json", **headers}, json.dumps(completion).encode(), delay


def _kernel_content(reply: dict[str, Any]) -> str:
    source = kernel_source(reply["kernel"])
    if reply.get("style", "json") == "json":
        return json.dumps({"name": reply["name"], "source": source, "rationale": reply["rationale"]})
    return f"{reply['rationale']}\n\n```python\n{source}```\n\nTune num_warps for the row length."


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        replay: ReplayServer = self.server.replay  # type: ignore[attr-defined]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        status, headers, body, delay = replay._answer(self.path, dict(self.headers.items()), raw)
        replay._wait(delay)
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (its time limit): nothing to answer to
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads `requests` instead."""
