"""Vigil: an observability-first paged-KV LLM inference server.

``from server import LLM`` loads torch and the engine only when ``LLM``, ``SamplingParams`` or ``RequestOutput``
is first used, so that importing any other part of ``server`` stays cheap.
"""

from importlib import import_module
from typing import Any

_LAZY = {"LLM": "server.llm", "RequestOutput": "server.engine.request", "SamplingParams": "server.engine.request"}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'server' has no attribute {name!r}")
    return getattr(import_module(_LAZY[name]), name)
