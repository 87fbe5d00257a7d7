"""A loaded TVM kernel as a portkern Program: TVM tensors in, TVM tensors out, no copies."""
from __future__ import annotations

from typing import Any, Sequence


class TvmProgram:
    """A built kernel: views each buffer with the shape the kernel takes, then calls it."""

    def __init__(self, function: Any, arg_shapes: Sequence[Sequence[int]]) -> None:
        self.function = function
        self.arg_shapes = [tuple(shape) for shape in arg_shapes]

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        buffers = [*inputs, *outputs]
        if len(buffers) != len(self.arg_shapes):
            raise ValueError(f"kernel takes {len(self.arg_shapes)} buffers, got {len(buffers)}")
        # a same-size view (no copy): a GEMM's (B, S, K) input is the kernel's (B*S, K) matrix
        args = [buf if tuple(buf.shape) == shape else buf._create_view(shape)
                for buf, shape in zip(buffers, self.arg_shapes)]
        self.function(*args)
