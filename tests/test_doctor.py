"""`edgespec doctor`: the report's sections, and every failure a sentence (no traceback), without loading weights."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.calibrate import CostCache, Costs, machine_key
from edgespec.cli import main

doctor_module = importlib.import_module("edgespec.cli.doctor")  # the package's `doctor` is the click command

COSTS = Costs(verify={1: 0.020, 2: 0.036, 3: 0.051}, draft={"model": 0.011}, catchup={"model": 0.004})
MODEL = "/m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf|1117320736|1700000000|threads=2|ngl=0|bit_exact=False"
DRAFT = "/m/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|491400032|1700000000|threads=2|ngl=-1|bit_exact=False"


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A model cache with nothing in it (no models, no costs)."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    monkeypatch.delenv("EDGESPEC_STATE", raising=False)  # the costs where a user's are: in the model cache
    return tmp_path


def _doctor(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["doctor", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_json_report_has_every_section_and_says_why_one_is_missing(empty_cache: Path) -> None:
    code, out = _doctor("--json")
    report = json.loads(out)
    assert code == 0 and set(report) == {"build", "setup", "offload", "threads", "costs"}
    build = report["build"]
    assert build["llama_cpp_python"] == "0.3.36" and "CPU" in build["backends"]
    assert isinstance(build["gpu_offload"], bool) and any(d["kind"] == "CPU" for d in build["devices"])
    assert report["setup"]["backend"] in ("cpu", "cuda", "metal", "vulkan", "custom")
    assert report["threads"]["default"] >= 1
    # Nothing downloaded into this cache: a sentence that says what to run, never a traceback.
    assert "not downloaded yet" in report["offload"]["error"] and "edgespec models pull" in report["offload"]["error"]
    assert report["costs"]["entries"] == []


def test_text_report_prints_each_section(empty_cache: Path) -> None:
    code, out = _doctor()
    assert code == 0
    for title in ("llama.cpp build", "make setup would build", "offload plan (-ngl auto)", "threads", "measured costs"):
        assert title in out
    assert "llama.cpp backend:" in out and "Traceback" not in out


def test_cached_costs_of_this_machine_are_listed_with_their_age(empty_cache: Path) -> None:
    cache = CostCache(empty_cache / ".costs.json")
    cache.put(f"{machine_key()} {MODEL} {DRAFT} max_gamma=8 widths=all,2 readout=top_k", COSTS)
    cache.put(f"another-machine 64 {MODEL} - max_gamma=8 widths=all,2 readout=top_k", COSTS)
    data = json.loads(cache.path.read_text())
    old_key = f"{machine_key()} {MODEL} - max_gamma=8 widths=all,2 readout=argmax"
    data[old_key] = {"verify": {"1": 0.02}, "draft": {}, "catchup": {}}  # written before ages were recorded
    cache.path.write_text(json.dumps(data))

    entries = doctor_module.costs_section()["entries"]
    assert len(entries) == 2  # not the other machine's
    new, old = sorted(entries, key=lambda e: not e["age_exact"])
    assert [m["file"] for m in new["models"]] == [
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    ]  # fmt: skip
    assert new["models"][1]["n_gpu_layers"] == "-1"
    assert new["verify_ms"] == {"1": 20.0, "2": 36.0, "3": 51.0} and new["draft_ms"] == {"model": 11.0}
    assert 0 <= new["age_s"] < 60 and new["setup"] == "max_gamma=8 widths=all,2 readout=top_k"
    assert old["age_s"] is not None and not old["age_exact"]  # the file's age, as a lower bound

    code, out = _doctor()
    assert "measured just now" in out and "verify ms by tokens: 1: 20.0, 2: 36.0, 3: 51.0" in out
    assert "draft step: model 11.0 ms" in out and "measured at least" in out


def test_a_broken_cost_cache_is_a_sentence(empty_cache: Path) -> None:
    (empty_cache / ".costs.json").write_text('{"cut short": ')
    code, out = _doctor("--json")
    error = json.loads(out)["costs"]["error"]
    assert code == 0 and "is not valid JSON" in error and "measures the costs again" in error


def test_a_missing_llama_cpp_is_a_sentence(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "edgespec.models.backend")  # imported afresh, without llama_cpp
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what `import llama_cpp` sees when it is absent
    report = doctor_module.gather()
    assert "llama-cpp-python is not installed" in report["build"]["error"]
    assert "make setup" in report["build"]["error"]
    assert "does not load here (the llama.cpp build section says why)" in report["threads"]["error"]


@pytest.mark.parametrize(
    ("package", "said"),
    [
        ("", "llama-cpp-python is not installed"),
        (  # a CUDA build on a machine without the driver
            "raise RuntimeError(\"Failed to load shared library 'libllama.so': libcuda.so.1: cannot open shared "
            "object file\")",
            "its libraries do not load (Failed to load shared library 'libllama.so': libcuda.so.1",
        ),
    ],
)
def test_the_command_line_starts_and_says_so_when_llama_cpp_does_not_load(
    empty_cache: Path, tmp_path: Path, package: str, said: str
) -> None:
    broken = tmp_path / "site"
    (broken / "llama_cpp").mkdir(parents=True)
    (broken / "llama_cpp" / "__init__.py").write_text(package or "raise ImportError('No module named llama_cpp')")
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(broken), str(root)])}
    proc = subprocess.run(
        [sys.executable, "-m", "edgespec", "doctor"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert said in proc.stdout and "make setup" in proc.stdout
    assert "make setup would build" in proc.stdout  # the sections that need no llama.cpp still print


def test_an_unknown_forced_backend_is_a_sentence(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESPEC_BACKEND", "rocm")
    code, out = _doctor()
    assert code == 0 and "EDGESPEC_BACKEND='rocm': expected one of cpu, cuda, metal, vulkan" in out


def test_a_cpu_build_on_a_gpu_machine_is_pointed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESPEC_BACKEND", "cuda")
    setup = doctor_module.setup_section({"gpu_offload": False})
    assert setup["backend"] == "cuda" and "CPU-only" in setup["advice"] and "make setup" in setup["advice"]
    assert "advice" not in doctor_module.setup_section({"gpu_offload": True})


def test_a_build_with_amx_kernels_is_pointed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGESPEC_BACKEND", "cpu")
    amx = {"gpu_offload": False, "system_info": "CPU : AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 |"}
    setup = doctor_module.setup_section(amx)
    assert "AMX" in setup["advice"] and "make setup" in setup["advice"]
    assert "advice" not in doctor_module.setup_section({**amx, "system_info": "CPU : AVX512 = 1 | REPACK = 1 |"})


@pytest.mark.real
def test_offload_plan_for_the_default_pair(qwen_target_path: Path, qwen_draft_path: Path) -> None:
    plan = doctor_module.offload_section(4096)
    target, draft = plan["models"]
    assert (target["name"], target["n_layer"]) == ("qwen2.5-coder-1.5b", 28)
    assert (draft["name"], draft["n_layer"]) == ("qwen2.5-coder-0.5b", 24)
    # K and V, f16, 4096 tokens: 28 layers x 2 KV heads x 128 dims for the 1.5B.
    assert target["kv_bytes"] == 2 * 28 * 2 * 128 * 2 * 4096
    for m in (target, draft):
        assert m["weights_bytes"] == Path(m["file"]).stat().st_size
        # GPU-agnostic: a CPU build plans 0 layers; a GPU build all (-1) or as many as fit.
        assert m["n_gpu_layers"] >= -1 and m["placement"].startswith(("CPU", "GPU"))
