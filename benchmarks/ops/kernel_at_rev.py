"""A built-in kernel's text at a git revision with its includes expanded from that same revision:
the `--base` of variant_ab.py when the change under test is in an include file (kernels/_NAME.py),
which the library would otherwise expand from the working tree into both versions.

    python benchmarks/ops/kernel_at_rev.py eb333c1 gemm_tma > .gpujob/base-gemm_tma.py
"""
from __future__ import annotations

import argparse
import subprocess
import sys

from portkern.backends.kernel_module import expand_includes

KERNELS = "portkern/backends/triton/kernels"


def kernel_at(revision: str, name: str) -> str:
    def show(file: str) -> str:
        return subprocess.run(["git", "show", f"{revision}:{KERNELS}/{file}"], capture_output=True, text=True,
                              check=True).stdout

    return expand_includes(show(f"{name}.py"), lambda include: show(f"_{include}.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revision", help="a git revision (commit, tag, HEAD~1)")
    parser.add_argument("name", help="a built-in kernel's name (kernels/NAME.py)")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(kernel_at(args.revision, args.name))
    except subprocess.CalledProcessError as exc:
        print(f"git show failed: {exc.stderr.strip()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
