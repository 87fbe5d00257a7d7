"""A chat-completions client over the standard library, for any OpenAI-compatible server.

Local servers (vLLM, SGLang, Ollama, llama.cpp) and hosted ones speak the same
`POST {endpoint}/chat/completions`; they differ in what they accept (structured output) and in
how they fail (rate limits, restarts, slow answers). The client asks for structured output, falls
back to plain text when the server refuses it, retries what is worth retrying, bounds every
request in time and every tune in requests and tokens, and turns what cannot be fixed into one
line that names the endpoint.
"""
from __future__ import annotations

import email.utils
import http.client
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any, Sequence
from urllib.parse import urlsplit

from ...errors import BudgetExhausted, PortkernError

Message = dict[str, str]

# What the kernel reply must hold; servers that support json_schema constrain decoding to it.
KERNEL_REPLY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "a short snake_case name for the kernel"},
        "source": {"type": "string", "description": "the complete kernel module, as Python source"},
        "rationale": {"type": "string", "description": "why it should be correct and faster"},
    },
    "required": ["name", "source", "rationale"],
    "additionalProperties": False,
}

_RETRY_STATUSES = frozenset({408, 409, 425, 429}) | frozenset(range(500, 600))
_MAX_WAIT_S = 60.0  # never sleep longer than this between attempts, whatever Retry-After says
_CHARS_PER_TOKEN = 4  # rough size of a token when the server reports no usage
_MAX_DETAIL_CHARS = 300


class LlmError(PortkernError):
    """The endpoint failed in a way retries did not fix; the message is one line."""


class LlmBudgetExhausted(BudgetExhausted):
    """The tune's LLM requests or tokens are spent: a normal stop for the LLM proposer."""


class MalformedReply(ValueError):
    """The model answered, but the answer holds no kernel source (a failed attempt, not an error)."""


@dataclass
class LlmBudget:
    """Requests and tokens one tune may spend on the LLM; every HTTP attempt counts as a request."""

    max_requests: int = 32
    max_tokens: int = 400_000
    requests: int = 0
    tokens: int = 0

    @property
    def remaining_tokens(self) -> int:
        return max(self.max_tokens - self.tokens, 0)

    def reserve(self, prompt_tokens: int) -> int:
        """Admit one more request whose prompt is about `prompt_tokens`; returns the tokens left
        for the answer. Raises LlmBudgetExhausted when a request or its prompt would not fit."""
        if self.requests >= self.max_requests:
            raise LlmBudgetExhausted(f"LLM budget spent: {self.requests} of {self.max_requests} requests used")
        room = self.remaining_tokens - prompt_tokens
        if room <= 0:
            raise LlmBudgetExhausted(f"LLM budget spent: {self.tokens} of {self.max_tokens} tokens used, "
                                     f"the next prompt needs ~{prompt_tokens}")
        self.requests += 1
        return room

    def charge(self, tokens: int) -> None:
        self.tokens += max(tokens, 0)


@dataclass
class ChatReply:
    """One answered request: the text, what it cost, and how it was obtained."""

    content: str
    tokens: int  # charged to the budget: the server's usage.total_tokens, or an estimate
    usage_reported: bool
    structured: bool  # whether the answer was constrained by response_format json_schema
    attempts: int  # HTTP attempts this reply took (retries and the structured-output fallback)
    elapsed_s: float
    raw: dict[str, Any] = field(default_factory=dict)  # the response body as received
    finish_reason: str = ""  # 'stop', or 'length' when the answer hit max_tokens


@dataclass(frozen=True)
class KernelReply:
    """A kernel proposal read out of a reply."""

    name: str
    source: str
    rationale: str
    extracted_from: str  # 'json' | 'fenced-code'


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / _CHARS_PER_TOKEN)


def one_line(text: str, limit: int = _MAX_DETAIL_CHARS) -> str:
    """Collapse whitespace so a server's message fits the one-line error convention."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: a number, or an HTTP date (RFC 9110); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(moment.timestamp() - time.time(), 0.0)


class _Response:
    """Status, headers and body of one HTTP exchange."""

    def __init__(self, status: int, reason: str, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8", errors="replace"))

    def detail(self) -> str:
        """The server's own explanation: error.message / message / detail, or the raw text."""
        text = self.body.decode("utf-8", errors="replace")
        try:
            data = json.loads(text)
        except ValueError:
            return one_line(text)
        if isinstance(data, dict):
            error = data.get("error")
            if isinstance(error, dict) and error.get("message"):
                return one_line(str(error["message"]))
            for key in ("error", "message", "detail"):
                if isinstance(data.get(key), str):
                    return one_line(data[key])
        return one_line(text)


class ChatClient:
    """POST {endpoint}/chat/completions with retries, a time limit per request and a budget."""

    def __init__(self, endpoint: str, model: str, api_key_env: str = "PORTKERN_LLM_API_KEY",
                 timeout_s: float = 120, max_retries: int = 4, budget: LlmBudget | None = None, *,
                 backoff_s: float = 1.0, temperature: float | None = 0.7,
                 max_completion_tokens: int = 8192) -> None:
        parts = urlsplit(endpoint.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LlmError(f"LLM endpoint {endpoint!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")
        self.endpoint = endpoint.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.budget = budget if budget is not None else LlmBudget()
        self.backoff_s = backoff_s
        self.temperature = temperature
        self.max_completion_tokens = max_completion_tokens
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port
        self._path = f"{parts.path}/chat/completions"
        self._structured: bool | None = None  # unknown until the server accepts or refuses it

    @property
    def structured_output(self) -> bool | None:
        """Whether the server takes response_format json_schema (None: not asked yet)."""
        return self._structured

    # --- the one public call ---------------------------------------------------------------------
    def complete(self, messages: Sequence[Message]) -> ChatReply:
        """Ask for one kernel reply; structured when the server allows, plain text otherwise."""
        start = time.monotonic()
        prompt_tokens = sum(estimate_tokens(m["content"]) + 4 for m in messages)
        structured = self._structured is not False
        response, attempts = self._post_with_retries(messages, structured, prompt_tokens)
        if structured and response.status == 400:
            # the server may not do json_schema (or not this way): ask again in plain text
            structured = False
            response, more = self._post_with_retries(messages, structured, prompt_tokens)
            attempts += more
        if response.status != 200:
            raise self._error(f"HTTP {response.status} {response.reason}: {response.detail()}", attempts)
        self._structured = structured  # plain text only worked: stay plain for this server
        try:
            body = response.json()
        except ValueError:
            self.budget.charge(prompt_tokens)
            raise self._error(f"the answer is not JSON: {one_line(response.body.decode('utf-8', 'replace'), 120)}",
                              attempts) from None
        choice = _first_choice(body)
        if choice is None:
            self.budget.charge(prompt_tokens)
            raise self._error(f"the answer has no choices: {one_line(json.dumps(body), 120)}", attempts)
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
        # an empty or missing content (a refusal, a cut-off answer) is the model's failure, not the endpoint's
        content = text if isinstance(text, str) else ""
        tokens, reported = _usage_tokens(body, prompt_tokens, content)
        self.budget.charge(tokens)
        return ChatReply(content=content, tokens=tokens, usage_reported=reported, structured=structured,
                         attempts=attempts, elapsed_s=time.monotonic() - start, raw=body,
                         finish_reason=str(choice.get("finish_reason") or ""))

    # --- HTTP --------------------------------------------------------------------------------------
    def _payload(self, messages: Sequence[Message], structured: bool, answer_tokens: int) -> bytes:
        payload: dict[str, Any] = {"model": self.model, "messages": list(messages),
                                   "max_tokens": min(self.max_completion_tokens, answer_tokens)}
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        if structured:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "kernel_module", "strict": True, "schema": KERNEL_REPLY_SCHEMA},
            }
        return json.dumps(payload).encode()

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _post_with_retries(self, messages: Sequence[Message], structured: bool,
                           prompt_tokens: int) -> tuple[_Response, int]:
        """The first answer that is not worth retrying (any 2xx/4xx but 408/409/425/429), and the
        attempts it took. Exhausted retries on 429/5xx, timeouts or connection errors raise."""
        attempt = 0
        while True:
            answer_tokens = self.budget.reserve(prompt_tokens)
            attempt += 1
            wait_hint: float | None = None
            try:
                response = self._post_once(self._payload(messages, structured, answer_tokens))
            except TimeoutError:
                failure = f"no complete answer within {self.timeout_s:g} s"
            except (OSError, http.client.HTTPException) as exc:
                failure = f"cannot connect or read the answer ({type(exc).__name__}: {one_line(str(exc), 120)})"
            else:
                if response.status not in _RETRY_STATUSES:
                    return response, attempt
                failure = f"HTTP {response.status} {response.reason}: {response.detail()}"
                wait_hint = retry_after_seconds(response.headers.get("Retry-After"))
            if attempt > self.max_retries:
                raise self._error(failure, attempt)
            time.sleep(self._wait_seconds(attempt, wait_hint))

    def _wait_seconds(self, attempt: int, retry_after: float | None) -> float:
        """Exponential backoff with jitter; the server's Retry-After wins when it gives one."""
        if retry_after is not None:
            return min(retry_after, _MAX_WAIT_S)
        base = self.backoff_s * 2 ** (attempt - 1)
        return min(base + random.uniform(0, base), _MAX_WAIT_S)

    def _post_once(self, payload: bytes) -> _Response:
        """One POST, bounded by timeout_s from connect to the last byte (a trickling server too)."""
        deadline = time.monotonic() + self.timeout_s
        connection_class = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        connection = connection_class(self._host, self._port, timeout=self.timeout_s)
        try:
            connection.request("POST", self._path, body=payload, headers=self._headers())
            _limit_socket(connection, deadline)
            response = connection.getresponse()
            chunks: list[bytes] = []
            while True:
                _limit_socket(connection, deadline)
                chunk = response.read1(65536)
                if not chunk:
                    break
                chunks.append(chunk)
            return _Response(response.status, response.reason, response.headers, b"".join(chunks))
        finally:
            connection.close()

    def _error(self, what: str, attempts: int) -> LlmError:
        tries = f" (after {attempts} attempts)" if attempts > 1 else ""
        return LlmError(f"LLM endpoint {self.endpoint}: {what}{tries}")


def _limit_socket(connection: http.client.HTTPConnection, deadline: float) -> None:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError("request time limit reached")
    if connection.sock is not None:
        connection.sock.settimeout(remaining)


def _first_choice(body: Any) -> dict[str, Any] | None:
    choices = body.get("choices") if isinstance(body, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _usage_tokens(body: dict[str, Any], prompt_tokens: int, content: str) -> tuple[int, bool]:
    """Tokens the exchange cost: the server's count, else an estimate from characters."""
    usage = body.get("usage")
    if isinstance(usage, dict):
        total = usage.get("total_tokens")
        if isinstance(total, int):
            return total, True
        parts = [usage.get("prompt_tokens"), usage.get("completion_tokens")]
        if all(isinstance(p, int) for p in parts):
            return sum(parts), True  # type: ignore[arg-type]
    return prompt_tokens + estimate_tokens(content), False


# --- reading a kernel out of the answer ----------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_THINKING = re.compile(r"<think>.*?</think>", re.S)
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_]+")


def parse_kernel_reply(content: str, default_name: str = "kernel") -> KernelReply:
    """The kernel in a reply: a JSON object {name, source, rationale} (structured output, or JSON
    the model wrote itself), else the longest ```python fenced block."""
    text = _THINKING.sub("", content).strip()
    data = _json_object(text)
    if data is not None:
        source = data.get("source")
        if isinstance(source, str) and source.strip():
            return KernelReply(name=safe_name(str(data.get("name") or default_name)), source=source.strip() + "\n",
                               rationale=str(data.get("rationale") or ""), extracted_from="json")
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(text)]
    python_blocks = [body for lang, body in blocks if lang in ("python", "py", "python3", "")]
    if python_blocks:
        source = max(python_blocks, key=len).strip()
        if source:
            rationale = one_line(_FENCE.sub(" ", text), 600)
            return KernelReply(name=safe_name(default_name), source=source + "\n", rationale=rationale,
                               extracted_from="fenced-code")
    if data is not None:
        raise MalformedReply("the JSON reply has no non-empty 'source' string")
    raise MalformedReply("the reply holds no kernel source: neither a JSON object with 'source' "
                         "nor a ```python fenced block")


def safe_name(name: str) -> str:
    """A name usable as a variant and file name: letters, digits, underscores, at most 40 chars."""
    cleaned = _NAME_CHARS.sub("_", name).strip("_").lower()[:40]
    return cleaned or "kernel"


def _json_object(text: str) -> dict[str, Any] | None:
    """The reply as a JSON object, also when wrapped in a ```json fence."""
    candidates = [text]
    candidates += [body for lang, body in _FENCE.findall(text) if lang.lower() == "json"]
    for candidate in candidates:
        try:
            data = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None
