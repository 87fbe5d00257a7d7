# --- included from _group_norm.py: a group norm's groups as runs of elements, NCHW or NHWC ---
# include: rowwise
# include: moments
# include: activation


def _group_geometry(task):
    """(channels, positions per sample, groups, elements per group, channels last) of a groupnorm task."""
    shape = task.inputs[0].shape
    channels_last = task.attr("layout") == "nhwc"
    channels = shape[-1] if channels_last else shape[1]
    groups = int(task.attr("groups"))
    positions = task.inputs[0].numel // (shape[0] * channels)
    return channels, positions, groups, channels // groups * positions, channels_last


def _group_launch_args(task, inputs, outputs):
    """The tensors and sizes every group-norm kernel takes first, and its constexpr flags."""
    channels, positions, groups, _, channels_last = _group_geometry(task)
    args = (inputs[0], inputs[1], inputs[2], outputs[0], channels, positions, groups, float(task.attr("eps", 1e-5)))
    return args, {"CHANNELS_LAST": channels_last, "ACTIVATION": task.attr("activation", "none")}


def _group_reason(task, config, target):
    """Why a BLOCK-element chunk cannot sit in registers, or None (a group of any size is walked)."""
    if task.inputs[0].numel == 0:
        return "empty tensor"
    return _spill_reason(config["BLOCK"], config, target)


@triton.jit
def _group_origin(group_id, channels, positions, groups, CHANNELS_LAST: tl.constexpr):
    """(the offset of group group_id's first element, its first channel, its channels): group_id
    counts the groups of sample 0 first."""
    group_channels = channels // groups
    sample = group_id // groups
    first_channel = (group_id % groups) * group_channels
    if CHANNELS_LAST:
        origin = sample.to(tl.int64) * positions * channels + first_channel
    else:
        origin = (sample.to(tl.int64) * channels + first_channel) * positions
    return origin, first_channel, group_channels


@triton.jit
def _group_slots(index, origin, first_channel, group_channels, channels, positions, CHANNELS_LAST: tl.constexpr):
    """The offsets and channels of a group's elements numbered `index` in memory order (NCHW: one
    run, channel after channel; NHWC: a run of its channels at each position)."""
    if CHANNELS_LAST:
        within = index % group_channels
        return origin + (index // group_channels).to(tl.int64) * channels + within, first_channel + within
    return origin + index, first_channel + index // positions


@triton.jit
def _group_moments(x_ptr, lo, hi, origin, first_channel, group_channels, channels, positions,
                   BLOCK: tl.constexpr, CHANNELS_LAST: tl.constexpr):
    """(mean, M2, count) of a group's elements lo .. hi - 1, read in BLOCK chunks and kept in cache
    for the writing walk."""
    lanes = tl.arange(0, BLOCK)
    mean = tl.full([], 0.0, tl.float32)
    m2 = tl.full([], 0.0, tl.float32)
    seen = tl.full([], 0.0, tl.float32)
    for start in range(lo, hi, BLOCK):
        index = start + lanes
        mask = index < hi
        offsets, _ = _group_slots(index, origin, first_channel, group_channels, channels, positions, CHANNELS_LAST)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
        mean, m2, seen = _merge_chunk(mean, m2, seen, x, mask, tl.minimum(hi - start, BLOCK).to(tl.float32))
    return mean, m2, seen


@triton.jit
def _write_group(x_ptr, gamma_ptr, beta_ptr, y_ptr, lo, hi, mean, rstd, origin, first_channel, group_channels,
                 channels, positions, BLOCK: tl.constexpr, CHANNELS_LAST: tl.constexpr, ACTIVATION: tl.constexpr):
    """y = act((x - mean) * rstd * gamma[channel] + beta[channel]) for a group's elements lo .. hi - 1."""
    lanes = tl.arange(0, BLOCK)
    for start in range(lo, hi, BLOCK):
        index = start + lanes
        mask = index < hi
        offsets, channel = _group_slots(index, origin, first_channel, group_channels, channels, positions,
                                        CHANNELS_LAST)
        x = tl.load(x_ptr + offsets, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
        gamma = tl.load(gamma_ptr + channel, mask=mask, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + channel, mask=mask, other=0.0).to(tl.float32)
        y = _activate((x - mean) * rstd * gamma + beta, ACTIVATION)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)
