"""Host <-> GPU copies as the runtime makes them (TritonBackend.copy_into / to_host) against torch's
plain pageable copies, on the sizes of ResNet-50's input and BERT-base's output at batch 32; and a
round trip per dtype that must return the same bits.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/host_copy_probe.py --out $OUT/host-copy.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import ml_dtypes
import numpy as np
import torch

from portkern.backends import get_backend
from portkern.hwprofile import load_target


def median_seconds(run, repeats: int = 30) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="host_copy.json")
    args = parser.parse_args()
    backend = get_backend(load_target("h200"))
    rng = np.random.default_rng(0)
    round_trips = {}
    for dtype in ("float16", "float32", "int64", "bfloat16"):
        host = rng.standard_normal((3, 5, 7)).astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
        buffer = backend.to_device(np.zeros_like(host))
        backend.copy_into(buffer, host)
        back = backend.to_host(buffer)
        round_trips[dtype] = bool(back.dtype == host.dtype and np.array_equal(back.view(np.uint8), host.view(np.uint8)))
    rows = []
    for name, shape in (("resnet50 input b32", (32, 3, 224, 224)), ("bert-base output b32", (32, 128, 768))):
        host = rng.standard_normal(shape).astype(np.float16)
        buffer = torch.empty(shape, dtype=torch.float16, device="cuda")
        rows.append({
            "case": name, "bytes": host.nbytes,
            "h2d_pageable_torch_s": median_seconds(lambda: buffer.copy_(torch.from_numpy(host))),
            "h2d_copy_into_s": median_seconds(lambda: backend.copy_into(buffer, host)),
            "d2h_pageable_torch_s": median_seconds(lambda: buffer.cpu().numpy()),
            "d2h_to_host_s": median_seconds(lambda: backend.to_host(buffer)),
        })
        print(json.dumps(rows[-1]), flush=True)
    document = {"benchmark": "host <-> GPU copies: portkern's runtime vs torch pageable", "device": backend.fingerprint(),
                "command": " ".join(sys.argv), "round_trips_bit_exact": round_trips, "rows": rows,
                "method": "median of 30, host clock, device synchronized before and after"}
    print("round trips bit-exact:", round_trips, flush=True)
    with open(args.out, "w") as handle:
        json.dump(document, handle, indent=1)
    return 0 if all(round_trips.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
