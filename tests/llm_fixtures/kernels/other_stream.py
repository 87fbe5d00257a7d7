"""A correct kernel launched on a side stream, so a timer on the default stream stops early."""
import triton
import triton.language as tl

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"num_warps": [4, 8]}
DEFAULT = {"num_warps": 4}


@triton.jit
def _row_softmax(x_ptr, y_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=inside, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=inside)


def constraints(task, config, target):
    return None


def launch(task, config, inputs, outputs):
    n_cols = task.inputs[0].shape[-1]
    driver = triton.runtime.driver.active
    side = driver.utils.Stream(inputs[0].device)
    with driver.stream(side):
        _row_softmax[(task.inputs[0].numel // n_cols,)](inputs[0], outputs[0], n_cols,
                                                         BLOCK_N=triton.next_power_of_2(n_cols),
                                                         num_warps=config["num_warps"])
