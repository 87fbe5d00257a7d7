"""Triton backend (CUDA GPUs; the Triton interpreter on CPU; cross-compiles for sm_90/sm_80/gfx942)."""
from __future__ import annotations

from .backend import TritonBackend
from .compile_only import compile_for

__all__ = ["TritonBackend", "compile_for"]
