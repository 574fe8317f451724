"""edgespec: speculative decoding for local GGUF models on llama.cpp.

The public API lives in :mod:`edgespec.api`; the most used names are re-exported here lazily so that
``import edgespec`` stays cheap and does not load llama.cpp until a model is needed.
"""

from __future__ import annotations

# Load llama.cpp's shared libraries before numpy's. On a CUDA image with numpy 2.5 (a PyTorch venv), loading any
# model segfaulted when numpy (and the OpenMP/BLAS libraries it bundles) had been imported first; llama_cpp first
# loads fine. It costs ~40 ms. If llama_cpp is missing, or its libraries do not load (a CUDA build on a machine
# without the driver), the backend's own import reports it when a model loads, and `edgespec doctor` says so.
try:
    import llama_cpp  # noqa: F401
except (ImportError, OSError, RuntimeError):
    pass

from edgespec.constraint import Grammar  # noqa: E402
from edgespec.errors import (  # noqa: E402
    ContextOverflowError,
    EdgespecError,
    InvalidParameterError,
    ModelError,
    VocabMismatchError,
)
from edgespec.sampling import SamplingParams  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ContextOverflowError",
    "EdgespecError",
    "Grammar",
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
