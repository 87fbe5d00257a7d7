"""GroupNorm (+ its activation) on the CPU: in NCHW each sample's group is one row of the
(N * G, C/G * positions) view, normalized as layernorm.py normalizes a row (two passes for the
statistics, one to write); the affine is per channel, column j of group g's row being channel
g * C/G + j // positions. layernorm.py's space and schedule; the CUDA family's groupnorm (cuda/groupnorm.py)
schedules the same computation."""
from __future__ import annotations

from typing import Any, Mapping

from tvm import te

from ...hwprofile import Target
from ...tasks import Task
from . import layernorm
from .common import ACTIVATIONS, Computation, Kernel, check_float32, check_row_lanes, check_space

KIND = "groupnorm"
PRECISION = "fp32"
SPACE = layernorm.SPACE
DEFAULT = layernorm.DEFAULT


def dims(task: Task) -> tuple[int, int, int, int]:
    """(rows, row length, channels, positions per channel): a row per sample and group."""
    shape = task.inputs[0].shape
    groups = int(task.attr("groups"))
    positions = task.inputs[0].numel // (shape[0] * shape[1])
    return shape[0] * groups, shape[1] // groups * positions, shape[1], positions


def row_dims(task: Task) -> tuple[int, int]:
    """(rows, row length): the task as the rows a row schedule walks."""
    return dims(task)[:2]


def layout_problem(task: Task) -> str | None:
    if task.attr("layout") == "nhwc":
        return "a channels-last group is no run of memory (the TVM graphs are NCHW)"
    return None


def constraints(task: Task, config: Mapping[str, Any], target: Target) -> str | None:
    return (layout_problem(task) or check_float32(task) or check_space(config, SPACE)
            or check_row_lanes(config, dims(task)[1], target, "group size"))


def computation(task: Task, lanes: int) -> Computation:
    rows, n, channels, positions = dims(task)
    groups = int(task.attr("groups"))
    x, normed = layernorm.standardized(rows, n, float(task.attr("eps", 1e-5)), lanes)
    gamma = te.placeholder((channels,), "float32", name="gamma")
    beta = te.placeholder((channels,), "float32", name="beta")

    def channel(r: Any, j: Any) -> Any:
        return r % groups * (channels // groups) + j // positions

    affine = te.compute((rows, n), lambda r, j: normed(r, j) * gamma[channel(r, j)] + beta[channel(r, j)],
                        name="affine")
    activated = ACTIVATIONS[task.attr("activation", "none")](affine)
    out = te.compute((rows, n), lambda r, j: activated[r, j], name="out")
    return Computation((x, gamma, beta, out), ((rows, n), (channels,), (channels,), (rows, n)),
                       layernorm.STANDARDIZED_STAGES)


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    return layernorm.schedule_norm(computation(task, layernorm.reduce_lanes(config)), config)
