"""portkern: import an ONNX model, tune verified shape-specific kernels for a target, ship a pack."""
from __future__ import annotations

from .errors import PortkernError

__version__ = "0.1.0"
__all__ = ["PortkernError", "__version__"]
