"""Models already on disk: fake Hugging Face / LM Studio / Ollama / llama.cpp layouts in a temporary HOME, built
from the real tiny models and the Qwen pair by links (never copies), scanned read-only; and `--draft auto`
choosing from what the scan found."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from fake_packs import sandbox
from test_gguf import write_gguf

from edgespec.cli.models import models
from edgespec.models.discovery import scan
from edgespec.models.drafts import choose_draft
from edgespec.models.registry import resolve_model

COMMIT = "a" * 40
QWEN_1_5B_SHA = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
SMOLLM_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

pytestmark = pytest.mark.real


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """Gemma 3 270M Q4_K_M (another vocabulary), fetched into the real cache like the other fixtures."""
    return resolve_model("gemma3-270m", progress=False)


@dataclass
class Layout:
    home: Path
    folder: Path  # the [scan] folder of the user's models.toml
    roots: list[Path]  # every scanned place, for the before/after comparison


def link(src: Path, dst: Path, *, hard: bool = False) -> Path:
    """``dst`` -> ``src`` without copying: a hard link where asked (a blob is a plain file), else a symlink."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if hard:
        try:
            os.link(src, dst)
            return dst
        except OSError:  # another filesystem: a symlink still never copies
            pass
    dst.symlink_to(src)
    return dst


def write_split(path: Path) -> list[Path]:
    """A small model split in two parts by gguf's own writer: <stem>-0000N-of-00002.gguf."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama", split_max_tensors=2)
    writer.add_name("tiny split")
    # What llama.cpp requires of a llama model (the preflight checks it)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_merges(["t o"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_tensor("token_embd.weight", np.zeros((400, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_k.weight", np.zeros((16, 8), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(path.parent.glob(f"{path.stem}-*-of-00002.gguf"))


def build_layouts(home: Path, qwen_target: Path, qwen_draft: Path, smollm: Path, gemma: Path) -> Layout:
    hf = home / ".cache" / "huggingface" / "hub"
    # Hugging Face cache: refs, blobs (plain files) and snapshot links, as huggingface-hub writes them.
    qwen = hf / "models--Qwen--Qwen2.5-Coder-1.5B-Instruct-GGUF"
    (qwen / "refs").mkdir(parents=True)
    (qwen / "refs" / "main").write_text(COMMIT)
    link(qwen_target, qwen / "blobs" / QWEN_1_5B_SHA, hard=True)
    (qwen / "blobs" / ("d" * 40)).write_bytes(b"# Qwen2.5-Coder\n")
    (qwen / "blobs" / ("e" * 64)).write_bytes(b"a projector")
    snapshot = qwen / "snapshots" / COMMIT
    link(Path(f"../../blobs/{QWEN_1_5B_SHA}"), snapshot / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    link(Path(f"../../blobs/{'d' * 40}"), snapshot / "README.md")
    link(Path(f"../../blobs/{'e' * 64}"), snapshot / "mmproj-qwen-f16.gguf")  # not a model: never listed
    # A repo with one dangling link: scan_cache_dir drops such a repo whole, the scan still lists the rest.
    smol = hf / "models--HuggingFaceTB--SmolLM2-135M-Instruct-GGUF"
    (smol / "refs").mkdir(parents=True)
    (smol / "refs" / "main").write_text(COMMIT)
    link(smollm, smol / "blobs" / SMOLLM_SHA, hard=True)
    link(Path(f"../../blobs/{SMOLLM_SHA}"), smol / "snapshots" / COMMIT / "smollm2-135m-instruct-q4_1.gguf")
    link(Path(f"../../blobs/{'f' * 64}"), smol / "snapshots" / COMMIT / "smollm2-135m-instruct-q8_0.gguf")

    # LM Studio: PUBLISHER/REPO/FILE.gguf, plus a text file with a .gguf name and a README.
    lms = home / ".lmstudio" / "models"
    link(qwen_draft, lms / "Qwen" / "Qwen2.5-Coder-0.5B-Instruct-GGUF" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    (lms / "someone" / "notes-GGUF").mkdir(parents=True)
    (lms / "someone" / "notes-GGUF" / "notes.gguf").write_text("not a model\n")
    (lms / "someone" / "notes-GGUF" / "README.md").write_text("# notes\n")

    # Ollama: manifests naming blobs; one blob is a truncated GGUF, one manifest has no model layer.
    ollama = home / ".ollama" / "models"
    blobs = ollama / "blobs"
    link(gemma, blobs / f"sha256-{GEMMA_SHA}", hard=True)
    broken = write_gguf(home / "broken.gguf").read_bytes()
    (blobs / f"sha256-{'b' * 64}").write_bytes(broken[: len(broken) // 2])
    library = ollama / "manifests" / "registry.ollama.ai" / "library"
    for name, tag, layers in (
        ("gemma3", "270m", [("application/vnd.ollama.image.model", GEMMA_SHA)]),
        ("broken", "latest", [("application/vnd.ollama.image.model", "b" * 64)]),
        ("cloudy", "latest", [("application/vnd.ollama.image.template", "c" * 64)]),
    ):
        manifest = library / name / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        doc = {"schemaVersion": 2, "layers": [{"mediaType": m, "digest": f"sha256:{d}", "size": 1} for m, d in layers]}
        manifest.write_text(json.dumps(doc))

    # llama.cpp's older cache: flat files; one is the HF cache's SmolLM2 again, one link is dangling.
    llama = home / ".cache" / "llama.cpp"
    link(smollm, llama / "bartowski_SmolLM2-135M-Instruct-GGUF_SmolLM2-135M-Instruct-Q4_1.gguf")
    link(home / "gone.gguf", llama / "gone.gguf")

    # A folder from the user's models.toml: a split model, and a split model missing its second part.
    folder = home / "my-models"
    parts = write_split(folder / "split" / "tiny-split.gguf")
    (folder / "lost").mkdir()
    (folder / "lost" / "lost-00001-of-00002.gguf").write_bytes(parts[0].read_bytes())  # a few KB
    return Layout(home, folder, [hf, lms, ollama, llama, folder])


@pytest.fixture
def layout(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    qwen_target_path: Path,
    qwen_draft_path: Path,
    tiny_model_path: Path,
    gemma_path: Path,
) -> Layout:
    env = sandbox(tmp_path, monkeypatch)  # an empty edgespec cache: the registry offers no cached drafts
    home = tmp_path / "home"
    for variable in ("XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "LLAMA_CACHE",
                     "OLLAMA_MODELS"):  # fmt: skip
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(home))
    built = build_layouts(home, qwen_target_path, qwen_draft_path, tiny_model_path, gemma_path)
    (env / "models.toml").write_text(f'[scan]\nfolders = ["{built.folder}"]\n')
    return built


def state(roots: list[Path]) -> dict[str, tuple]:
    """Everything about the scanned places that a write would change: every entry's type, size, mtime and
    link target, and the content of every small file (the models themselves are checked by size and mtime)."""
    out: dict[str, tuple] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                st = path.lstat()
                target = os.readlink(path) if path.is_symlink() else None
                digest = None
                if path.is_file() and not path.is_symlink() and st.st_size < 1 << 20:
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[str(path)] = (st.st_mode, st.st_size, st.st_mtime_ns, target, digest)
    return out


def run(*args: str):
    return CliRunner().invoke(models, list(args))


# ---------------------------------------------------------------------------------------------- scanning


def test_scan_finds_each_layout_and_skips_what_is_broken(layout: Layout) -> None:
    result = scan()
    found = {m.id: m for m in result.found}
    assert {m.id: m.source for m in result.found} == {
        "qwen2.5-coder-1.5b-instruct-q4_k_m": "hf",
        "smollm2-135m-instruct-q4_1": "hf",
        "qwen2.5-coder-0.5b-instruct-q4_k_m": "lmstudio",
        "gemma3:270m": "ollama",
        "tiny-split": "folder",
    }  # SmolLM2 in llama.cpp's cache is the HF cache's file again: listed once
    qwen = found["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert qwen.label == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert qwen.path.is_relative_to(layout.home / ".cache" / "huggingface" / "hub")
    doc = qwen.as_dict()
    assert {"id", "path", "source", "arch", "size", "quant", "n_params", "vocab"} <= set(doc)
    assert (doc["arch"], doc["quant"], doc["size"]) == ("qwen2", "Q4_K_M", 1_117_320_768)
    draft = found["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    assert draft.facts.fingerprint == qwen.facts.fingerprint  # one tokenizer, one fingerprint
    assert found["smollm2-135m-instruct-q4_1"].facts.fingerprint != qwen.facts.fingerprint
    split = found["tiny-split"]
    assert split.path.name == "tiny-split-00001-of-00002.gguf"
    assert (split.facts.parts, split.facts.n_params) == (2, 400 * 8 + 4 * 8 + 16 * 8 + 8)  # both parts count

    reasons = {s.path.name: s.reason for s in result.skipped}
    assert "dangling link" in reasons["smollm2-135m-instruct-q8_0.gguf"]
    assert "not a GGUF file" in reasons["notes.gguf"]
    assert "truncated GGUF" in reasons[f"sha256-{'b' * 64}"]
    assert "no model layer" in reasons["latest"]  # the cloudy manifest
    assert "dangling link" in reasons["gone.gguf"]
    assert "part 2 of 2" in reasons["lost-00001-of-00002.gguf"]
    assert not any("mmproj" in str(s.path) for s in result.skipped)  # a projector is not even a candidate


def test_found_models_are_named_by_id_or_path(layout: Layout) -> None:
    qwen = resolve_model("qwen2.5-coder-1.5b-instruct-q4_k_m", progress=False)
    assert qwen.name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" and qwen.is_relative_to(layout.home)
    assert resolve_model("GEMMA3:270M", progress=False).name == f"sha256-{GEMMA_SHA}"
    assert resolve_model(str(qwen), progress=False) == qwen.resolve()
    info = json.loads(run("info", "--json", "tiny-split").stdout)
    assert info["n_params"] == 400 * 8 + 4 * 8 + 16 * 8 + 8


def test_scanning_writes_nothing_under_the_scanned_folders(layout: Layout) -> None:
    before = state(layout.roots)
    scan()
    assert run("scan", "--json", "-v").exit_code == 0
    assert run("list").exit_code == 0
    assert run("compat", "qwen2.5-coder-1.5b-instruct-q4_k_m", "--all").exit_code == 0
    choose_draft(resolve_model("qwen2.5-coder-1.5b-instruct-q4_k_m", progress=False))
    assert state(layout.roots) == before


# ---------------------------------------------------------------------------------------------- --draft auto


def test_draft_auto_chooses_the_0_5b_for_the_1_5b_and_nothing_for_smollm_or_gemma(layout: Layout) -> None:
    target = resolve_model("qwen2.5-coder-1.5b-instruct-q4_k_m", progress=False)
    choice = choose_draft(target)
    assert choice.ref == "qwen2.5-coder-0.5b-instruct-q4_k_m"
    assert choice.path is not None and choice.path.parent.name == "Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert "\n" not in choice.line and "same family" in choice.line and "lmstudio" in choice.line

    for target in ("smollm2-135m-instruct-q4_1", "gemma3:270m"):
        choice = choose_draft(resolve_model(target, progress=False), target_name=target)
        assert choice.path is None and choice.ref is None
        assert choice.line.startswith(f"draft: none for {target}") and "prompt lookup alone" in choice.line


def test_cli_scan_list_and_compat(layout: Layout) -> None:
    scanned = run("scan", "--json")
    assert scanned.exit_code == 0, scanned.output
    doc = json.loads(scanned.stdout)
    assert isinstance(doc, list) and {d["source"] for d in doc} == {"hf", "lmstudio", "ollama", "folder"}

    verbose = run("scan", "-v")
    assert "qwen2.5-coder-0.5b-instruct-q4_k_m" in verbose.stdout
    assert re.search(r"skipped .*notes\.gguf \(lmstudio\): .*not a GGUF file", verbose.stderr)

    listed = run("list").stdout
    assert listed.index("PAIR") < listed.index("FOUND") < listed.index("gemma3:270m")
    assert json.loads(run("list", "--json").stdout)["found"][0]["id"] == "qwen2.5-coder-1.5b-instruct-q4_k_m"

    ranked = run("compat", "qwen2.5-coder-1.5b-instruct-q4_k_m", "--all")
    assert ranked.exit_code == 0, ranked.output
    lines = ranked.stdout.splitlines()
    assert lines[1].split()[:3] == ["1", "qwen2.5-coder-0.5b-instruct-q4_k_m", "lmstudio"]
    assert "CANNOT DRAFT" in ranked.stdout and "another tokenizer" in ranked.stdout
    compat_doc = json.loads(run("compat", "--json", "qwen2.5-coder-1.5b-instruct-q4_k_m").stdout)
    assert [d["id"] for d in compat_doc["drafts"]] == ["qwen2.5-coder-0.5b-instruct-q4_k_m"]
    # The two-model form still checks one pair.
    pair = run("compat", "qwen2.5-coder-1.5b-instruct-q4_k_m", "qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert pair.exit_code == 0 and pair.stdout.startswith("compatible:")
