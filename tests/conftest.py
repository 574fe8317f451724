"""Shared fixtures: real GGUF models from the registry (fetched into the cache on first use, as CI does)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for stat_tools


def _model(name: str) -> Path:
    from edgespec.models.registry import resolve_model

    return resolve_model(name, progress=False)


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (98 MB, 49,152-token vocabulary)."""
    return _model("smollm2-135m")


@pytest.fixture(scope="session")
def qwen_target_path() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)."""
    return _model("qwen2.5-coder-1.5b")


@pytest.fixture(scope="session")
def qwen_draft_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.5 GB), same tokenizer as the target."""
    return _model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen_pair(qwen_target_path: Path, qwen_draft_path: Path):
    """The loaded Qwen pair, shared by the tests that need it (loading costs seconds)."""
    from edgespec.models.backend import Model

    target = Model(qwen_target_path, n_ctx=1024)
    draft = Model(qwen_draft_path, n_ctx=1024)
    yield target, draft
    target.close()
    draft.close()


@pytest.fixture(scope="session")
def qwen_bit_exact_pair(qwen_target_path: Path, qwen_draft_path: Path):
    """The Qwen pair with the target loaded bit-exact (no CPU weight repacking)."""
    from edgespec.models.backend import Model

    target = Model(qwen_target_path, n_ctx=1024, bit_exact=True)
    draft = Model(qwen_draft_path, n_ctx=1024)
    yield target, draft
    target.close()
    draft.close()


@pytest.fixture(scope="session")
def tiny_requantized_path(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 requantized to Q4_0 with llama.cpp's quantize API: same vocabulary, slightly different
    distributions, so as a draft for the original its acceptance is high but below 100 %."""
    import ctypes

    import llama_cpp

    out = tmp_path_factory.mktemp("requant") / "smollm2-135m-q4_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0
    params.allow_requantize = True
    params.nthread = 2
    rc = llama_cpp.llama_model_quantize(
        str(tiny_model_path).encode(), str(out).encode(), ctypes.byref(params)
    )
    assert rc == 0, f"llama_model_quantize failed with {rc}"
    return out


@pytest.fixture(scope="session")
def gemma_model_path() -> Path:
    """Gemma 3 270M Q4_K_M (253 MB, 262,144-token SentencePiece vocabulary): another architecture and tokenizer."""
    return _model("gemma3-270m")


@pytest.fixture(scope="session")
def auto_placement():
    """Where -ngl auto puts models loaded together (the target first) on this build, asked of the backend:
    ``["CPU", ...]`` on a build without a GPU, the GPU's share of each model on one with a GPU."""

    def placements(paths: list[Path], n_ctx: int = 4096) -> list[str]:
        from edgespec.models import backend
        from edgespec.models.offload import describe

        devices = backend.gpu_devices()
        layers = backend.auto_gpu_layers([(p, n_ctx) for p in paths])
        device = devices[0].name if devices else None
        return [describe(n, backend.model_shape(p).n_layer, device) for p, n in zip(paths, layers, strict=True)]

    return placements
