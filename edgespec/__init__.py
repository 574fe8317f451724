"""edgespec: speculative decoding for local GGUF models on llama.cpp.

The public API lives in :mod:`edgespec.api`; the most used names are re-exported here lazily so that
``import edgespec`` stays cheap and does not load llama.cpp until a model is needed.
"""

from __future__ import annotations

from edgespec.errors import (
    ContextOverflowError,
    EdgespecError,
    InvalidParameterError,
    ModelError,
    VocabMismatchError,
)
from edgespec.sampling import SamplingParams

__version__ = "0.1.0"

__all__ = [
    "ContextOverflowError",
    "EdgespecError",
    "InvalidParameterError",
    "ModelError",
    "SamplingParams",
    "VocabMismatchError",
    "load",
]


def __getattr__(name: str):
    if name in ("load", "Runtime"):
        from edgespec import api

        return getattr(api, name)
    raise AttributeError(name)
