"""hf: references: parsing, llama.cpp's file choice, downloads into the Hugging Face cache, the sha256 check, and
offline resolution. Real huggingface-hub talks to a local server playing the hub (tests/fake_hub.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_hub import FakeHub, HubFileSpec, serve_hub
from fake_packs import UNREACHABLE, sandbox
from test_gguf import write_gguf

from edgespec.cli.models import models
from edgespec.errors import ModelError, ModelNotFoundError
from edgespec.models import hub
from edgespec.models.fetch import cached_path
from edgespec.models.hub import HubFile, HubRef, parse_hub_ref, pick_files
from edgespec.models.registry import load_registry, resolve_model

REPO = "org/tiny-GGUF"


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sandbox(tmp_path, monkeypatch)


@pytest.fixture
def gguf_bytes(tmp_path: Path) -> bytes:
    return write_gguf(tmp_path / "tiny.gguf", name="tiny").read_bytes()


@pytest.fixture
def fake_hub(env: Path, gguf_bytes: bytes, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with serve_hub() as served:
        served.repos[REPO] = {
            "README.md": HubFileSpec(b"# tiny\n"),
            "imatrix.gguf": HubFileSpec(b"imatrix"),
            "mmproj-tiny-Q8_0.gguf": HubFileSpec(b"projector"),  # sorts before tiny-Q8_0 and must be skipped
            "tiny-F16-00001-of-00002.gguf": HubFileSpec(b"first part"),
            "tiny-F16-00002-of-00002.gguf": HubFileSpec(b"second part"),
            "tiny-Q2_K.gguf": HubFileSpec(b"q2"),
            "tiny-Q4_K_M.gguf": HubFileSpec(gguf_bytes),
            "tiny-Q8_0.gguf": HubFileSpec(b"q8" * 1000),
            "sub/tiny-IQ4_XS.gguf": HubFileSpec(b"iq4"),
        }
        monkeypatch.setenv("HF_ENDPOINT", served.url)
        yield served


def hf_cache(env: Path) -> Path:
    return env / "hf"


# ---------------------------------------------------------------------------------------------- references


def test_parse_hub_ref() -> None:
    assert parse_hub_ref("qwen2.5-coder-1.5b") is None
    assert parse_hub_ref("hf:Qwen/Qwen3-8B-GGUF") == HubRef("Qwen/Qwen3-8B-GGUF")
    assert parse_hub_ref("hf:Qwen/Qwen3-8B-GGUF:q4_k_m") == HubRef("Qwen/Qwen3-8B-GGUF", quant="q4_k_m")
    assert parse_hub_ref("hf:unsloth/x-GGUF:UD-Q4_K_XL").quant == "UD-Q4_K_XL"
    assert parse_hub_ref("hf:org/repo/sub/file.gguf") == HubRef("org/repo", file="sub/file.gguf")
    assert str(HubRef("org/repo", quant="Q8_0")) == "hf:org/repo:Q8_0"
    for bad in ("hf:", "hf:repo-only", "hf:org/repo/../x.gguf", "hf:org/repo:", "hf:a/b/c", "hf:org/repo:Q4 K"):
        with pytest.raises(ModelNotFoundError, match="not a hub reference"):
            parse_hub_ref(bad)


def _files(*paths: str) -> list[HubFile]:
    return [HubFile(p, 1, None) for p in paths]


@pytest.mark.parametrize(
    ("ref", "files", "expected"),
    [
        # No tag: Q4_K_M, then Q8_0, then the first model file; a match must end the tag with "." or "-".
        (HubRef(REPO), _files("a-Q8_0.gguf", "b-Q4_K_M.gguf"), ["b-Q4_K_M.gguf"]),
        (HubRef(REPO), _files("a-Q2_K.gguf", "b-Q8_0.gguf"), ["b-Q8_0.gguf"]),
        (HubRef(REPO), _files("README.md", "a-Q2_K.gguf", "b-Q3_K.gguf"), ["a-Q2_K.gguf"]),
        (HubRef(REPO), _files("a-Q4_K_M_L.gguf", "b-Q8_0.gguf"), ["b-Q8_0.gguf"]),
        # A tag matches case-insensitively, anywhere in the path, skipping projectors and imatrix files.
        (HubRef(REPO, quant="q8_0"), _files("mmproj-Q8_0.gguf", "x/m-Q8_0.gguf"), ["x/m-Q8_0.gguf"]),
        (HubRef(REPO, quant="Q8_0"), _files("imatrix-Q8_0.gguf", "mtp-Q8_0.gguf", "m.Q8_0.gguf"), ["m.Q8_0.gguf"]),
        # A split model comes whole, first part first, whichever part the tag met first.
        (
            HubRef(REPO, quant="Q4_K_M"),
            _files("m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"),
            ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"],
        ),
        (
            HubRef(REPO, file="m-Q4_K_M-00002-of-00002.gguf"),
            _files("m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"),
            ["m-Q4_K_M-00001-of-00002.gguf", "m-Q4_K_M-00002-of-00002.gguf"],
        ),
        (HubRef(REPO, file="sub/m.gguf"), _files("m.gguf", "sub/m.gguf"), ["sub/m.gguf"]),
    ],
)
def test_pick_files_as_llama_cpp_does(ref: HubRef, files: list[HubFile], expected: list[str]) -> None:
    assert [f.path for f in pick_files(files, ref, "on the hub")] == expected


def test_pick_files_errors_list_what_is_there() -> None:
    with pytest.raises(ModelNotFoundError, match="no model file matching 'Q5_K_M'.*a-Q8_0.gguf"):
        pick_files(_files("a-Q8_0.gguf", "README.md"), HubRef(REPO, quant="Q5_K_M"), "on the hub")
    with pytest.raises(ModelNotFoundError, match="it holds no GGUF file"):
        pick_files(_files("README.md"), HubRef(REPO), "on the hub")
    with pytest.raises(ModelNotFoundError, match=r"split in 3 parts but part\(s\) 2 are not on the hub"):
        pick_files(_files("m-00001-of-00003.gguf", "m-00003-of-00003.gguf"), HubRef(REPO), "on the hub")
    with pytest.raises(ModelNotFoundError, match="no file 'x.gguf'"):
        pick_files(_files("m.gguf"), HubRef(REPO, file="x.gguf"), "on the hub")


# ---------------------------------------------------------------------------------------------- downloads


def test_quant_tag_downloads_into_the_hf_cache(fake_hub: FakeHub, env: Path) -> None:
    path = resolve_model(f"hf:{REPO}:q8_0", progress=False)
    assert path.name == "tiny-Q8_0.gguf" and path.read_bytes() == b"q8" * 1000
    assert path.is_relative_to(hf_cache(env) / "models--org--tiny-GGUF" / "snapshots")
    assert fake_hub.downloads() == [f"/{REPO}/resolve/main/tiny-Q8_0.gguf"]  # only the file asked for
    # The check passed once and is remembered, in edgespec's cache only.
    assert (env / "cache" / ".hub-verified" / fake_hub.repos[REPO]["tiny-Q8_0.gguf"].sha256).is_file()


def test_no_tag_means_q4_k_m(fake_hub: FakeHub) -> None:
    assert resolve_model(f"hf:{REPO}", progress=False).name == "tiny-Q4_K_M.gguf"


def test_a_file_in_a_folder_by_name(fake_hub: FakeHub) -> None:
    path = resolve_model(f"hf:{REPO}/sub/tiny-IQ4_XS.gguf", progress=False)
    assert path.parent.name == "sub" and path.read_bytes() == b"iq4"


def test_split_model_is_fetched_whole_and_loaded_from_its_first_part(fake_hub: FakeHub) -> None:
    path = resolve_model(f"hf:{REPO}:F16", progress=False)
    assert path.name == "tiny-F16-00001-of-00002.gguf" and path.read_bytes() == b"first part"
    # llama.cpp finds the other parts by name next to the first: the snapshot path keeps the names.
    assert (path.parent / "tiny-F16-00002-of-00002.gguf").read_bytes() == b"second part"
    assert sorted(fake_hub.downloads()) == [
        f"/{REPO}/resolve/main/tiny-F16-00001-of-00002.gguf",
        f"/{REPO}/resolve/main/tiny-F16-00002-of-00002.gguf",
    ]
    # Naming the first part's snapshot path again keeps the name, too.
    assert resolve_model(str(path), progress=False) == path


def test_wrong_sha256_is_refused_and_removed(fake_hub: FakeHub, env: Path) -> None:
    spec = fake_hub.repos[REPO]["tiny-Q8_0.gguf"]
    spec.claimed_sha256 = "0" * 64  # the listing (and ETag) say one thing, the bytes another
    with pytest.raises(ModelError, match="tiny-Q8_0.gguf has sha256 .* but the hub records 0000000000000000"):
        resolve_model(f"hf:{REPO}:Q8_0", progress=False)
    repo = hf_cache(env) / "models--org--tiny-GGUF"
    assert not list((repo / "snapshots").rglob("tiny-Q8_0.gguf"))
    assert not (repo / "blobs" / ("0" * 64)).exists()
    assert not (env / "cache" / ".hub-verified").exists()
    spec.claimed_sha256 = None  # the hub fixed: the next try downloads afresh and passes
    assert resolve_model(f"hf:{REPO}:Q8_0", progress=False).read_bytes() == spec.data


def test_offline_resolution_from_the_cache(
    fake_hub: FakeHub, env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    first = resolve_model(f"hf:{REPO}:F16", progress=False)
    served = len(fake_hub.requests)
    # The check is remembered: resolving again never hashes the file.
    monkeypatch.setattr(hub, "hash_file", lambda *a, **k: pytest.fail("hashed again"))

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model(f"hf:{REPO}:F16", progress=False) == first
    assert len(fake_hub.requests) == served  # not one request

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    assert resolve_model(f"hf:{REPO}:F16", progress=True) == first
    assert "hub is unreachable" in capsys.readouterr().err

    # Offline, a tag picks among the cached files; what is not cached says why it cannot be had.
    with pytest.raises(ModelNotFoundError, match="no model file matching 'Q2_K'.*Hugging Face cache"):
        resolve_model(f"hf:{REPO}:Q2_K", progress=False)
    with pytest.raises(ModelNotFoundError, match="unreachable.*has no copy"):
        resolve_model("hf:org/other-GGUF", progress=False)


def test_offline_file_without_a_record_is_checked_against_its_blob_name(
    fake_hub: FakeHub, env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file another tool put in the Hugging Face cache: its blob is named after its sha256.
    path = resolve_model(f"hf:{REPO}:Q8_0", progress=False)
    for record in (env / "cache" / ".hub-verified").iterdir():
        record.unlink()
    blob = path.resolve()
    blob.chmod(0o644)
    blob.write_bytes(b"tampered")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="tiny-Q8_0.gguf has sha256 .* but the hub records"):
        resolve_model(f"hf:{REPO}:Q8_0", progress=False)
    assert not blob.exists() and not path.exists()


def test_hub_errors_are_one_line(fake_hub: FakeHub) -> None:
    with pytest.raises(ModelNotFoundError, match="no repo org/missing-GGUF on the hub"):
        resolve_model("hf:org/missing-GGUF", progress=False)
    with pytest.raises(ModelNotFoundError, match="no model file matching 'Q5_K_M' in org/tiny-GGUF on the hub"):
        resolve_model(f"hf:{REPO}:Q5_K_M", progress=False)


# ---------------------------------------------------------------------------------------------- the CLI


def run(*args: str):
    return CliRunner().invoke(models, list(args))


def test_cli_pull_info_path_verify(fake_hub: FakeHub) -> None:
    ref = f"hf:{REPO}:Q4_K_M"
    assert run("info", ref).exit_code == 1  # not downloaded yet: info never downloads
    pulled = run("pull", "-q", ref)
    assert pulled.exit_code == 0, pulled.output
    name, path = pulled.stdout.strip().split("\t")
    assert name == ref and Path(path).name == "tiny-Q4_K_M.gguf"
    assert run("path", ref).stdout.strip() == path
    facts = json.loads(run("info", "--json", ref).stdout)
    assert facts["name"] == "tiny" and facts["n_vocab"] == 400
    assert run("verify", "-q", ref).stdout == f"{ref}\tok\n"

    blob = Path(path).resolve()
    blob.chmod(0o644)
    blob.write_bytes(b"GGUF" + blob.read_bytes()[4:-1] + b"!")  # same size, other bytes
    bad = run("verify", "-q", ref)
    assert bad.exit_code == 1 and bad.stdout == f"{ref}\tBAD\n"
    assert run("path", ref).exit_code == 1  # no longer trusted


def test_unchecked_registry_entry_comes_from_the_hub(fake_hub: FakeHub, env: Path) -> None:
    (env / "models.toml").write_text(
        f'[models.tiny]\nrole = "target"\nchecked = false\nhub_repo = "{REPO}"\nhub_quant = "Q4_K_M"\n'
    )
    spec = load_registry().model("tiny")
    assert (spec.size, spec.sha256, spec.checked) == (None, None, False)
    assert cached_path(spec) is None
    path = resolve_model("tiny", progress=False)
    assert path.name == "tiny-Q4_K_M.gguf" and path.is_relative_to(hf_cache(env))
    assert cached_path(spec) == path
    served = len(fake_hub.requests)
    assert resolve_model("tiny", progress=False) == path and len(fake_hub.requests) == served  # cache first
    listed = json.loads(run("list", "--json").stdout)
    assert next(m for m in listed["models"] if m["name"] == "tiny")["cached"] is True
    removed = run("rm", "tiny")
    assert removed.exit_code == 1 and "Hugging Face cache" in removed.stderr
