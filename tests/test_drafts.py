"""Draft compatibility by llama.cpp's rules, the ranking behind `--draft auto`, and where the CLI applies it.

The rules and the ranking run on small GGUF files written here (milliseconds); the CLI tests use the tiny model.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from fake_packs import sandbox

from edgespec.cli import main
from edgespec.cli.common import pick_models
from edgespec.models.discovery import inspect
from edgespec.models.drafts import Candidate, family, quant_bits, rank
from edgespec.models.vocab import incompatibility, vocab_facts

NORMAL, CONTROL = int(gguf.TokenType.NORMAL), int(gguf.TokenType.CONTROL)
FTYPES = {"Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M, "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
          "Q2_K": gguf.LlamaFileType.MOSTLY_Q2_K, "F32": gguf.LlamaFileType.ALL_F32}  # fmt: skip


def model(
    path: Path,
    *,
    name: str = "Foo 1B",
    rows: int = 100,
    quant: str = "Q4_K_M",
    tokenizer: str = "gpt2",
    pre: str | None = "qwen2",
    tokens: list[str] | None = None,
    types: list[int] | None = None,
    bos: int = 1,
    eos: int = 2,
    add_bos: bool | None = None,
) -> Path:
    """A small GGUF whose parameter count grows with ``rows`` (rows x 8 elements plus a 400 x 8 embedding)."""
    tokens = tokens if tokens is not None else ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_file_type(int(FTYPES[quant]))
    # What llama.cpp requires of a llama model (the preflight checks it)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_head_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(tokenizer)
    if tokenizer == "gpt2":
        writer.add_token_merges(["t o"])
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types if types is not None else [CONTROL] * 3 + [NORMAL] * (len(tokens) - 3))
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), dtype=np.float32))
    writer.add_tensor("blk.0.ffn.weight", np.zeros((rows, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sandbox(tmp_path, monkeypatch)


def why(tmp_path: Path, target_kwargs: dict, draft_kwargs: dict) -> str | None:
    t = inspect(model(tmp_path / "t.gguf", **target_kwargs))
    d = inspect(model(tmp_path / "d.gguf", **draft_kwargs))
    return incompatibility(t.info, d.info, fingerprints=(t.fingerprint, d.fingerprint))


# ---------------------------------------------------------------------------------------------- llama.cpp's rules


def test_add_bos_defaults_follow_llama_cpp(tmp_path: Path) -> None:
    assert vocab_facts(inspect(model(tmp_path / "a.gguf", tokenizer="llama", pre=None)).info).add_bos is True
    assert vocab_facts(inspect(model(tmp_path / "b.gguf", pre="llama-bpe")).info).add_bos is True
    assert vocab_facts(inspect(model(tmp_path / "c.gguf", pre="qwen2")).info).add_bos is False
    assert vocab_facts(inspect(model(tmp_path / "d.gguf", pre="qwen2", add_bos=True)).info).add_bos is True


def test_compatibility_rules(tmp_path: Path) -> None:
    base = ["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(397)]
    assert why(tmp_path, {}, {}) is None
    assert "another tokenizer" in why(tmp_path, {}, {"tokenizer": "llama", "pre": None})
    assert "adds BOS to a prompt and the target does not" in why(tmp_path, {}, {"add_bos": True})
    assert "another EOS id (3 vs the target's 2)" in why(tmp_path, {}, {"eos": 3})
    # Sizes within 128 tokens are fine (padding, extra specials); further apart is not.
    assert why(tmp_path, {}, {"tokens": base + [f"extra{i}" for i in range(128)]}) is None
    assert "more than 128 apart" in why(tmp_path, {}, {"tokens": base + [f"extra{i}" for i in range(129)]})
    # From id 5 on every text must match; below it a special token may differ, a plain one may not.
    assert "token 7 differs ('other' vs the target's 'tok4')" in why(
        tmp_path, {}, {"tokens": base[:7] + ["other"] + base[8:]}
    )
    assert why(tmp_path, {}, {"tokens": ["<pad>"] + base[1:]}) is None
    plain_at_3 = [CONTROL] * 3 + [NORMAL] * 397
    assert "token 3 differs" in why(
        tmp_path, {"types": plain_at_3}, {"tokens": base[:3] + ["x"] + base[4:], "types": plain_at_3}
    )


def test_family_and_quant_bits(tmp_path: Path) -> None:
    assert family(inspect(model(tmp_path / "a.gguf", name="Qwen2.5 Coder 0.5B Instruct AWQ"))) == "qwen2.5 coder"
    assert family(inspect(model(tmp_path / "b.gguf", name="Gemma 3 270m"))) == "gemma 3"
    nameless = model(tmp_path / "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf", name="no size here")
    assert family(inspect(nameless)) == "meta llama 3.1"
    assert [quant_bits(q) for q in ("Q4_K_M", "IQ2_XS", "Q8_0", "BF16", None)] == [4, 2, 8, 16, None]


# ---------------------------------------------------------------------------------------------- ranking


def test_ranking_prefers_small_same_family_good_quants(tmp_path: Path) -> None:
    target = inspect(model(tmp_path / "target.gguf", name="Foo Coder 7B", rows=7600))  # 64,000 parameters
    drafts = {
        "fam-q4": dict(name="Foo Coder 1B", rows=1200, quant="Q4_K_M"),  # 12,800: 20 %
        "fam-q8": dict(name="Foo Coder 1B", rows=1200, quant="Q8_0"),  # the same weights, better quant
        "fam-q2": dict(name="Foo Coder 0.2B", rows=1, quant="Q2_K"),  # smallest, but 2-bit
        "other": dict(name="Bar 0.5B", rows=400, quant="Q8_0"),  # 6,400: smaller, another family
        "fam-40": dict(name="Foo Coder 3B", rows=2800, quant="Q4_K_M"),  # 25,600: 40 %, above the 1/4 aim
        "fam-60": dict(name="Foo Coder 4B", rows=4400, quant="Q4_K_M"),  # 38,400: 60 %, too big
        "foreign": dict(name="Foo Coder 1B", rows=1200, tokenizer="llama", pre=None),
    }
    candidates = [
        Candidate(ref, "folder", inspect(model(tmp_path / f"{ref}.gguf", **kwargs))) for ref, kwargs in drafts.items()
    ]
    ranked, rejected = rank(target, candidates)
    assert [r.candidate.ref for r in ranked] == ["fam-q8", "fam-q4", "fam-q2", "other", "fam-40"]
    assert ranked[0].same_family
    assert ranked[0].reason == "same family (foo coder), 12.8K parameters, 20% of the target's, Q8_0"
    assert "(low quality)" in ranked[2].reason and "more than the 1/4" in ranked[4].reason
    reasons = {r.candidate.ref: r.reason for r in rejected}
    assert reasons["fam-60"].startswith("shares the vocabulary but has 60%")
    assert reasons["foreign"].startswith("incompatible: another tokenizer")


# ---------------------------------------------------------------------------------------------- the CLI


def test_a_target_without_draft_gets_its_pairs_draft_or_auto() -> None:
    assert pick_models(None, "qwen2.5-coder-1.5b", None) == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "auto")
    assert pick_models(None, "smollm2-135m", None) == ("smollm2-135m", "smollm2-135m", 4)
    assert pick_models(None, "/models/mine.gguf", None) == ("/models/mine.gguf", "auto", None)
    assert pick_models(None, "hf:org/repo:Q4_K_M", None)[1] == "auto"
    assert pick_models(None, "/models/mine.gguf", "none") == ("/models/mine.gguf", None, None)
    assert pick_models(None, None, None)[:2] == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")


@pytest.mark.real
def test_generate_json_names_the_files_and_auto_says_why(tiny_model_path: Path) -> None:
    path = str(tiny_model_path)
    common = ["generate", "Hello", "-m", path, "--temperature", "0", "-n", "2", "--n-ctx", "256", "--json"]
    alone = CliRunner().invoke(main, [*common, "--draft-len", "0"], catch_exceptions=False)  # no --draft: auto
    assert alone.exit_code == 0, alone.output
    out = json.loads(alone.stdout)
    assert out["target"] == str(tiny_model_path.resolve()) and out["draft"] is None
    assert alone.stderr.startswith(f"draft: none for {tiny_model_path.name} (no model here shares its vocabulary)")
    paired = CliRunner().invoke(main, [*common, "-d", path, "--draft-len", "2"], catch_exceptions=False)
    assert json.loads(paired.stdout)["draft"] == str(tiny_model_path.resolve())
    assert "draft:" not in paired.stderr  # a named draft needs no explanation
