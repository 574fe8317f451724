"""llama.cpp's output stays out of the user's way: its log goes through -v, and its abort prints no backtrace.

Each case runs `python` in a subprocess: what matters is what lands on a real stderr (llama.cpp writes there from C,
ggml reads its environment at abort time, and an abort ends the process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env["EDGESPEC_CACHE"] = str(tmp_path / "cache")
    for name in ("EDGESPEC_LLAMA_LOG", "GGML_NO_BACKTRACE"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )


def test_an_abort_in_ggml_prints_its_message_and_no_backtrace(tmp_path: Path) -> None:
    # What a GGML_ASSERT does when it fails, called directly: ggml_abort with a message.
    code = """
import ctypes, pathlib, llama_cpp
from edgespec.models.llama_init import init_backend
init_backend()
ggml = ctypes.CDLL(str(pathlib.Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
ggml.ggml_abort(b"llama-vocab.cpp", 2544, b"GGML_ASSERT(%s) failed", b"id_to_token.size() == token_to_id.size()")
"""
    run = run_python(code, tmp_path)
    assert run.returncode == -signal.SIGABRT
    lines = run.stderr.strip().splitlines()
    assert lines == ["llama-vocab.cpp:2544: GGML_ASSERT(id_to_token.size() == token_to_id.size()) failed"], lines


@pytest.mark.real
def test_a_file_llama_cpp_refuses_is_one_error_line_and_its_reasons_show_with_verbose(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """Preflight passes a head count of 18 (the metadata is sound); the tensor shapes disagree, and llama.cpp says so
    in its log: one line without -v, llama.cpp's reasons with it."""
    blob = bytearray(tiny_model_path.read_bytes())
    key = b"llama.attention.head_count"
    at = blob.index(key + b"\x04\x00\x00\x00") + len(key) + 4  # past the key and its u32 type: the value
    blob[at : at + 4] = (18).to_bytes(4, "little")
    model = tmp_path / "heads.gguf"
    model.write_bytes(bytes(blob))
    code = "import sys; from edgespec.cli import main; main(sys.argv[1:], prog_name='edgespec')"
    args = ["generate", "hi", "-m", str(model), "-d", "none", "-n", "2", "--draft-len", "off"]

    quiet = run_python(code, tmp_path, *args)
    assert quiet.returncode == 1
    assert quiet.stderr.splitlines() == [f"error: llama.cpp could not load {model} (not a GGUF model it supports, "
                                         "or corrupt)"]  # fmt: skip

    verbose = run_python(code, tmp_path, "-v", *args)
    assert verbose.returncode == 1
    assert "llama.cpp: llama_model_load: error loading model: error loading model hyperparameters: invalid n_rot" in (
        verbose.stderr
    )
    assert verbose.stderr.splitlines()[-1].startswith("error: llama.cpp could not load")
