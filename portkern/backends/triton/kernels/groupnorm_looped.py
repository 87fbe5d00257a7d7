"""GroupNorm (+ activation) with one program per (sample, group): a statistics walk over the group,
then a writing walk that reads it back from L2.

Any group size, NCHW (a group is one run of memory) or NHWC (a run of its channels at each
position). One launch; N x G programs, so it fills the GPU where there are many groups (a batch);
groupnorm_split spreads each group over several programs where there are few.
"""
import triton
import triton.language as tl

KIND = "groupnorm"
PRECISION = "fp32"
SPACE = {"BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16]}
DEFAULT = {"BLOCK": 1024, "num_warps": 4}

# include: group_norm


def constraints(task, config, target):
    return _group_reason(task, config, target)


@triton.jit
def _groupnorm_looped(x_ptr, gamma_ptr, beta_ptr, y_ptr, channels, positions, groups, eps, BLOCK: tl.constexpr,
                      CHANNELS_LAST: tl.constexpr, ACTIVATION: tl.constexpr):
    origin, first_channel, group_channels = _group_origin(tl.program_id(0), channels, positions, groups, CHANNELS_LAST)
    size = group_channels * positions
    mean, m2, _ = _group_moments(x_ptr, 0, size, origin, first_channel, group_channels, channels, positions,
                                 BLOCK, CHANNELS_LAST)
    rstd = tl.rsqrt(m2 / size + eps)
    _write_group(x_ptr, gamma_ptr, beta_ptr, y_ptr, 0, size, mean, rstd, origin, first_channel, group_channels,
                 channels, positions, BLOCK, CHANNELS_LAST, ACTIVATION)


def launch(task, config, inputs, outputs):
    args, flags = _group_launch_args(task, inputs, outputs)
    batch, groups = task.inputs[0].shape[0], int(task.attr("groups"))
    _groupnorm_looped[(batch * groups,)](*args, BLOCK=config["BLOCK"], **flags, num_warps=config["num_warps"])
