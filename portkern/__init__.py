"""portkern: import an ONNX model, tune verified shape-specific kernels for a target, ship a pack.

    report = portkern.tune("model.onnx", target="cpu", shapes={"input_ids": (1, 128)}, out="m.pkpack")
    session = portkern.Session("model.onnx", "m.pkpack")
    outputs = session.run({"input_ids": ids, "attention_mask": mask})

Nothing here prints unless asked (`progress=print`). Heavy modules load on first use.
"""
from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

from .errors import PortkernError

# a library prints nothing unless the application configures logging (the CLI prints what it must)
logging.getLogger("portkern").addHandler(logging.NullHandler())

__version__ = "0.1.0"

_LAZY = {
    "tune": ("portkern.tuner", "tune"),
    "TuneReport": ("portkern.tuner", "TuneReport"),
    "Session": ("portkern.runtime", "Session"),
    "load_pack": ("portkern.pack", "load_pack"),
    "Pack": ("portkern.pack", "Pack"),
    "load_model": ("portkern.onnx_import", "load_model"),
    "partition": ("portkern.partition", "partition"),
    "load_target": ("portkern.hwprofile", "load_target"),
    "available_targets": ("portkern.hwprofile", "available_targets"),
}
__all__ = ["PortkernError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(import_module(module), attr)
    raise AttributeError(f"module 'portkern' has no attribute {name!r}")
