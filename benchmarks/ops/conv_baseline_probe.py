"""How cheap can the cuDNN baseline of a fused conv task be? (NHWC, fp16, ResNet-50 shapes, b32)

A conv task the search does not beat runs on its baseline. Before cuDNN's fused epilogue became
the baseline (baselines.py), that was cuDNN's conv, then torch's bias add, residual and ReLU as
separate kernels, then a copy into the task's output buffer. For each shape, the harness's time
(portkern.measure, CUDA events behind a spin kernel) of:
  current   that unfused path, as the runtime ran it (copied into the output)
  out       the same ops, the last one writing into the output buffer (no copy)
  cudnn     the backend's baseline: torch.cudnn_convolution_relu / cudnn_convolution_add_relu
and each one's largest relative difference from `current`.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/conv_baseline_probe.py --out $OUT/conv-baseline.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from portkern.backends import get_backend
from portkern.hwprofile import load_target
from portkern.measure import time_program
from portkern.synthetic import conv2d_task
from portkern.tasks import Task
from portkern.verify import make_inputs

# (channels in, spatial, channels out, kernel, residual): ResNet-50's convs that stayed on cuDNN
SHAPES = [(256, 14, 256, 3, False), (512, 7, 512, 3, False), (256, 28, 256, 3, False), (512, 14, 512, 3, False),
          (2048, 7, 512, 1, False), (512, 7, 2048, 1, True), (256, 56, 64, 1, False), (64, 56, 256, 1, True)]


def task_for(c: int, size: int, oc: int, k: int, residual: bool) -> Task:
    return conv2d_task(32, c, size, size, oc, k, k, "float16", pad=k // 2, activation="relu",
                       residual=residual, nhwc=True)


def nchw(x: torch.Tensor) -> torch.Tensor:
    return x.permute(0, 3, 1, 2)


def unfused_program(task: Task, into_output: bool) -> Callable[[Sequence[Any], Sequence[Any]], None]:
    """conv (with bias) + residual + ReLU as torch's separate kernels; the ReLU writes the output
    buffer, or its result is copied there."""
    pad = task.attr("pads")[0]

    def run(inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        x, w, bias, *rest = (nchw(t) if t.ndim == 4 else t for t in inputs)
        y = F.conv2d(x, w, bias, padding=pad)
        if rest:
            y = y.add_(rest[0])
        if into_output:
            torch.clamp_min(y, 0, out=nchw(outputs[0]))
        else:
            nchw(outputs[0]).copy_(torch.relu(y))
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="conv_baseline_probe.json")
    args = parser.parse_args()
    backend = get_backend(load_target("h200"))
    rows = []
    for shape in SHAPES:
        task = task_for(*shape)
        inputs = [backend.to_device(a) for a in make_inputs(task, 5, "normal")]
        programs = {"current": unfused_program(task, False), "out": unfused_program(task, True),
                    "cudnn": backend.baseline(task)}
        row: dict[str, Any] = {"task": task.label, "shape": shape, "us": {}, "max_rel_diff": {}, "errors": {}}
        want = None
        for name, program in programs.items():
            try:
                out = backend.empty(task.outputs[0], 0.0)
                program(inputs, [out])
                backend.synchronize()
                if want is None:
                    want = out.float()
                row["max_rel_diff"][name] = float((out.float() - want).abs().max() / want.abs().max())
                row["us"][name] = time_program(backend, program, task, inputs=[inputs]).median * 1e6
            except Exception as exc:  # a missing op is a result
                row["errors"][name] = f"{type(exc).__name__}: {exc}"[:300]
        print(task.label, {k: round(v, 2) for k, v in row["us"].items()}, row["errors"], flush=True)
        rows.append(row)
    document = {"benchmark": "conv task baselines on cuDNN: unfused (current), into the output, cuDNN fused",
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "command": " ".join(sys.argv),
                "device": backend.fingerprint(), "method": backend.timing_method, "rows": rows}
    with open(args.out, "w") as handle:
        json.dump(document, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
