"""Which llama.cpp backend `make setup` builds llama-cpp-python for, and that build.

It runs before edgespec or llama-cpp-python is installed (``python3 edgespec/buildenv.py``), so it uses the standard
library only and imports nothing of edgespec. What it looks at comes in through a :class:`Machine` (environment,
``which``, files, commands), so tests fake every machine:

- CUDA when a CUDA toolkit (``nvcc`` on the PATH, or under ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda*``,
  ``/opt/cuda``) and an NVIDIA driver that sees a GPU (``nvidia-smi``) are both present, built for the compute
  capabilities of the GPUs present only (every architecture takes far longer to build);
- Metal on Apple silicon (and on an Intel Mac, where llama-cpp-python builds it in whatever it is told);
- the CPU otherwise, with the reason;
- ``EDGESPEC_BACKEND=cpu|cuda|metal|vulkan`` forces one; a ``CMAKE_ARGS`` the user set goes to the build untouched;
- llama.cpp's RPC backend in every build (:data:`RPC_ARGS`: ``--rpc`` and ``edgespec rpc-server``), unless
  ``EDGESPEC_RPC=0``;
- on a CPU with AMX (a Xeon since Sapphire Rapids), without llama.cpp's AMX kernels (:data:`NO_AMX_ARGS`).

The wheel is built with ``pip wheel`` into ``<wheels>/<key>/``, one folder per backend and CMake arguments, and reused
from there; ``<wheels>`` is ``$EDGESPEC_WHEELS``, else ``${XDG_CACHE_HOME:-~/.cache}/edgespec/wheels``, outside the
checkout so that a fresh clone (CI's) reuses the build. pip's own wheel cache keys a built wheel by the source it came
from, not by ``CMAKE_ARGS``, so it would hand a CPU wheel to a CUDA build or the reverse: only the plain CPU build (no
CMake arguments: ``EDGESPEC_RPC=0`` on a machine without a GPU) reads and fills it; every other build runs with
``--no-cache-dir --no-binary``, compiled from source. Every wheel is checked for its backend's library
(``libggml-cuda.so``, ...), and for ``libggml-rpc`` when RPC was asked for, before it is reused or installed. A GPU
build that fails says so and the CPU one is installed instead.

    python3 edgespec/buildenv.py                 # the choice and why (`make backend`); builds nothing
    python3 edgespec/buildenv.py --json          # the same as JSON
    python3 edgespec/buildenv.py --key           # the wheel folder's name (the Makefile's stamp)
    .venv/bin/python edgespec/buildenv.py install   # build or reuse the wheel, install it into that Python
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

BACKENDS = ("cpu", "cuda", "metal", "vulkan")
FORCE_HINT = "Force another with EDGESPEC_BACKEND=cpu|cuda|metal|vulkan, or set CMAKE_ARGS (passed through untouched)."
PACKAGE = "llama-cpp-python"
# The CPU build has no CMake arguments: the build `make setup` always made, which pip's cache may already hold. On a
# Mac it has Metal whatever CMAKE_ARGS say (llama-cpp-python's CMakeLists forces GGML_METAL on there).
CPU_ARGS = ""
ROOT = Path(__file__).resolve().parent.parent
# llama.cpp's AMX kernels, which its build compiles in wherever the compiler targets a CPU with AMX-INT8 (-march=native
# on a Xeon since Sapphire Rapids), crash the process on the first decode of more than one token with K-quant
# weights: seen here as a segfault in ggml_backend_amx_mul_mat on a 2-token decode of the Qwen 1.5B Q4_K_M (one
# token runs their AVX-512 path and works), and upstream as llama.cpp issue 20824 (closed without a fix). Built
# without them, the weights are repacked for AVX-512 as on any x86 CPU. GCC and Clang let an explicit -mno-* win
# over -march=native whatever the order. (A build that has them anyway: Model turns weight repacking off.)
NO_AMX_ARGS = "-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8"
NO_AMX_REASON = "this CPU has AMX: built without llama.cpp's AMX kernels, which crash on batches of K-quant weights"
# llama.cpp's RPC backend: a few hundred kilobytes of client and server code in every build, so that a model can put
# layers on another machine's `edgespec rpc-server` (--rpc) without a rebuild.
RPC_ARGS = "-DGGML_RPC=ON"
RPC_REASON = "with llama.cpp's RPC backend, for --rpc and `edgespec rpc-server` (EDGESPEC_RPC=0 leaves it out)"
_RPC_ON = re.compile(r"-DGGML_RPC=(ON|1|TRUE|YES)\b", re.I)
# The library each GPU backend adds to the wheel (llama_cpp/lib/libggml-cuda.so, ...): how a built or cached wheel
# is checked for the backend it was built with. Every wheel carries every backend's header (include/ggml-cuda.h).
_BACKEND_LIBS = {"cuda": "ggml-cuda", "metal": "ggml-metal", "vulkan": "ggml-vulkan"}
_SHARED_LIB = re.compile(r"(?:lib)?(ggml-\w+)\.(?:so|dylib|dll)(?:\.[\d.]+)?")
# Where CUDA toolkits are installed when nvcc is not on the PATH (NVIDIA's installers, distribution packages).
_CUDA_PREFIXES = ("/usr/local/cuda", "/usr/local/cuda-*", "/opt/cuda", "/usr/lib/cuda")


def _run(cmd: Sequence[str]) -> tuple[int, str]:
    """Exit status and output (stdout, else stderr) of a probe; 127 when the command is missing."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except FileNotFoundError:
        return 127, f"{cmd[0]} not found"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 126, str(exc)
    return proc.returncode, (proc.stdout if proc.returncode == 0 else proc.stderr or proc.stdout).strip()


@dataclass
class Machine:
    """What detection may look at; every field can be replaced by a fake."""

    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    system: str = field(default_factory=platform.system)  # "Linux", "Darwin", "Windows"
    arch: str = field(default_factory=platform.machine)  # "x86_64", "arm64", "aarch64"
    which: Callable[[str], str | None] = shutil.which
    is_file: Callable[[str], bool] = os.path.isfile
    glob: Callable[[str], list[str]] = glob.glob
    run: Callable[[Sequence[str]], tuple[int, str]] = _run


@dataclass(frozen=True)
class Choice:
    """The build `make setup` will make: a backend, the CMake arguments for it, and why."""

    backend: str  # cpu, cuda, metal, vulkan; "custom" for a CMAKE_ARGS that names none of them
    cmake_args: str  # exactly what the build gets as $CMAKE_ARGS ("" for the plain CPU build)
    reasons: tuple[str, ...]
    forced_by: str | None = None  # "EDGESPEC_BACKEND" or "CMAKE_ARGS" when the user chose

    @property
    def key(self) -> str:
        """The wheel folder's name: one per backend and CMake arguments (``cpu`` for the plain CPU build)."""
        if not self.cmake_args:
            return self.backend
        return f"{self.backend}-{hashlib.sha256(self.cmake_args.encode()).hexdigest()[:10]}"

    @property
    def line(self) -> str:
        """The one line `make setup` and `make backend` print."""
        how = f' (CMAKE_ARGS="{self.cmake_args}")' if self.cmake_args else ""
        return f"llama.cpp backend: {self.backend}{how}: {'; '.join(self.reasons)}. {FORCE_HINT}"

    def as_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "cmake_args": self.cmake_args,
            "reasons": list(self.reasons),
            "forced_by": self.forced_by,
            "key": self.key,
            "line": self.line,
        }


# ---------------------------------------------------------------------------------------------- detection


@dataclass(frozen=True)
class Cuda:
    """What was found of CUDA: the toolkit's nvcc and the GPUs' compute capabilities, each with what was seen."""

    nvcc: str | None
    nvcc_on_path: bool
    toolkit: str  # a phrase: "the CUDA 12.4 toolkit (/usr/local/cuda/bin/nvcc)", or why there is none
    gpus: tuple[str, ...]  # GPU names; empty when no driver answered
    capabilities: tuple[str, ...]  # "8.6", ... (empty when unknown)
    driver: str  # a phrase: "NVIDIA driver with 1 GPU (NVIDIA GeForce RTX 3090; compute capability 8.6)", or why not

    @property
    def usable(self) -> bool:
        return self.nvcc is not None and bool(self.gpus)

    def cmake_args(self) -> str:
        args = ["-DGGML_CUDA=on"]
        if self.capabilities:
            archs = sorted({c.replace(".", "") for c in self.capabilities}, key=lambda a: (len(a), a))
            args.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}")
        if self.nvcc is not None and not self.nvcc_on_path:
            args.append(f"-DCMAKE_CUDA_COMPILER={self.nvcc}")
        return " ".join(args)


def find_nvcc(m: Machine) -> tuple[str | None, bool]:
    """The CUDA compiler and whether it is the one on the PATH (CMake finds that one by itself)."""
    explicit = m.env.get("CUDACXX")
    if explicit and m.is_file(explicit):
        return explicit, False
    on_path = m.which("nvcc")
    if on_path:
        return on_path, True
    roots = [m.env[v] for v in ("CUDA_HOME", "CUDA_PATH") if m.env.get(v)]
    for prefix in _CUDA_PREFIXES:
        # The newest versioned toolkit first (/usr/local/cuda-12.4 before /usr/local/cuda-11.8).
        roots.extend(sorted(m.glob(prefix), key=_version_key, reverse=True) if "*" in prefix else [prefix])
    for root in roots:
        nvcc = os.path.join(root, "bin", "nvcc")
        if m.is_file(nvcc):
            return nvcc, False
    return None, False


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", os.path.basename(path)))


def detect_cuda(m: Machine) -> Cuda:
    nvcc, on_path = find_nvcc(m)
    if nvcc is None:
        toolkit = "no CUDA toolkit (no nvcc on the PATH, under $CUDA_HOME or in /usr/local/cuda*, /opt/cuda)"
    else:
        rc, out = m.run([nvcc, "--version"])
        release = re.search(r"release (\d+\.\d+)", out) if rc == 0 else None
        toolkit = f"the CUDA {release.group(1) + ' ' if release else ''}toolkit ({nvcc})"
    gpus, caps, driver = nvidia_gpus(m)
    return Cuda(nvcc, on_path, toolkit, tuple(gpus), tuple(caps), driver)


def nvidia_gpus(m: Machine) -> tuple[list[str], list[str], str]:
    """The GPUs the NVIDIA driver sees, their compute capabilities ("8.6"; empty when the driver does not say)
    and a phrase for the reasons."""
    smi = m.which("nvidia-smi")
    if smi is None:
        return [], [], "no NVIDIA driver (nvidia-smi not found)"
    rc, out = m.run([smi, "--query-gpu=compute_cap,name", "--format=csv,noheader"])
    rows = [row.partition(",") for row in out.splitlines() if row.strip()] if rc == 0 else []
    names, caps = [name.strip() for _, _, name in rows], [cap.strip() for cap, _, _ in rows]
    if not rows or not all(re.fullmatch(r"\d+\.\d+", cap) for cap in caps):
        # A driver older than the compute_cap field (R510) still lists its GPUs.
        rc_list, listed = m.run([smi, "-L"])
        names = [line.split(":", 1)[1].split("(UUID")[0].strip() for line in listed.splitlines()
                 if rc_list == 0 and line.startswith("GPU ") and ":" in line]  # fmt: skip
        caps = []
        if not names:
            detail = (out if rc != 0 else listed).strip().splitlines()
            return [], [], f"no usable NVIDIA driver (nvidia-smi: {detail[0] if detail else f'exit status {rc}'})"
    of = f"compute capability {', '.join(sorted(set(caps)))}" if caps else "compute capability unknown"
    count = f"{len(names)} GPU{'s' if len(names) > 1 else ''}"
    return names, caps, f"NVIDIA driver with {count} ({', '.join(sorted(set(names)))}; {of})"


def _named_in(cmake_args: str) -> str:
    """The backend a user's CMAKE_ARGS turns on."""
    on = {k.lower() for k, v in re.findall(r"-DGGML_(CUDA|METAL|VULKAN)=(\w+)", cmake_args, re.I)
          if v.upper() in ("ON", "1", "TRUE", "YES")}  # fmt: skip
    for backend in ("cuda", "metal", "vulkan"):
        if backend in on:
            return backend
    return "custom"


def native_has_amx(m: Machine) -> bool:
    """Whether the C compiler's -march=native turns AMX-INT8 on here (and so llama.cpp's AMX kernels)."""
    if m.arch.lower() not in ("x86_64", "amd64"):
        return False
    code, out = m.run([m.env.get("CC") or "cc", "-march=native", "-dM", "-E", "-x", "c", "/dev/null"])
    return code == 0 and "__AMX_INT8__" in out


def _without_amx(choice: Choice) -> Choice:
    return replace(choice, cmake_args=f"{choice.cmake_args} {NO_AMX_ARGS}".strip(),
                   reasons=(*choice.reasons, NO_AMX_REASON))  # fmt: skip


def wants_rpc(cmake_args: str) -> bool:
    """Whether a build's CMake arguments turn llama.cpp's RPC backend on."""
    return bool(_RPC_ON.search(cmake_args))


def _with_rpc(choice: Choice) -> Choice:
    return replace(choice, cmake_args=f"{choice.cmake_args} {RPC_ARGS}".strip(), reasons=(*choice.reasons, RPC_REASON))


def choose(m: Machine | None = None) -> Choice:
    """The build for this machine, and the reasons. Raises ValueError for an EDGESPEC_BACKEND it does not know."""
    m = m or Machine()
    choice = _choose(m)
    # A user's CMAKE_ARGS go to the build untouched; Metal is a Mac's, and no Mac has AMX.
    if choice.forced_by == "CMAKE_ARGS":
        return choice
    if (m.env.get("EDGESPEC_RPC") or "").strip().lower() not in ("0", "off", "no", "false"):
        choice = _with_rpc(choice)
    if choice.backend != "metal" and native_has_amx(m):
        choice = _without_amx(choice)
    return choice


def _choose(m: Machine) -> Choice:
    forced = (m.env.get("EDGESPEC_BACKEND") or "").strip().lower()
    user_args = (m.env.get("CMAKE_ARGS") or "").strip()
    if user_args:
        reasons = ["CMAKE_ARGS is set: passed to the build untouched"]
        if not wants_rpc(user_args):
            reasons.append(f"no {RPC_ARGS} in them: without llama.cpp's RPC backend (--rpc)")
        if forced:
            reasons.append(f"EDGESPEC_BACKEND={forced} is ignored while CMAKE_ARGS is set")
        return Choice(_named_in(user_args), user_args, tuple(reasons), "CMAKE_ARGS")
    if forced and forced not in BACKENDS:
        raise ValueError(f"EDGESPEC_BACKEND={forced!r}: expected one of {', '.join(BACKENDS)}")
    if forced == "cpu":
        why = "EDGESPEC_BACKEND=cpu" + (" (a Mac build has Metal all the same; -ngl 0 keeps models on the CPU)"
                                        if m.system == "Darwin" else "")
        return Choice("cpu", CPU_ARGS, (why,), "EDGESPEC_BACKEND")
    if forced == "metal":
        return Choice("metal", "-DGGML_METAL=on", ("EDGESPEC_BACKEND=metal",), "EDGESPEC_BACKEND")
    if forced == "vulkan":
        note = "EDGESPEC_BACKEND=vulkan (needs the Vulkan SDK's headers and glslc)"
        return Choice("vulkan", "-DGGML_VULKAN=on", (note,), "EDGESPEC_BACKEND")
    if forced == "cuda":
        return _cuda_choice(detect_cuda(m), ["EDGESPEC_BACKEND=cuda"], "EDGESPEC_BACKEND")
    if m.system == "Darwin" and m.arch in ("arm64", "aarch64"):
        return Choice("metal", "-DGGML_METAL=on", ("Apple silicon",))
    if m.system == "Darwin":
        return Choice("metal", "-DGGML_METAL=on", ("a Mac: llama-cpp-python builds Metal in on every Mac",))
    cuda = detect_cuda(m)
    if cuda.usable:
        return _cuda_choice(cuda, [], None)
    if cuda.nvcc is not None:
        why = f"{cuda.toolkit} is here, but {cuda.driver}"
    elif cuda.gpus:
        why = f"{cuda.driver}, but {cuda.toolkit}: install the CUDA toolkit, or try EDGESPEC_BACKEND=vulkan"
    else:
        why = f"{cuda.driver} and {cuda.toolkit}"
    return Choice("cpu", CPU_ARGS, (why,))


def _cuda_choice(cuda: Cuda, reasons: list[str], forced_by: str | None) -> Choice:
    reasons = [*reasons, cuda.toolkit, cuda.driver]
    if not cuda.capabilities:
        reasons.append("GPU architectures unknown: llama.cpp's defaults (a longer build)")
    return Choice("cuda", cuda.cmake_args(), tuple(reasons), forced_by)


def cpu_fallback(failed: Choice) -> Choice:
    fallback = Choice("cpu", CPU_ARGS, (f"the {failed.backend} build failed",))
    if wants_rpc(failed.cmake_args):
        fallback = _with_rpc(fallback)
    return _without_amx(fallback) if NO_AMX_ARGS in failed.cmake_args else fallback


# ---------------------------------------------------------------------------------------------- the build


def pinned_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The llama-cpp-python version edgespec pins (one place: pyproject.toml)."""
    found = re.search(r'"llama-cpp-python==([^"\s;]+)"', pyproject.read_text(encoding="utf-8"))
    if not found:
        raise SystemExit(f"edgespec: {pyproject} pins no llama-cpp-python version")
    return found.group(1)


def default_wheel_root(env: Mapping[str, str] | None = None) -> Path:
    """Where built wheels are kept: ``$EDGESPEC_WHEELS``, else ``${XDG_CACHE_HOME:-~/.cache}/edgespec/wheels``."""
    env = os.environ if env is None else env
    if env.get("EDGESPEC_WHEELS"):
        return Path(env["EDGESPEC_WHEELS"]).expanduser()
    cache = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return cache / "edgespec" / "wheels"


def wheel_libraries(wheel: Path) -> set[str]:
    """The ggml libraries a llama-cpp-python wheel carries ("ggml-cpu", "ggml-cuda", "ggml-rpc", ...)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    return {m.group(1) for m in map(_SHARED_LIB.fullmatch, (os.path.basename(n) for n in names)) if m}


def wheel_backends(wheel: Path) -> set[str]:
    """The GPU backends a llama-cpp-python wheel carries libraries for (empty: a CPU build)."""
    libs = wheel_libraries(wheel)
    return {backend for backend, lib in _BACKEND_LIBS.items() if lib in libs}


def find_wheel(folder: Path, version: str, python_tag: str) -> Path | None:
    """A wheel of ``version`` in ``folder`` that this Python can install: pip names the built one
    llama_cpp_python-VER-py3-none-linux_x86_64.whl (its Python code loads the libraries with ctypes), a wheel built
    otherwise may carry the interpreter's tag (cp311)."""
    for wheel in sorted(folder.glob(f"llama_cpp_python-{version}-*.whl")):
        tags = wheel.name[: -len(".whl")].split("-")
        if len(tags) >= 5 and set(tags[-3].split(".")) & {python_tag, "py3"}:
            return wheel
    return None


Pip = Callable[[list[str], Mapping[str, str]], int]


def _pip(args: list[str], env: Mapping[str, str]) -> int:
    return subprocess.run([sys.executable, "-m", "pip", *args], env=dict(env), check=False).returncode


@dataclass
class Builder:
    """Builds (or reuses) the wheel for a choice and installs it; ``pip`` is replaceable for tests."""

    wheel_root: Path = field(default_factory=default_wheel_root)
    version: str = field(default_factory=pinned_version)
    python_tag: str = f"cp{sys.version_info.major}{sys.version_info.minor}"
    system: str = field(default_factory=platform.system)
    pip: Pip = _pip
    say: Callable[[str], None] = lambda line: print(f"edgespec: {line}", flush=True)  # noqa: E731

    def wheel(self, choice: Choice, env: Mapping[str, str]) -> Path | None:
        """The wheel for ``choice``: reused from its folder, else built there. None when the build fails or does
        not carry the backend it was built for."""
        folder = self.wheel_root / choice.key
        found = find_wheel(folder, self.version, self.python_tag)
        if found is not None and self._holds(found, choice):
            self.say(f"reusing {found}")
            return found
        if found is not None:
            found.unlink()
        folder.mkdir(parents=True, exist_ok=True)
        build_env = {k: v for k, v in env.items() if k != "CMAKE_ARGS"}
        if choice.cmake_args:
            build_env["CMAKE_ARGS"] = choice.cmake_args
        args = ["wheel", "--no-deps", "--wheel-dir", str(folder), f"{PACKAGE}=={self.version}"]
        # Only the plain build may meet pip's wheel cache (keyed by source, not by CMake arguments), or take a ready
        # wheel from an index or --find-links; every other build compiles the source with its CMake arguments.
        cache = [] if not choice.cmake_args else ["--no-cache-dir", "--no-binary", PACKAGE]
        if self.pip(args + cache, build_env) == 0:
            built = find_wheel(folder, self.version, self.python_tag)
            if built is not None and self._holds(built, choice):
                return built
            if built is not None and not choice.cmake_args:
                # pip's cache held a wheel someone built for a GPU: build the CPU one from source.
                self.say(f"pip's cache held a {'/'.join(sorted(wheel_backends(built)))} wheel; building the CPU one")
                built.unlink()
                if self.pip(args + ["--no-cache-dir", "--no-binary", PACKAGE], build_env) == 0:
                    built = find_wheel(folder, self.version, self.python_tag)
                    if built is not None and self._holds(built, choice):
                        return built
            if built is not None:
                self.say(f"the {choice.backend} build produced no {' or '.join(self._needs(choice)) or 'usable'} "
                         "library")  # fmt: skip
                built.unlink()
        return None

    @staticmethod
    def _needs(choice: Choice) -> list[str]:
        """The libraries a wheel built for ``choice`` must carry."""
        needs = [_BACKEND_LIBS[choice.backend]] if choice.backend in _BACKEND_LIBS else []
        return needs + (["ggml-rpc"] if wants_rpc(choice.cmake_args) else [])

    def _holds(self, wheel: Path, choice: Choice) -> bool:
        """Whether ``wheel`` was built for ``choice``: its backend's library (and RPC's, when asked for) and no other
        GPU backend's (a Mac's wheels all carry Metal)."""
        try:
            libs = wheel_libraries(wheel)
        except (OSError, zipfile.BadZipFile):
            return False
        if not set(self._needs(choice)) <= libs:
            return False
        if choice.backend == "custom":
            return True
        carried = {backend for backend, lib in _BACKEND_LIBS.items() if lib in libs}
        allowed = {choice.backend} | ({"metal"} if self.system == "Darwin" else set())
        return not carried - allowed

    def install(self, choice: Choice, m: Machine) -> Choice | None:
        """Build or reuse the wheel for ``choice`` and install it (``--force-reinstall --no-deps``: the package's
        own install pulls the dependencies). A GPU build that fails falls back to the CPU one. Returns the
        choice installed, or None when not even the CPU build worked."""
        self.say(choice.line)
        wheel = self.wheel(choice, m.env)
        if wheel is None and choice.backend != "cpu":
            fallback = cpu_fallback(choice)
            self.say(
                f"the {choice.backend} build of {PACKAGE} failed (pip's output above says why); falling back to the "
                "CPU build: edgespec works, without GPU offload. To try again once the cause is fixed: "
                "rm .venv/.installed && make setup"
            )
            choice, wheel = fallback, self.wheel(fallback, m.env)
        if wheel is None:
            self.say(f"the {choice.backend} build of {PACKAGE} failed (pip's output above says why)")
            return None
        if self.pip(["install", "--force-reinstall", "--no-deps", str(wheel)], m.env) != 0:
            self.say(f"installing {wheel.name} failed (pip's output above says why)")
            return None
        self.say(f"installed {PACKAGE} {self.version} for {choice.backend}")
        return choice


# ---------------------------------------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None, m: Machine | None = None) -> int:
    parser = argparse.ArgumentParser(description="The llama.cpp backend `make setup` builds, and that build.")
    parser.add_argument("command", nargs="?", choices=("show", "install"), default="show")
    parser.add_argument("--json", action="store_true", help="print the choice as JSON")
    parser.add_argument("--key", action="store_true", help="print only the wheel folder's name")
    opts = parser.parse_args(argv)
    m = m or Machine()
    try:
        choice = choose(m)
    except ValueError as exc:
        print(f"edgespec: {exc}", file=sys.stderr)
        return 2
    if opts.command == "install":
        return 0 if Builder(wheel_root=default_wheel_root(m.env), system=m.system).install(choice, m) is not None else 1
    if opts.key:
        print(choice.key)
    elif opts.json:
        print(json.dumps(choice.as_dict(), indent=1))
    else:
        print(choice.line)
        for reason in choice.reasons:
            print(f"  - {reason}")
        print(f"  CMAKE_ARGS: {shlex.quote(choice.cmake_args) if choice.cmake_args else '(none)'}")
        folder = default_wheel_root(m.env) / choice.key
        wheel = find_wheel(folder, pinned_version(), Builder.python_tag)
        print(f"  wheel: {wheel or f'{folder}/ (built by `make setup`)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
