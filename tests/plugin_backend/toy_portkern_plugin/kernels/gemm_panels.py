"""GEMM on the toy CPU: BLOCK_M-row panels of A times B, the epilogue fused per panel."""
import numpy as np

KIND = "gemm"
PRECISION = "fp32"
SPACE = {"BLOCK_M": [8, 32, 128]}
DEFAULT = {"BLOCK_M": 32}


def constraints(task, config, target):
    if task.dtype != "float32":
        return "the toy CPU computes float32 only"
    if task.attr("activation", "none") not in ("none", "relu"):
        return f"activation {task.attr('activation')} is not on the toy CPU"
    if config["BLOCK_M"] > target.profile.limit("max_block_rows"):
        return f"BLOCK_M {config['BLOCK_M']} exceeds the toy CPU's {target.profile.limit('max_block_rows'):.0f} rows"
    return None


def launch(task, config, inputs, outputs):
    a = inputs[0].reshape(-1, inputs[0].shape[-1])
    b = inputs[1].T if task.attr("trans_b", False) else inputs[1]
    out = outputs[0].reshape(a.shape[0], b.shape[1])
    extra = iter(inputs[2:])
    bias = next(extra) if task.attr("bias", False) else None
    residual = next(extra).reshape(out.shape) if task.attr("residual", False) else None
    for start in range(0, a.shape[0], config["BLOCK_M"]):
        rows = slice(start, start + config["BLOCK_M"])
        panel = np.dot(a[rows], b)
        if bias is not None:
            panel += bias
        if task.attr("activation", "none") == "relu":
            np.maximum(panel, 0.0, out=panel)
        if residual is not None:
            panel += residual[rows]
        out[rows] = panel
