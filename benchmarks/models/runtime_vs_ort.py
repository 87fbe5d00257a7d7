"""Each exported model run by portkern.Session for a GPU target with an empty pack (every task on
its backend's baseline op, the glue between tasks on torch), on this host, against onnxruntime's CPU
provider on the same file and feeds: checks that the partition's tasks (as that backend fuses
them: rotary, gated GEMMs, folded transposes) compute the model, with no GPU and no tuning.

    python benchmarks/models/export_hf.py --out /tmp/hf-models
    python benchmarks/models/runtime_vs_ort.py /tmp/hf-models/llama.onnx /tmp/hf-models/phi.onnx

--float32 DIR, for float16 files: also each one's error and onnxruntime's own float16 error against
onnxruntime's run of DIR/NAME.onnx, the float32 export of the same model, on the same feeds (how much
of the error is float16's).
"""
from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import numpy as np
import onnxruntime as ort

from portkern.hwprofile import load_target
from portkern.models import random_feeds
from portkern.onnx_import import load_model
from portkern.pack import Pack
from portkern.runtime import Session


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    want = want.astype(np.float64)
    return float(np.linalg.norm(got.astype(np.float64) - want) / max(float(np.linalg.norm(want)), 1e-30))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="ONNX files")
    parser.add_argument("--target", default="h200", help="a GPU target whose backend runs on the CPU (Triton)")
    parser.add_argument("--seed", type=int, default=1, help="random_feeds' seed")
    parser.add_argument("--float32", type=Path, help="folder of the float32 exports of the (float16) models")
    args = parser.parse_args()
    target = load_target(args.target)
    empty = Pack(target={**asdict(target.profile), "name": args.target, "backend": target.backend},
                 fingerprint={}, entries={})
    print("model  tasks-by-kind  gated-gemms  partial-rotary-dims  max-rel-L2-vs-onnxruntime")
    for path in args.models:
        graph = load_model(path)
        feeds = random_feeds(graph, seed=args.seed)
        session = Session(path, empty, allow_mismatch=True)
        got = session.run(feeds)
        reference = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        want = dict(zip(graph.outputs, reference.run(graph.outputs, feeds)))
        kinds = dict(sorted(Counter(task.kind for task in session.tasks).items()))
        gated = sum(task.attr("residual_op") == "mul" for task in session.tasks)
        partial = sorted({task.attr("rotary_dims") for task in session.tasks if task.attr("rotary_dims")})
        error = max(rel_l2(got[name], want[name]) for name in graph.outputs)
        print(f"{path.stem}  {kinds}  {gated}  {partial}  {error:.3g}", flush=True)
        if args.float32 is not None:
            wide_path = args.float32 / path.name
            wide_feeds = {name: value.astype(np.float32) if value.dtype == np.float16 else value
                          for name, value in feeds.items()}
            session32 = ort.InferenceSession(str(wide_path), providers=["CPUExecutionProvider"])
            exact = dict(zip(graph.outputs, session32.run(graph.outputs, wide_feeds)))
            print(f"  against {wide_path}: onnxruntime float16 "
                  f"{max(rel_l2(want[name], exact[name]) for name in graph.outputs):.3g}, portkern float16 "
                  f"{max(rel_l2(got[name], exact[name]) for name in graph.outputs):.3g}", flush=True)


if __name__ == "__main__":
    main()
