"""Kernel proposals from an LLM through any OpenAI-compatible chat-completions endpoint.

Standard library only (http.client): `pip install portkern[llm]` adds nothing. See docs/llm.md.
"""
from __future__ import annotations

from .client import (
    ChatClient,
    ChatReply,
    KernelReply,
    LlmBudget,
    LlmBudgetExhausted,
    LlmError,
    MalformedReply,
    parse_kernel_reply,
)
from .prompt import PreviousAttempt, build_prompt
from .proposer import TRANSCRIPT_FORMAT, LlmProposer

__all__ = ["TRANSCRIPT_FORMAT", "ChatClient", "ChatReply", "KernelReply", "LlmBudget", "LlmBudgetExhausted",
           "LlmError", "LlmProposer", "MalformedReply", "PreviousAttempt", "build_prompt", "parse_kernel_reply"]
