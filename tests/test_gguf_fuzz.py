"""Fuzz: hundreds of mutated real models through `edgespec generate`, none of which may take the process down.

The corpus (tests/gguf_mutants.py) mutates SmolLM2 and Gemma 3 270M in memory with a fixed seed: single bytes,
counts, lengths, offsets, type codes, values, token texts, truncations at every structural boundary, and several
of these at once. Each mutant is written, put through `edgespec models info` and `edgespec generate` in its own
process, and deleted. Every run must end in exit 0 (the facts printed; the model loaded and generated) or exit 1
with exactly one `error:` line: no traceback, no signal, no other output.

The runner is a separate Python process that forks one child per mutant: forking this pytest process would be
unsafe once any test has run llama.cpp (its OpenMP thread pool does not survive a fork).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

SEED = 20240611  # fixed: the corpus is the same on every run and every machine
PER_MODEL = 160  # mutants per source model: 320 in all
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.real
@pytest.mark.slow
def test_no_mutated_model_takes_the_process_down(tiny_model_path: Path, gemma_model_path: Path, tmp_path: Path):
    report = tmp_path / "outcomes.json"
    command = [
        sys.executable, str(ROOT / "tests" / "gguf_mutants.py"), "--seed", str(SEED), "--per-model", str(PER_MODEL),
        "--json", str(report), f"smollm2={tiny_model_path}", f"gemma3={gemma_model_path}",
    ]  # fmt: skip
    # The children import edgespec from this checkout, whatever is installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800, check=False)
    print(run.stdout)  # the counts per model (shown with -s, or on failure)
    assert report.exists(), run.stderr[-4000:]
    outcomes = json.loads(report.read_text())
    counts = Counter(row["status"] for row in outcomes)
    failures = [f"{r[status]} ({command}) {r['model']}: {r['label']}\n    {r[detail][:300]}"
                for r in outcomes for command, status, detail in (("generate", "status", "detail"),
                                                                  ("models info", "info_status", "info_detail"))
                if r[status] not in ("loaded", "clean")]  # fmt: skip
    assert not failures, f"{len(failures)} of {len(outcomes)} mutants failed:\n" + "\n".join(failures[:30])
    assert len(outcomes) >= 300
    # The corpus reaches both ends: files that still load and generate, and files refused with a message.
    assert counts["loaded"] >= 10 and counts["clean"] >= 200, counts
    assert run.returncode == 0, run.stderr[-4000:]
