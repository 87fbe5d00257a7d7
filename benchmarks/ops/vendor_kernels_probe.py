"""Which vendor kernels do torch's baselines run on the issue's GEMM and attention shapes?

The kernel names say how cuBLAS tiles a GEMM (cuBLAS's sm90 names carry the tile size, e.g.
"tilesize128x192x64", and split-K or stream-K) and which attention library SDPA picks (flash,
cuDNN, memory-efficient): what a portkern variant has to match. One profiled call per shape after a
warm-up; the names and their device times are printed and written as JSON.

    bash benchmarks/gpu_run.sh python3 benchmarks/ops/vendor_kernels_probe.py --out $OUT/vendor-kernels.json
"""
from __future__ import annotations

import argparse
import datetime
import json
from typing import Callable

import torch
import torch.nn.functional as F

GEMMS = [(4096, 768, 768), (4096, 768, 3072), (4096, 3072, 768), (4096, 4096, 4096), (4096, 11008, 4096),
         (3000, 1000, 777)]
ATTENTIONS = [(32, 12, 128, 64, False), (8, 12, 512, 64, False), (4, 32, 2048, 128, True)]


def kernels_of(call: Callable[[], torch.Tensor]) -> list[dict[str, object]]:
    """The CUDA kernels one call launches, with their device microseconds."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return [{"name": e.name, "us": round(e.device_time, 2)} for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for m, n, k in GEMMS:  # a Linear layer's layout: weight stored N x K
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        rows.append({"case": f"gemm {m}x{n}x{k} fp16 (x @ w.T)", "kernels": kernels_of(lambda: a @ w.T)})
    for b, h, s, d, causal in ATTENTIONS:
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.float16) for _ in range(3))
        rows.append({"case": f"sdpa b{b} h{h} s{s} d{d}{' causal' if causal else ''} fp16",
                     "kernels": kernels_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))})
    for row in rows:
        print(row["case"])
        for kernel in row["kernels"]:
            print(f"    {kernel['us']:9.2f} us  {kernel['name']}")
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "device": torch.cuda.get_device_name(),
              "torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
