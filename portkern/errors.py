"""One root exception: its message is exactly what the CLI prints, on one line."""
from __future__ import annotations


class PortkernError(Exception):
    """A user-facing failure (bad input, unsupported model, refused pack, budget stop)."""


class ModelError(PortkernError):
    """The model file cannot be read, parsed or bound to concrete shapes."""


class UnsupportedOpError(ModelError):
    def __init__(self, op_type: str, node_name: str, detail: str = "") -> None:
        self.op_type = op_type
        self.node_name = node_name
        msg = f"unsupported op {op_type} (node '{node_name}')"
        super().__init__(f"{msg}: {detail}" if detail else msg)


class TargetError(PortkernError):
    """Unknown target, or a target whose backend is not installed."""


class PackError(PortkernError):
    """A pack that is missing, corrupt, tampered with, or made for other hardware/software."""


class BudgetExhausted(PortkernError):
    """The tuning budget ran out (a normal stop, reported not crashed)."""
