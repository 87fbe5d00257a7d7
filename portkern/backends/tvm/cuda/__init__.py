"""The TVM backend's CUDA family: schedules of the CPU family's computations for NVIDIA GPUs.

One module per task kind (gemm, conv2d, softmax, layernorm, rmsnorm, groupnorm, elementwise), each with its
own space of block tiles, threads, shared-memory staging, vector widths and unrolling, checked
against the target's hwprofile (threads and shared memory per block, registers) before anything
is built; build.py generates CUDA (and PTX where a compiler is found) with or without a GPU.
"""
from __future__ import annotations

import types

from . import conv2d, elementwise, gemm, groupnorm, layernorm, rmsnorm, softmax

TEMPLATES: dict[str, tuple[types.ModuleType, ...]] = {
    "gemm": (gemm,),
    "conv2d": (conv2d,),
    "softmax": (softmax,),
    "layernorm": (layernorm,),
    "rmsnorm": (rmsnorm,),
    "groupnorm": (groupnorm,),
    "elementwise": (elementwise,),
}
