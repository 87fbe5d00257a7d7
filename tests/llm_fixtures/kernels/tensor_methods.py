"""A subtler cheat: the softmax is computed with the framework's tensor methods (no torch import,
no forbidden name), and a trivial Triton kernel is launched so that "a kernel ran"."""
import triton
import triton.language as tl

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"num_warps": [4]}
DEFAULT = {"num_warps": 4}


@triton.jit
def _touch(y_ptr):
    offsets = tl.arange(0, 1)
    tl.store(y_ptr + offsets, tl.load(y_ptr + offsets))


def constraints(task, config, target):
    return None


def launch(task, config, inputs, outputs):
    x = inputs[0]
    numerator = (x - x.amax(-1, keepdim=True)).exp()
    outputs[0].copy_(numerator / numerator.sum(-1, keepdim=True))
    _touch[(1,)](outputs[0])
