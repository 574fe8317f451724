"""llama.cpp's own ``llama-server``, built from the llama.cpp the pinned llama-cpp-python vendors: the bench's peer.

``edgespec bench`` runs llama-server beside its own strategies when it finds one (plain, with the draft model, and
with its n-gram drafting, ``--spec-type ngram-mod`` and ``ngram-cache``). Most machines have no llama-server on the
PATH, and one that does may hold another llama.cpp than edgespec's. ``make llama-server`` builds the one that matches:
it fetches llama-cpp-python's source release from the package index (the only place edgespec fetches code from),
configures its ``vendor/llama.cpp`` for the same backend `make setup` chose (:func:`edgespec.buildenv.choose`), links
it statically (one file, nothing else to keep beside it) and keeps it in
``${XDG_CACHE_HOME:-~/.cache}/edgespec/llama-server/<version>-<backend key>/llama-server``, where the bench looks after
the PATH. About ten minutes on 2 cores; later calls find it built.

    .venv/bin/python -m edgespec.llama_server_build          # build it (or say where it is)
    .venv/bin/python -m edgespec.llama_server_build --where  # only say where it is, or would be
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from edgespec import buildenv

BINARY = "llama-server"
# The server alone: no tests, examples or HTTPS (it serves 127.0.0.1 to the bench), static so the file stands alone.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
)

Run = Callable[[Sequence[str]], int]


class BuildError(RuntimeError):
    """A step of the build failed; the message says which and what to do."""


def _run(cmd: Sequence[str]) -> int:
    return subprocess.run(list(cmd), check=False).returncode


def home(env: Mapping[str, str] | None = None) -> Path:
    """Where built servers are kept: beside the wheels (``$EDGESPEC_WHEELS/../llama-server`` or the user's cache)."""
    return buildenv.default_wheel_root(env).parent / "llama-server"


def built_path(choice: buildenv.Choice, version: str, env: Mapping[str, str] | None = None) -> Path:
    return home(env) / f"{version}-{choice.key}" / BINARY


def find(env: Mapping[str, str] | None = None, which: Callable[[str], str | None] = shutil.which) -> str | None:
    """The llama-server the bench runs: the PATH's, else the one ``make llama-server`` built for this backend."""
    on_path = which(BINARY)
    if on_path:
        return on_path
    env = os.environ if env is None else env
    try:
        choice = buildenv.choose(buildenv.Machine(env=env))
    except ValueError:
        return None
    path = built_path(choice, buildenv.pinned_version(), env)
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def build(
    choice: buildenv.Choice,
    version: str,
    dest: Path,
    *,
    run: Run = _run,
    jobs: int | None = None,
    say: Callable[[str], None] = lambda line: print(f"edgespec: {line}", flush=True),  # noqa: E731
) -> Path:
    """Build llama-server for ``choice`` from llama-cpp-python ``version``'s source release into ``dest``. Nothing is
    left at ``dest`` unless the whole build worked and the binary runs."""
    if shutil.which("cmake") is None:
        raise BuildError("cmake is not on the PATH: install it (apt-get install cmake, or pip install cmake)")
    jobs = jobs or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="edgespec-llama-server-") as tmp:
        work = Path(tmp)
        say(f"fetching the source of {buildenv.PACKAGE} {version} from the package index")
        download = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--dest", str(work)]
        if run([*download, f"{buildenv.PACKAGE}=={version}"]) != 0:
            raise BuildError(
                f"pip could not download {buildenv.PACKAGE}=={version}'s source (its output above says why)"
            )
        source = _unpack(work, version)
        args = [*CMAKE_FLAGS, *shlex.split(choice.cmake_args)]
        say(f"building {BINARY} for {choice.backend} ({' '.join(args)}), {jobs} jobs: about ten minutes on 2 cores")
        out = work / "build"
        if run(["cmake", "-S", str(source), "-B", str(out), *args]) != 0:
            raise BuildError("cmake could not configure llama.cpp (its output above says why)")
        if run(["cmake", "--build", str(out), "--target", BINARY, "--config", "Release", "-j", str(jobs)]) != 0:
            raise BuildError(f"the build of {BINARY} failed (the compiler's output above says why)")
        binary = next((p for p in (out / "bin" / BINARY, out / "bin" / "Release" / BINARY) if p.is_file()), None)
        if binary is None:
            raise BuildError(f"the build finished but left no {BINARY} under {out / 'bin'}")
        if run([str(binary), "--version"]) != 0:
            raise BuildError(f"the built {BINARY} does not run (`{binary} --version` failed)")
        dest.parent.mkdir(parents=True, exist_ok=True)
        staged = dest.with_name(dest.name + ".part")
        shutil.copy2(binary, staged)
        staged.chmod(0o755)
        staged.replace(dest)  # whole or not at all: a build cut short leaves nothing the bench would run
    say(f"built {dest}")
    return dest


def _unpack(work: Path, version: str) -> Path:
    archives = sorted(work.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not archives:
        raise BuildError(f"pip downloaded no llama_cpp_python-{version}.tar.gz into {work}")
    root = work / "src"
    with tarfile.open(archives[0]) as archive:
        # The sources need no links; and no member of the package index's archive may land outside root.
        members = [m for m in archive.getmembers() if not (m.issym() or m.islnk())]
        for member in members:
            if not (root / member.name).resolve().is_relative_to(root.resolve()):
                raise BuildError(f"{archives[0].name} holds a path outside its folder: {member.name}")
        # (filter: Python 3.12's check of the same, where there is one; the loop above is the check on 3.10 and 3.11)
        archive.extractall(root, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    source = root / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if not (source / "CMakeLists.txt").is_file():
        raise BuildError(f"{archives[0].name} has no vendor/llama.cpp/CMakeLists.txt")
    return source


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--where", action="store_true", help="print where the server is (or would be built); build nothing"
    )
    opts = parser.parse_args(argv)
    try:
        choice = buildenv.choose()
    except ValueError as exc:
        print(f"edgespec: {exc}", file=sys.stderr)
        return 2
    version = buildenv.pinned_version()
    dest = built_path(choice, version)
    if opts.where:
        found = find()
        print(found or f"{dest} (not built: make llama-server)")
        return 0 if found else 1
    if dest.is_file():
        print(f"edgespec: {BINARY} is built: {dest}")
        return 0
    try:
        build(choice, version, dest)
    except BuildError as exc:
        print(f"edgespec: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
