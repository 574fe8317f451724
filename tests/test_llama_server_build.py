"""The build of llama.cpp's llama-server for the bench's peer: where it is found, and each step of the build (its
commands run by a stand-in, so no compiler runs here) failing with nothing left behind."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from edgespec import buildenv, llama_server_build
from edgespec.llama_server_build import BuildError, build, built_path, find

VERSION = "0.3.36"
CPU_RPC = buildenv.Choice("cpu", "-DGGML_RPC=ON", ("a test",))


def _sdist(dest: Path, members: dict[str, bytes] | None = None) -> None:
    members = members or {f"llama_cpp_python-{VERSION}/vendor/llama.cpp/CMakeLists.txt": b"project(llama.cpp)\n"}
    with tarfile.open(dest / f"llama_cpp_python-{VERSION}.tar.gz", "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


class FakeToolchain:
    """Answers build()'s commands as pip, cmake and the built binary would; ``fail`` names the step that fails."""

    def __init__(self, fail: str | None = None, members: dict[str, bytes] | None = None) -> None:
        self.fail, self.members = fail, members
        self.commands: list[list[str]] = []

    def __call__(self, cmd) -> int:  # noqa: ANN001
        cmd = list(cmd)
        self.commands.append(cmd)
        if cmd[1:4] == ["-m", "pip", "download"]:
            if self.fail == "download":
                return 1
            _sdist(Path(cmd[cmd.index("--dest") + 1]), self.members)
            return 0
        if cmd[0] == "cmake" and cmd[1] == "-S":
            return 1 if self.fail == "configure" else 0
        if cmd[0] == "cmake" and cmd[1] == "--build":
            if self.fail == "compile":
                return 2
            if self.fail != "no-binary":
                binary = Path(cmd[2]) / "bin" / "llama-server"
                binary.parent.mkdir(parents=True)
                binary.write_text("#!/bin/sh\necho version\n")
            return 0
        if cmd[-1] == "--version":
            return 1 if self.fail == "run" else 0
        raise AssertionError(f"unexpected command {cmd}")


@pytest.fixture(autouse=True)
def _cmake_on_path(monkeypatch) -> None:
    real = llama_server_build.shutil.which
    monkeypatch.setattr(
        llama_server_build.shutil, "which", lambda name: "/usr/bin/cmake" if name == "cmake" else real(name)
    )


def test_a_build_fetches_the_pinned_source_and_keeps_one_static_binary(tmp_path: Path) -> None:
    dest = tmp_path / "cache" / "llama-server"
    tools = FakeToolchain()
    assert build(CPU_RPC, VERSION, dest, run=tools, jobs=3, say=lambda _: None) == dest
    assert dest.is_file() and os.access(dest, os.X_OK) and not dest.with_name("llama-server.part").exists()
    download, configure, compile_, version = tools.commands
    assert download[-1] == f"llama-cpp-python=={VERSION}" and "--no-binary" in download
    assert configure[2].endswith(f"llama_cpp_python-{VERSION}/vendor/llama.cpp")
    # the backend make setup chose, linked statically, the server only
    assert (
        "-DGGML_RPC=ON" in configure
        and "-DBUILD_SHARED_LIBS=OFF" in configure
        and "-DLLAMA_BUILD_SERVER=ON" in configure
    )
    assert compile_[compile_.index("--target") + 1] == "llama-server" and compile_[-2:] == ["-j", "3"]
    assert version[-1] == "--version"


@pytest.mark.parametrize(
    ("step", "says"),
    [
        ("download", "could not download"),
        ("configure", "could not configure"),
        ("compile", "build of llama-server failed"),
        ("no-binary", "left no llama-server"),
        ("run", "does not run"),
    ],
)
def test_a_failed_step_says_which_and_leaves_nothing(tmp_path: Path, step: str, says: str) -> None:
    dest = tmp_path / "cache" / "llama-server"
    with pytest.raises(BuildError, match=says):
        build(CPU_RPC, VERSION, dest, run=FakeToolchain(fail=step), say=lambda _: None)
    assert not dest.exists() and not dest.with_name("llama-server.part").exists()


def test_an_archive_that_writes_outside_its_folder_is_refused(tmp_path: Path) -> None:
    members = {
        f"llama_cpp_python-{VERSION}/vendor/llama.cpp/CMakeLists.txt": b"x",
        "../../escaped": b"x",
    }
    with pytest.raises(BuildError, match="outside its folder"):
        build(CPU_RPC, VERSION, tmp_path / "llama-server", run=FakeToolchain(members=members), say=lambda _: None)
    assert not (tmp_path.parent / "escaped").exists()


def test_an_archive_without_llama_cpp_is_refused(tmp_path: Path) -> None:
    members = {f"llama_cpp_python-{VERSION}/README.md": b"x"}
    with pytest.raises(BuildError, match="no vendor/llama.cpp"):
        build(CPU_RPC, VERSION, tmp_path / "llama-server", run=FakeToolchain(members=members), say=lambda _: None)


def test_without_cmake_the_build_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(llama_server_build.shutil, "which", lambda name: None)
    with pytest.raises(BuildError, match="cmake is not on the PATH"):
        build(CPU_RPC, VERSION, tmp_path / "llama-server", run=FakeToolchain(), say=lambda _: None)


def test_the_bench_finds_the_paths_server_first_then_the_built_one(tmp_path: Path) -> None:
    env = {"EDGESPEC_WHEELS": str(tmp_path / "wheels"), "EDGESPEC_BACKEND": "cpu", "PATH": ""}
    assert find(env, which=lambda name: "/opt/bin/llama-server") == "/opt/bin/llama-server"
    assert find(env, which=lambda name: None) is None  # nothing built yet
    choice = buildenv.choose(buildenv.Machine(env=env))
    path = built_path(choice, buildenv.pinned_version(), env)
    assert path.parent.parent == tmp_path / "llama-server"  # beside the wheels, outside the checkout
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n")
    assert find(env, which=lambda name: None) is None  # not executable: not a server the bench could start
    path.chmod(0o755)
    assert find(env, which=lambda name: None) == str(path)
