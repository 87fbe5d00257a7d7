"""GroupNorm (+ its activation), triton-ascend style: in NCHW each sample's group is one run of
C/G * positions values. One program per vector core takes groups in turn and walks each in chunks
of BLOCK values through UB: a statistics walk, then a writing walk (a group of one chunk stays in UB
between the two). The statistics are sums of the values less the group's first value (the shifted
data algorithm: no cancellation where the mean is large against the spread). gamma and beta, one
per channel, are loaded into UB once per core; value j of group g takes channel g * C/G + j // positions.
"""
import triton
import triton.language as tl

KIND = "groupnorm"
PRECISION = "fp32"
SPACE = {"BLOCK": [512, 1024, 2048, 4096, 8192], "PROGRAMS": [24, 32, 40, 48], "BUFFERS": [1, 2, 3]}
DEFAULT = {"BLOCK": 2048, "PROGRAMS": 48, "BUFFERS": 2}

# include: cube_common
VECTOR_OPS_PER_ELEMENT = 12  # cast, shift, sum, square, sum; cast, centre, rstd, gamma, beta (gathered), cast back
FP32_TILES = 3  # the chunk in fp32, the gathered gamma and beta


def _groups(task):
    """(groups in all, values per group, channels, channels per group, positions per channel)."""
    shape = task.inputs[0].shape
    groups, channels = int(task.attr("groups")), shape[1]
    positions = task.inputs[0].numel // (shape[0] * channels)
    return shape[0] * groups, channels // groups * positions, channels, channels // groups, positions


def constraints(task, config, target):
    if task.attr("layout") == "nhwc":
        return "a channels-last group is no run of memory (the NPU graph is NCHW)"
    if task.dtype not in ITEMSIZE:
        return f"{task.dtype} is not supported here (fp32/fp16 only)"
    size = _groups(task)[1]
    if config["BLOCK"] >= 2 * max(triton.next_power_of_2(size), 512):
        return f"BLOCK {config['BLOCK']} is over twice the group's {size} values"
    return None


def schedule(task, config, target):
    n_groups, size, channels, _, _ = _groups(task)
    itemsize, block = ITEMSIZE[task.dtype], config["BLOCK"]
    chunks = triton.cdiv(size, block)
    programs = min(config["PROGRAMS"], n_groups)
    chunk_bytes = min(block, size) * itemsize
    ops = VECTOR_OPS_PER_ELEMENT + ACTIVATION_VECTOR_OPS[task.attr("activation", "none")]
    return {
        "core": "vector", "programs": programs, "tiles": triton.cdiv(n_groups, programs) * chunks,
        "total_tiles": n_groups * chunks, "buffers": config["BUFFERS"],
        # a group of several chunks is read twice (statistics, then writing); of one chunk, once
        "per_tile": {"gm_to_ub": (1 if chunks == 1 else 2) * chunk_bytes, "ub_to_gm": chunk_bytes,
                     "vector_ops": block * ops},
        "live": {"ub": config["BUFFERS"] * 2 * block * itemsize + FP32_TILES * block * 4 + 2 * channels * 4},
        "tails": {"ub": [block * itemsize, block * 4]},
        "gm_alignment": min((size * itemsize) & -(size * itemsize), 512),
        "footprint_bytes": 2 * task.inputs[0].numel * itemsize + 2 * channels * itemsize,
        "setup": {"gm_to_ub": 2 * channels * itemsize, "vector_ops": 2 * channels},
        "vector_op_bytes": 4,
    }


@triton.jit
def _groupnorm_chunks(x_ptr, gamma_ptr, beta_ptr, out_ptr, n_groups, size, groups, group_channels, positions, eps,
                      BLOCK: tl.constexpr, ACTIVATION: tl.constexpr):
    pid = tl.program_id(0)
    num_cores = tl.num_programs(0)
    lanes = tl.arange(0, BLOCK)
    for group in range(pid, n_groups, num_cores):
        start = group * size
        shift = tl.load(x_ptr + start).to(tl.float32)
        shifted_sum = tl.full([], 0.0, tl.float32)
        shifted_squares = tl.full([], 0.0, tl.float32)
        for chunk in range(0, size, BLOCK):
            inside = chunk + lanes < size
            d = tl.where(inside, tl.load(x_ptr + start + chunk + lanes, mask=inside, other=0.0).to(tl.float32) - shift,
                         0.0)
            shifted_sum += tl.sum(d, axis=0)
            shifted_squares += tl.sum(d * d, axis=0)
        mean_shift = shifted_sum / size
        rstd = 1.0 / tl.sqrt(tl.maximum(shifted_squares / size - mean_shift * mean_shift, 0.0) + eps)
        mean = shift + mean_shift
        first_channel = (group % groups) * group_channels
        for chunk in range(0, size, BLOCK):
            inside = chunk + lanes < size
            x = tl.load(x_ptr + start + chunk + lanes, mask=inside, other=0.0).to(tl.float32)
            channel = first_channel + (chunk + lanes) // positions
            gamma = tl.load(gamma_ptr + channel, mask=inside, other=0.0).to(tl.float32)
            beta = tl.load(beta_ptr + channel, mask=inside, other=0.0).to(tl.float32)
            y = _activate((x - mean) * rstd * gamma + beta, ACTIVATION)
            tl.store(out_ptr + start + chunk + lanes, y.to(out_ptr.dtype.element_ty), mask=inside)


def launch(task, config, inputs, outputs):
    n_groups, size, _, group_channels, positions = _groups(task)
    _groupnorm_chunks[(min(config["PROGRAMS"], n_groups),)](
        inputs[0], inputs[1], inputs[2], outputs[0], n_groups, size, int(task.attr("groups")), group_channels,
        positions, float(task.attr("eps", 1e-5)), BLOCK=config["BLOCK"], ACTIVATION=task.attr("activation", "none"))
