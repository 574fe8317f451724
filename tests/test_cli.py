"""`edgespec generate` end to end on the tiny model, and its error paths (one line, exit 1, no traceback)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.cli import main


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


@pytest.mark.real
def test_generate_json(tiny_model_path, auto_placement) -> None:
    path = str(tiny_model_path)
    placements = auto_placement([tiny_model_path, tiny_model_path])  # before loading takes any GPU memory
    result = invoke(
        "generate",
        "The capital of France is",
        "-m",
        path,
        "-d",
        path,
        "--draft-len",
        "3",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert set(out) >= {"text", "tokens", "stats", "finish_reason"}
    stats = out["stats"]
    assert len(out["tokens"]) <= 12 and stats["generated"] >= len(out["tokens"])
    assert stats["drafted"] >= stats["accepted"] >= 0
    assert 0 <= stats["acceptance_rate"] <= 1 and stats["tokens_per_second"] > 0
    # where each model ran (-ngl auto, the default: "CPU" on a build without a GPU), and how it sampled
    assert [stats["target_placement"], stats["draft_placement"]] == placements
    assert stats["sampling_path"] == "argmax in llama.cpp" and stats["outside_ms_per_token"] >= 0


@pytest.mark.real
def test_generate_streams_text_and_reports_stats_on_stderr(tiny_model_path) -> None:
    result = invoke(
        "generate",
        "-",
        "-m",
        str(tiny_model_path),
        "--draft",
        "none",
        "--temperature",
        "0",
        "-n",
        "8",
        input="Once upon a time",
    )
    assert result.exit_code == 0
    assert result.stdout.strip()
    assert "tok/s" in result.stderr and "outside llama.cpp" in result.stderr


@pytest.mark.real
def test_greedy_text_is_the_same_with_and_without_speculation(tiny_model_path) -> None:
    path = str(tiny_model_path)
    common = ["generate", "def add(a, b):", "-m", path, "--temperature", "0", "-n", "24", "--json"]
    plain = json.loads(invoke(*common, "--draft", "none", "--draft-len", "0").stdout)
    spec = json.loads(invoke(*common, "-d", path, "--draft-len", "4").stdout)
    assert plain["tokens"] == spec["tokens"]
    assert plain["stats"]["drafted"] == 0 and spec["stats"]["drafted"] > 0


@pytest.mark.real
@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--max-tokens", "0"], "max_tokens"),
    ],
)
def test_bad_sampling_values_are_one_line_errors(tiny_model_path, args, message) -> None:
    result = invoke("generate", "hi", "-m", str(tiny_model_path), *args)
    assert result.exit_code == 1
    assert result.stderr.startswith("error:") and message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.real
def test_bad_draft_len_is_a_usage_error(tiny_model_path) -> None:
    result = invoke("generate", "hi", "-m", str(tiny_model_path), "--draft-len", "lots")
    assert result.exit_code == 2 and "--draft-len" in result.stderr and "auto" in result.stderr


def test_missing_model_is_a_one_line_error(tmp_path) -> None:
    result = invoke("generate", "hi", "-m", str(tmp_path / "missing.gguf"))
    assert result.exit_code == 1 and result.stderr.startswith("error:") and "missing.gguf" in result.stderr


@pytest.mark.real
def test_incompatible_pair_is_a_one_line_error(tiny_model_path, qwen_draft_path) -> None:
    result = invoke("generate", "hi", "-m", str(qwen_draft_path), "-d", str(tiny_model_path))
    assert result.exit_code == 1 and result.stderr.startswith("error:")
    assert "Traceback" not in result.output


@pytest.mark.real
def test_context_overflow_is_a_one_line_error(tiny_model_path) -> None:
    result = invoke("generate", "word " * 600, "-m", str(tiny_model_path), "--n-ctx", "256", "-n", "8")
    assert result.exit_code == 1 and "context" in result.stderr


def test_help_explains_the_options() -> None:
    result = invoke("generate", "--help")
    assert result.exit_code == 0
    for option in ("--draft-len", "--n-gpu-layers", "--temperature", "--json", "--lookup", "--bit-exact"):
        assert option in result.stdout
    assert "slower" in result.stdout  # --bit-exact says what it costs


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "serve"])
def test_every_model_command_takes_bit_exact_and_gpu_layers(command) -> None:
    result = invoke(command, "--help")
    assert "--bit-exact" in result.stdout and "auto" in result.stdout and "--n-gpu-layers" in result.stdout


@pytest.mark.real
@pytest.mark.parametrize("value", ["lots", "-2", "1.5"])
def test_bad_gpu_layers_are_a_usage_error(tiny_model_path, value) -> None:
    result = invoke("generate", "hi", "-m", str(tiny_model_path), "-ngl", value)
    assert result.exit_code == 2 and "auto" in result.stderr


@pytest.mark.real
def test_bit_exact_greedy_generation_says_so_and_matches_plain(tiny_model_path, auto_placement) -> None:
    path = str(tiny_model_path)
    (placement,) = auto_placement([tiny_model_path])  # -ngl auto, the target alone (-d none)
    common = ["generate", "def add(a, b):", "-m", path, "--temperature", "0", "-n", "24", "--json", "--bit-exact"]
    plain = json.loads(invoke(*common, "--draft", "none", "--draft-len", "0").stdout)
    spec = json.loads(invoke(*common, "-d", path, "--draft-len", "4").stdout)
    assert plain["tokens"] == spec["tokens"] and spec["stats"]["drafted"] > 0
    assert spec["stats"]["bit_exact"] is True and spec["stats"]["sampling_path"] == "argmax in llama.cpp"
    text = invoke("generate", "hi", "-m", path, "-d", "none", "-n", "2", "--bit-exact")
    assert f"target SmolLM2-135M-Instruct.Q4_1.gguf on {placement} (bit-exact)" in text.stderr


@pytest.mark.real
@pytest.mark.parametrize(("option", "value"), [("--n-ctx", "-5"), ("--threads", "0")])
def test_impossible_sizes_are_usage_errors(tiny_model_path, option, value) -> None:
    result = invoke("generate", "hi", "-m", str(tiny_model_path), option, value)
    assert result.exit_code == 2 and option in result.stderr


def test_the_stats_line_tells_drafts_from_the_prompt_and_from_earlier_replies_apart() -> None:
    from edgespec.cli.common import describe_stats
    from edgespec.events import Stats

    stats = Stats(generated=30, rounds=10, drafted=20, accepted=15, lookup_drafted=6, lookup_accepted=2)
    assert "earlier replies" not in describe_stats(stats)  # no drafts from the cache: the line as it was
    stats.cache_drafted, stats.cache_accepted = 14, 13
    assert "drafted 20, accepted 15 (75%; from the prompt 2/6, from earlier replies 13/14)" in describe_stats(stats)
