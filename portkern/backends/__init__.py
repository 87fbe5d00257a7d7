"""Backends are found through the `portkern.backends` entry point; in-tree ones register the same way.

Importing a backend is lazy: a missing optional dependency becomes one line naming the extra.
"""
from __future__ import annotations

from functools import lru_cache
from importlib import metadata

from ..errors import TargetError
from ..hwprofile import Target
from .base import Artifact, Backend, Candidate, CompileError, Program, Variant

__all__ = ["Artifact", "Backend", "Candidate", "CompileError", "Program", "Variant",
           "backend_names", "backend_class", "get_backend"]

ENTRY_POINT_GROUP = "portkern.backends"


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def backend_names() -> list[str]:
    return sorted(_entry_points())


def backend_class(name: str) -> type[Backend]:
    entry = _entry_points().get(name)
    if entry is None:
        raise TargetError(f"unknown backend '{name}' (installed: {', '.join(backend_names()) or 'none'}); "
                          "is portkern installed (pip install -e .)?")
    try:
        cls = entry.load()
    except ImportError as exc:
        raise TargetError(f"backend '{name}' needs a missing package ({exc.name}): "
                          f"pip install 'portkern[{name}]'") from None
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TargetError(f"entry point '{name}' ({entry.value}) is not a portkern Backend")
    return cls


def get_backend(target: Target) -> Backend:
    cls = backend_class(target.backend)
    if target.profile.kind not in cls.device_kinds:
        raise TargetError(f"backend '{target.backend}' cannot serve target '{target.name}' "
                          f"(a {target.profile.kind} device; it serves {', '.join(sorted(cls.device_kinds))})")
    return cls(target)
