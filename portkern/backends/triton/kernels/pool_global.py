"""Global average pooling over NCHW as a row mean: (N*C) rows of H*W, ROWS_PER_PROGRAM rows a program.

Every image plane is contiguous, so the loads are unit-stride BLOCK_HW chunks summed lane-wise in
fp32; small planes (7x7 in ResNets) still fill a tile by taking several planes per program.
"""
import triton
import triton.language as tl

KIND = "pool"
PRECISION = "fp32"
SPACE = {"ROWS_PER_PROGRAM": [1, 2, 4, 8, 16, 32], "BLOCK_HW": [16, 64, 256, 1024],
         "num_warps": [1, 2, 4, 8]}
DEFAULT = {"ROWS_PER_PROGRAM": 4, "BLOCK_HW": 64, "num_warps": 4}

# include: rowwise


def constraints(task, config, target):
    if task.attr("op") != "global_avg":
        return "this variant only does global average pooling"
    if len(task.inputs[0].shape) != 4 or task.inputs[0].numel == 0 or task.attr("layout") == "nhwc":
        return "this variant takes a non-empty NCHW input (pool_window walks NHWC channels)"
    return _spill_reason(config["ROWS_PER_PROGRAM"] * config["BLOCK_HW"], config, target)


@triton.jit
def _plane_means(x_ptr, y_ptr, n_planes, plane_size, BLOCK_HW: tl.constexpr, ROWS: tl.constexpr):
    planes = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_HW)
    starts = tl.minimum(planes, n_planes - 1).to(tl.int64)[:, None] * plane_size
    acc = tl.zeros([ROWS, BLOCK_HW], dtype=tl.float32)
    for start in range(0, plane_size, BLOCK_HW):
        mask = start + cols[None, :] < plane_size
        acc += tl.load(x_ptr + starts + start + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    means = tl.sum(acc, axis=1) / plane_size
    tl.store(y_ptr + planes, means.to(y_ptr.dtype.element_ty), mask=planes < n_planes)


def launch(task, config, inputs, outputs):
    batch, channels, height, width = task.inputs[0].shape
    n_planes = batch * channels
    rows_per_program = config["ROWS_PER_PROGRAM"]
    _plane_means[(triton.cdiv(n_planes, rows_per_program),)](
        inputs[0], outputs[0], n_planes, height * width, BLOCK_HW=config["BLOCK_HW"],
        ROWS=rows_per_program, num_warps=config["num_warps"])
