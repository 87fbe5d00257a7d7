"""The classic cheat: call the library op the kernel is meant to replace."""
import torch
import triton

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"BLOCK": [1024]}
DEFAULT = {"BLOCK": 1024}


def constraints(task, config, target):
    return None


def launch(task, config, inputs, outputs):
    outputs[0].copy_(torch.softmax(inputs[0], dim=-1))
