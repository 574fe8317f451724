"""`edgespec models ...` through click's CliRunner: output, exit codes, and no tracebacks on bad input."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fake_packs import FAKE_FILE, FAKE_NAME, FakePack, install_fake_pack, sandbox
from test_gguf import key_offset, patched, write_gguf

from edgespec.cli.models import models
from edgespec.models.registry import model_dir


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sandbox(tmp_path, monkeypatch)


@pytest.fixture
def fake(env: Path, monkeypatch: pytest.MonkeyPatch) -> FakePack:
    return install_fake_pack(env, monkeypatch)


def run(*args: str) -> Result:
    return CliRunner().invoke(models, list(args))


def assert_clean_failure(result: Result, *fragments: str) -> None:
    """Exit 1, one `error:` line on stderr, no traceback."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ---------------------------------------------------------------------------------------------- info


def test_info_prints_the_facts(tmp_path: Path) -> None:
    result = run("info", str(write_gguf(tmp_path / "ok.gguf")))
    assert result.exit_code == 0, result.output
    assert "architecture:" in result.output and "llama" in result.output
    facts = json.loads(run("info", "--json", str(tmp_path / "ok.gguf")).stdout)
    assert facts["n_vocab"] == 400 and facts["quantization"] == "F32" and facts["has_chat_template"] is True


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    good = write_gguf(tmp_path / "good.gguf")
    blob = good.read_bytes()
    files = {
        "truncated": tmp_path / "truncated.gguf",
        "random": tmp_path / "random.gguf",
        "empty": tmp_path / "empty.gguf",
        "magic": tmp_path / "magic.gguf",
    }
    files["truncated"].write_bytes(blob[: len(blob) // 2])
    files["random"].write_bytes(os.urandom(10_000))
    files["empty"].write_bytes(b"")
    files["magic"].write_bytes(b"GGJT" + blob[4:])
    files["mangled"] = patched(good, tmp_path / "mangled.gguf", key_offset(good, "general.name"), struct.pack("<I", 77))
    return files


@pytest.mark.parametrize(
    ("kind", "fragment"),
    [
        ("truncated", "truncated GGUF"),
        ("random", "not a GGUF file"),
        ("empty", "empty file"),
        ("magic", "not a GGUF file"),
        ("mangled", "corrupt GGUF"),
    ],
)
def test_info_refuses_bad_files_cleanly(tmp_path: Path, kind: str, fragment: str) -> None:
    path = _bad_files(tmp_path)[kind]
    assert_clean_failure(run("info", str(path)), fragment, str(path))


def test_info_on_unknown_or_unpulled_names() -> None:
    assert_clean_failure(run("info", "no-such-model"), "unknown model")
    assert_clean_failure(run("info", "smollm2-135m"), "not pulled yet", "edgespec models pull smollm2-135m")
    assert_clean_failure(run("info", "/nowhere/x.gguf"), "no such file")


@pytest.mark.real
def test_real_tiny_model_info(tiny_model_path: Path) -> None:
    result = run("info", str(tiny_model_path))
    assert result.exit_code == 0, result.output
    assert "Q4_1" in result.output and "49152" in result.output


# ---------------------------------------------------------------------------------------------- compat


def test_compat(tmp_path: Path) -> None:
    a, b = write_gguf(tmp_path / "a.gguf"), write_gguf(tmp_path / "b.gguf")
    c = write_gguf(tmp_path / "c.gguf", tokenizer="llama")
    ok = run("compat", str(a), str(b))
    assert ok.exit_code == 0 and "compatible" in ok.stdout
    assert_clean_failure(run("compat", str(a), str(c)), "a.gguf", "c.gguf", "tokenizer")


# ---------------------------------------------------------------------------------------------- cache


def test_list_text_and_json_before_and_after_pull(fake: FakePack) -> None:
    doc = json.loads(run("list", "--json").stdout)
    by_name = {m["name"]: m for m in doc["models"]}
    assert doc["default_pair"] == "qwen2.5-coder"
    assert by_name["qwen2.5-coder-1.5b"]["pairs"] == ["qwen2.5-coder"]
    assert by_name[FAKE_NAME]["cached"] is False and by_name[FAKE_NAME]["size"] == len(fake.data)
    assert {p["name"] for p in doc["pairs"]} >= {"qwen2.5-coder", "fake-pair"}

    pulled = run("pull", "--quiet", "fake-pair")  # a pair pulls its models (here one, used twice)
    assert pulled.exit_code == 0, pulled.output
    assert pulled.stdout == f"{FAKE_NAME}\t{model_dir(FAKE_NAME) / FAKE_FILE}\n"

    text = run("list").stdout
    line = next(row for row in text.splitlines() if row.startswith(FAKE_NAME))
    assert "yes" in line.split() and "fake-pair" in line
    assert "qwen2.5-coder*" in text  # the default pair is starred
    doc = json.loads(run("list", "--json").stdout)
    assert next(m for m in doc["models"] if m["name"] == FAKE_NAME)["cached"] is True


def test_path_verify_rm(fake: FakePack) -> None:
    assert_clean_failure(run("path", FAKE_NAME), "not pulled yet")
    assert run("pull", "-q", FAKE_NAME).exit_code == 0
    path = run("path", FAKE_NAME).stdout.strip()
    assert Path(path).read_bytes() == fake.data

    verified = run("verify", "-q")
    assert verified.exit_code == 0 and verified.stdout == f"{FAKE_NAME}\tok\n"
    with open(path, "r+b") as f:
        f.write(b"\x00" * 8)
    bad = run("verify", "-q", FAKE_NAME)
    assert bad.stdout == f"{FAKE_NAME}\tBAD\n"
    assert_clean_failure(bad, "failed verification", f"edgespec models pull {FAKE_NAME}")
    assert_clean_failure(run("path", FAKE_NAME), "not pulled yet")  # no longer trusted

    assert run("rm", FAKE_NAME).stdout == f"{FAKE_NAME}\tremoved\n"
    assert run("rm", FAKE_NAME).stdout == f"{FAKE_NAME}\tnot cached\n"
    assert not model_dir(FAKE_NAME).exists()
    assert_clean_failure(run("verify", FAKE_NAME), "not pulled")


def test_pull_failures_are_one_line(env: Path) -> None:
    assert_clean_failure(run("pull", "nope"), "unknown model 'nope'")
    (env / "models.toml").write_text("[models.x\n")
    assert_clean_failure(run("list"), "invalid TOML", str(env / "models.toml"))
