"""Shared fixtures: real GGUF models from the registry (fetched into the cache on first use, as CI does)."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # for stat_tools

# Fixtures that load real GGUF weights: a test that asks for one is marked `real` whatever its file says, so that
# `make check` (-m "not real and not browser") never loads a model.
REAL_FIXTURES = {
    "tiny_model_path", "qwen_target_path", "qwen_draft_path", "qwen_pair", "qwen_bit_exact_pair",
    "tiny_requantized_path", "gemma_model_path",
}  # fmt: skip


def _user_cache() -> Path:
    from edgespec.paths import model_cache_dir

    return model_cache_dir()


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` with its size and modification time."""
    if not root.is_dir():
        return {}
    out = {}
    for path in root.rglob("*"):
        try:
            if path.is_file():
                st = path.stat()
                out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
        except OSError:
            continue
    return out


def pytest_configure(config: pytest.Config) -> None:
    # What this run measures and works out (decode costs, vocabulary fingerprints) goes to a folder of its own,
    # which its tests share (one calibration per setup for the whole run) and which dies with it: figures taken on
    # a machine busy with tests are no costs for the user's next chat. Set in the environment, so the servers and
    # CLIs the tests start inherit it.
    os.environ["EDGESPEC_STATE"] = tempfile.mkdtemp(prefix="edgespec-test-state-")
    config.stash[_USER_CACHE] = (_user_cache(), _snapshot(_user_cache()))


_USER_CACHE = pytest.StashKey[tuple[Path, dict[str, tuple[int, int]]]]()
_FETCHED = pytest.StashKey[set[str]]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if it changed the user's model cache (beyond fetching the models it needs): tests write into
    directories of their own."""
    root, before = session.config.stash[_USER_CACHE]
    fetched = session.config.stash.get(_FETCHED, set())
    after = _snapshot(root)
    changed = sorted(
        name
        for name in set(before) | set(after)
        if before.get(name) != after.get(name) and not any(name.startswith(f) for f in fetched)
    )
    if changed:
        print(f"\nthe test run changed the user's model cache {root}: {', '.join(changed[:10])}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _model(name: str, config: pytest.Config) -> Path:
    from edgespec.models.registry import resolve_model

    root, before = config.stash[_USER_CACHE]
    path = resolve_model(name, progress=False)
    if path.is_relative_to(root) and str(path.relative_to(root)) not in before:  # fetched by this run, as CI does
        top = path.relative_to(root).parts[0]
        config.stash.setdefault(_FETCHED, set()).update({top, ".locks"})
    return path


@pytest.fixture(scope="session")
def tiny_model_path(pytestconfig: pytest.Config) -> Path:
    """SmolLM2-135M-Instruct Q4_1 (98 MB, 49,152-token vocabulary)."""
    return _model("smollm2-135m", pytestconfig)


@pytest.fixture(scope="session")
def qwen_target_path(pytestconfig: pytest.Config) -> Path:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)."""
    return _model("qwen2.5-coder-1.5b", pytestconfig)


@pytest.fixture(scope="session")
def qwen_draft_path(pytestconfig: pytest.Config) -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.5 GB), same tokenizer as the target."""
    return _model("qwen2.5-coder-0.5b", pytestconfig)


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
def gemma_model_path(pytestconfig: pytest.Config) -> Path:
    """Gemma 3 270M Q4_K_M (253 MB, 262,144-token SentencePiece vocabulary): another architecture and tokenizer."""
    return _model("gemma3-270m", pytestconfig)


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
