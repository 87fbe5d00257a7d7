"""GroupNorm (+ activation) with each group split over SPLITS programs: where N x G is small
against the GPU's multiprocessors (Stable Diffusion's 32 groups at batch 1-2 would leave most of
132 SMs idle with one program a group).

Two launches: each program gathers the (mean, M2, count) of its chunk of a group into a workspace;
then each merges its group's SPLITS parts (Chan et al.'s formula) and writes its chunk, reading it
back from L2.
"""
import triton
import triton.language as tl

KIND = "groupnorm"
PRECISION = "fp32"
SPACE = {"SPLITS": [2, 4, 8, 16, 32], "BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16]}
DEFAULT = {"SPLITS": 8, "BLOCK": 1024, "num_warps": 4}

# include: group_norm


def _chunk(task, config):
    """Elements per split: whole BLOCKs, so a split's walk never straddles another's."""
    size = _group_geometry(task)[3]
    return triton.cdiv(triton.cdiv(size, config["SPLITS"]), config["BLOCK"]) * config["BLOCK"]


def constraints(task, config, target):
    size = _group_geometry(task)[3]
    if task.inputs[0].numel and _chunk(task, config) * (config["SPLITS"] - 1) >= size:
        return (f"a group of {size} elements leaves some of {config['SPLITS']} splits of "
                f"{config['BLOCK']}-element blocks empty")
    return _group_reason(task, config, target)


def scratch(task, config):
    parts = task.inputs[0].shape[0] * int(task.attr("groups")) * config["SPLITS"]
    return [((parts,), "float32")] * 3


@triton.jit
def _groupnorm_split(x_ptr, gamma_ptr, beta_ptr, y_ptr, channels, positions, groups, eps, means_ptr, m2s_ptr,
                     counts_ptr, chunk, BLOCK: tl.constexpr, SPLITS: tl.constexpr, CHANNELS_LAST: tl.constexpr,
                     ACTIVATION: tl.constexpr, APPLY: tl.constexpr):
    """Program (group, split) on elements [split * chunk, + chunk) of its group: the first launch
    stores their (mean, M2, count) part; the second (APPLY) merges the group's parts and writes them."""
    group_id, split = tl.program_id(0), tl.program_id(1)
    origin, first_channel, group_channels = _group_origin(group_id, channels, positions, groups, CHANNELS_LAST)
    size = group_channels * positions
    lo = split * chunk
    hi = tl.minimum(lo + chunk, size)
    if APPLY:
        parts = group_id * SPLITS + tl.arange(0, SPLITS)
        mean, m2 = _merge_partials(tl.load(means_ptr + parts), tl.load(m2s_ptr + parts), tl.load(counts_ptr + parts))
        _write_group(x_ptr, gamma_ptr, beta_ptr, y_ptr, lo, hi, mean, tl.rsqrt(m2 / size + eps), origin,
                     first_channel, group_channels, channels, positions, BLOCK, CHANNELS_LAST, ACTIVATION)
    else:
        mean, m2, count = _group_moments(x_ptr, lo, hi, origin, first_channel, group_channels, channels, positions,
                                         BLOCK, CHANNELS_LAST)
        part = group_id * SPLITS + split
        tl.store(means_ptr + part, mean)
        tl.store(m2s_ptr + part, m2)
        tl.store(counts_ptr + part, count)


def launch(task, config, inputs, outputs):
    args, flags = _group_launch_args(task, inputs, outputs)
    grid = (task.inputs[0].shape[0] * int(task.attr("groups")), config["SPLITS"])
    common = dict(BLOCK=config["BLOCK"], SPLITS=config["SPLITS"], **flags, num_warps=config["num_warps"])
    for apply in (False, True):
        _groupnorm_split[grid](*args, *outputs[1:4], _chunk(task, config), **common, APPLY=apply)
