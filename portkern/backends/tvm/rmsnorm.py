"""RMSNorm over the last axis on the CPU: one vectorized pass for the sum of squares, one to write.

out = x / sqrt(mean(x^2) + eps) * gamma. The computation is layernorm.rmsnorm_computation (one TE
definition with cuda/rmsnorm.py); the space, the constraints and the row schedule are LayerNorm's,
whose rows are walked the same way.
"""
from __future__ import annotations

from typing import Any, Mapping

from ...hwprofile import Target
from ...tasks import Task
from .common import Kernel
from .layernorm import DEFAULT, SPACE, constraints, reduce_lanes, rmsnorm_computation, schedule_norm

KIND = "rmsnorm"
PRECISION = "fp32"
__all__ = ["KIND", "PRECISION", "SPACE", "DEFAULT", "constraints", "schedule"]


def schedule(task: Task, config: Mapping[str, Any], target: Target) -> Kernel:
    return schedule_norm(rmsnorm_computation(task, reduce_lanes(config)), config)
