"""Softmax over the last axis on the toy CPU, ROWS rows at a time."""
import numpy as np

KIND = "softmax"
PRECISION = "fp32"
SPACE = {"ROWS": [1, 16, 64]}
DEFAULT = {"ROWS": 16}


def constraints(task, config, target):
    if task.dtype != "float32":
        return "the toy CPU computes float32 only"
    return None


def launch(task, config, inputs, outputs):
    x = inputs[0].reshape(-1, inputs[0].shape[-1])
    out = outputs[0].reshape(x.shape)
    for start in range(0, x.shape[0], config["ROWS"]):
        rows = x[start:start + config["ROWS"]]
        shifted = np.exp(rows - np.max(rows, axis=1, keepdims=True))
        out[start:start + config["ROWS"]] = shifted / np.sum(shifted, axis=1, keepdims=True)
