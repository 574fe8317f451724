"""Sizes shown to the user come from the parameter count, not llama.cpp's size label (the Qwen2.5 0.5B is "1B" to
llama.cpp: a label for its layer shape)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.models.backend import describe_model


@pytest.mark.parametrize(
    ("llama_desc", "n_params", "shown"),
    [
        ("qwen2 1B Q4_K - Medium", 630_167_424, "qwen2 630M params Q4_K - Medium"),
        ("qwen2 1.5B Q4_K - Medium", 1_777_088_000, "qwen2 1.78B params Q4_K - Medium"),
        ("llama 256M Q4_1", 134_515_008, "llama 135M params Q4_1"),
        ("gemma3 ?B Q8_0", 268_098_176, "gemma3 268M params Q8_0"),
        ("qwen2 1B Q4_K - Medium", 0, "qwen2 1B Q4_K - Medium"),  # no count: llama.cpp's words as they are
    ],
)
def test_the_size_is_the_parameter_count(llama_desc: str, n_params: int, shown: str) -> None:
    assert describe_model(llama_desc, n_params) == shown


@pytest.mark.real
def test_the_qwen_draft_is_not_called_1b(qwen_draft_path: Path) -> None:
    from edgespec.api import _info
    from edgespec.models.backend import Model

    with Model(qwen_draft_path, n_ctx=256) as model:
        info = _info(model, "qwen2.5-coder-0.5b")
    # llama_model_n_params counts every tensor of the file, the untied output matrix included.
    assert info.n_params == 630_167_424
    assert info.description == "qwen2 630M params Q4_K - Medium"  # what the status line and /v1/models show


def test_the_status_line_shows_the_parameter_count() -> None:
    from edgespec.api import ModelInfo
    from tui.widgets import _model_line

    info = ModelInfo(
        name="qwen2.5-coder-0.5b",
        path="/m/qwen.gguf",
        description=describe_model("qwen2 1B Q4_K - Medium", 630_167_424),
        n_ctx=4096,
        n_gpu_layers=0,
        on_gpu=False,
        placement="CPU",
        n_params=630_167_424,
    )
    line = _model_line("draft ", info).plain
    assert "qwen2 630M params Q4_K - Medium · CPU" in line and " 1B " not in line
