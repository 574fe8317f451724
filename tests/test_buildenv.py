"""The backend `make setup` builds llama-cpp-python for, on fake machines; its fallbacks, with a fake pip."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from edgespec import buildenv
from edgespec.buildenv import Builder, Choice, Machine, choose

ROOT = Path(__file__).resolve().parent.parent
NVCC_VERSION = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 12.4, V12.4.131\n"


def fake_machine(
    *,
    env: Mapping[str, str] | None = None,
    system: str = "Linux",
    arch: str = "x86_64",
    path: Mapping[str, str] | None = None,  # command -> its location on the PATH
    files: Sequence[str] = (),
    smi: tuple[int, str] | None = None,  # what nvidia-smi --query-gpu answers
    smi_list: tuple[int, str] = (0, ""),  # what nvidia-smi -L answers
    native: str | None = None,  # what `cc -march=native -dM -E` prints (None: no compiler)
    rpc: bool = False,  # the default build's RPC backend; off here so that the tests of detection read plainly
) -> Machine:
    env = dict(env or {})
    if not rpc:
        env.setdefault("EDGESPEC_RPC", "0")
    path = dict(path or {})
    if smi is not None:
        path.setdefault("nvidia-smi", "/usr/bin/nvidia-smi")
    files = set(files) | set(path.values())

    def run(cmd: Sequence[str]) -> tuple[int, str]:
        if "-march=native" in cmd:
            return (127, "cc not found") if native is None else (0, native)
        if cmd[0] not in files:
            return 127, f"{cmd[0]} not found"
        if cmd[0].endswith("nvcc"):
            return 0, NVCC_VERSION
        if "-L" in cmd:
            return smi_list
        assert smi is not None
        return smi

    return Machine(
        env=env,
        system=system,
        arch=arch,
        which=path.get,
        is_file=files.__contains__,
        glob=lambda pattern: sorted(f.rsplit("/bin/", 1)[0] for f in files if f.startswith(pattern.rstrip("*"))),
        run=run,
    )


GPU_3090 = (0, "8.6, NVIDIA GeForce RTX 3090\n")


def test_no_toolkit_no_driver_builds_for_the_cpu() -> None:
    choice = choose(fake_machine())
    assert (choice.backend, choice.cmake_args, choice.key) == ("cpu", "", "cpu")
    assert "no NVIDIA driver" in choice.line and "no CUDA toolkit" in choice.line
    assert "EDGESPEC_BACKEND=cpu|cuda|metal|vulkan" in choice.line and "CMAKE_ARGS" in choice.line


AMX_CPU = "#define __AVX512VNNI__ 1\n#define __AMX_TILE__ 1\n#define __AMX_INT8__ 1\n#define __x86_64__ 1\n"
AVX512_CPU = "#define __AVX512VNNI__ 1\n#define __AVX512F__ 1\n#define __x86_64__ 1\n"


def test_a_cpu_with_amx_builds_without_llama_cpps_amx_kernels() -> None:
    choice = choose(fake_machine(native=AMX_CPU))
    assert choice.backend == "cpu" and choice.cmake_args == buildenv.NO_AMX_ARGS
    assert choice.key != "cpu"  # its own wheel folder: never the cached build that has them
    assert "AMX" in choice.line and "crash" in choice.line
    assert "-mno-amx-int8" in choice.cmake_args.split("-DCMAKE_CXX_FLAGS=")[1]  # amx.cpp is C++
    plain = choose(fake_machine(native=AVX512_CPU))
    assert (plain.cmake_args, plain.key) == ("", "cpu")
    assert choose(fake_machine(native=AMX_CPU, arch="aarch64")).cmake_args == ""  # not asked off x86


def test_a_gpu_build_on_an_amx_host_leaves_them_out_too_and_so_does_its_cpu_fallback() -> None:
    m = fake_machine(native=AMX_CPU, path={"nvcc": "/usr/local/cuda/bin/nvcc"}, smi=GPU_3090, smi_list=(0, "GPU 0"))
    choice = choose(m)
    assert choice.backend == "cuda" and "-DGGML_CUDA=on" in choice.cmake_args
    assert choice.cmake_args.endswith(buildenv.NO_AMX_ARGS)
    assert buildenv.cpu_fallback(choice).cmake_args == buildenv.NO_AMX_ARGS
    assert buildenv.cpu_fallback(CUDA).cmake_args == ""


def test_every_build_has_llama_cpps_rpc_backend_unless_asked_not_to() -> None:
    rpc = buildenv.RPC_ARGS
    cpu = choose(fake_machine(rpc=True))
    assert (cpu.backend, cpu.cmake_args) == ("cpu", rpc) and cpu.key != "cpu"  # never the cached plain build
    assert buildenv.RPC_REASON in cpu.reasons and "EDGESPEC_RPC=0" in cpu.line
    cuda = choose(fake_machine(path={"nvcc": "/usr/bin/nvcc"}, smi=GPU_3090, rpc=True))
    assert cuda.cmake_args == f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86 {rpc}"
    assert choose(fake_machine(system="Darwin", arch="arm64", rpc=True)).cmake_args == f"-DGGML_METAL=on {rpc}"
    assert choose(fake_machine(native=AMX_CPU, rpc=True)).cmake_args == f"{rpc} {buildenv.NO_AMX_ARGS}"
    for off in ("0", "off", "NO"):
        plain = choose(fake_machine(env={"EDGESPEC_RPC": off}, rpc=True))
        assert (plain.cmake_args, plain.key) == ("", "cpu")
    assert buildenv.cpu_fallback(cuda).cmake_args == rpc  # a failed GPU build's fallback keeps it


def test_a_users_cmake_args_are_not_given_rpc_and_the_reasons_say_so() -> None:
    mine = choose(fake_machine(env={"CMAKE_ARGS": "-DGGML_VULKAN=on"}, rpc=True))
    assert mine.cmake_args == "-DGGML_VULKAN=on"
    assert any("without llama.cpp's RPC backend" in r for r in mine.reasons)
    theirs = choose(fake_machine(env={"CMAKE_ARGS": "-DGGML_VULKAN=on -DGGML_RPC=on"}, rpc=True))
    assert not any("RPC" in r for r in theirs.reasons) and buildenv.wants_rpc(theirs.cmake_args)


def test_a_users_cmake_args_stay_untouched_on_an_amx_host() -> None:
    choice = choose(fake_machine(native=AMX_CPU, env={"CMAKE_ARGS": "-DGGML_NATIVE=off"}))
    assert choice.cmake_args == "-DGGML_NATIVE=off"


def test_toolkit_and_driver_build_cuda_for_the_gpus_present() -> None:
    choice = choose(fake_machine(path={"nvcc": "/usr/local/cuda/bin/nvcc"}, smi=GPU_3090))
    assert choice.backend == "cuda"
    assert choice.cmake_args == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86"
    assert "CUDA 12.4" in choice.line and "RTX 3090" in choice.line and "8.6" in choice.line
    assert choice.key.startswith("cuda-") and choice.forced_by is None


def test_two_kinds_of_gpu_get_both_architectures_once() -> None:
    smi = (0, "8.9, NVIDIA GeForce RTX 4090\n8.6, NVIDIA RTX A6000\n8.6, NVIDIA RTX A6000\n12.0, NVIDIA RTX 5090\n")
    choice = choose(fake_machine(path={"nvcc": "/usr/bin/nvcc"}, smi=smi))
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;89;120" in choice.cmake_args
    assert "4 GPUs" in choice.line


def test_toolkit_off_the_path_is_found_under_the_usual_prefixes_and_named_to_cmake() -> None:
    files = ["/usr/local/cuda-11.8/bin/nvcc", "/usr/local/cuda-12.6/bin/nvcc"]
    choice = choose(fake_machine(files=files, smi=GPU_3090))
    assert choice.backend == "cuda"
    assert "-DCMAKE_CUDA_COMPILER=/usr/local/cuda-12.6/bin/nvcc" in choice.cmake_args  # the newest
    cuda_home = choose(fake_machine(env={"CUDA_HOME": "/opt/nv"}, files=["/opt/nv/bin/nvcc"], smi=GPU_3090))
    assert "-DCMAKE_CUDA_COMPILER=/opt/nv/bin/nvcc" in cuda_home.cmake_args


def test_toolkit_without_driver_builds_for_the_cpu_and_says_why() -> None:
    choice = choose(fake_machine(path={"nvcc": "/usr/local/cuda/bin/nvcc"}))
    assert (choice.backend, choice.cmake_args) == ("cpu", "")
    assert "CUDA 12.4 toolkit" in choice.line and "no NVIDIA driver (nvidia-smi not found)" in choice.line


def test_a_driver_that_does_not_answer_is_no_driver() -> None:
    smi = (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    choice = choose(fake_machine(path={"nvcc": "/usr/bin/nvcc"}, smi=smi, smi_list=smi))
    assert choice.backend == "cpu"
    assert "couldn't communicate with the NVIDIA driver" in choice.line


def test_driver_without_toolkit_builds_for_the_cpu_and_says_what_to_install() -> None:
    choice = choose(fake_machine(smi=GPU_3090))
    assert choice.backend == "cpu"
    assert "RTX 3090" in choice.line and "install the CUDA toolkit" in choice.line


def test_an_old_driver_without_compute_cap_still_counts_but_leaves_the_architectures_to_llama_cpp() -> None:
    listed = (0, "GPU 0: Tesla T4 (UUID: GPU-1234)\n")
    old = (6, 'Field "compute_cap" is not a valid field to query.')
    choice = choose(fake_machine(path={"nvcc": "/usr/bin/nvcc"}, smi=old, smi_list=listed))
    assert (choice.backend, choice.cmake_args) == ("cuda", "-DGGML_CUDA=on")
    assert "Tesla T4" in choice.line and "architectures unknown" in choice.line


def test_apple_silicon_builds_metal() -> None:
    choice = choose(fake_machine(system="Darwin", arch="arm64"))
    assert (choice.backend, choice.cmake_args) == ("metal", "-DGGML_METAL=on")
    assert "Apple silicon" in choice.line


def test_an_intel_mac_is_said_to_get_metal_as_llama_cpp_python_builds_it_in_on_every_mac() -> None:
    choice = choose(fake_machine(system="Darwin", arch="x86_64"))
    assert choice.backend == "metal" and "every Mac" in choice.line


def test_a_linux_arm_board_with_an_nvidia_gpu_builds_cuda() -> None:
    smi = (0, "8.7, Orin (nvgpu)\n")
    choice = choose(fake_machine(arch="aarch64", path={"nvcc": "/usr/local/cuda/bin/nvcc"}, smi=smi))
    assert choice.cmake_args == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=87"


@pytest.mark.parametrize("backend", ["cpu", "cuda", "metal", "vulkan"])
def test_edgespec_backend_forces_a_backend(backend: str) -> None:
    # A machine that would choose CUDA by itself.
    machine = fake_machine(env={"EDGESPEC_BACKEND": backend.upper()}, path={"nvcc": "/usr/bin/nvcc"}, smi=GPU_3090)
    choice = choose(machine)
    assert choice.backend == backend and choice.forced_by == "EDGESPEC_BACKEND"
    assert f"EDGESPEC_BACKEND={backend}" in choice.line
    assert ("GGML_CUDA" in choice.cmake_args) == (backend == "cuda")


def test_forcing_cuda_without_a_gpu_builds_for_the_default_architectures() -> None:
    choice = choose(fake_machine(env={"EDGESPEC_BACKEND": "cuda"}, path={"nvcc": "/usr/bin/nvcc"}))
    assert (choice.backend, choice.cmake_args) == ("cuda", "-DGGML_CUDA=on")


def test_an_unknown_backend_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="cpu, cuda, metal, vulkan"):
        choose(fake_machine(env={"EDGESPEC_BACKEND": "rocm"}))


def test_cmake_args_pass_through_untouched() -> None:
    args = "-DGGML_VULKAN=ON -DGGML_NATIVE=off"
    choice = choose(fake_machine(env={"CMAKE_ARGS": args, "EDGESPEC_BACKEND": "cuda"}))
    assert (choice.backend, choice.cmake_args, choice.forced_by) == ("vulkan", args, "CMAKE_ARGS")
    assert "EDGESPEC_BACKEND=cuda is ignored" in choice.line
    assert choose(fake_machine(env={"CMAKE_ARGS": "-DGGML_BLAS=ON"})).backend == "custom"


def test_each_build_has_its_own_wheel_folder() -> None:
    keys = {
        choose(fake_machine(env={"EDGESPEC_BACKEND": b}, path={"nvcc": "/usr/bin/nvcc"}, smi=smi)).key
        for b in ("cpu", "cuda", "vulkan")
        for smi in (GPU_3090, (0, "8.9, NVIDIA GeForce RTX 4090\n"))
    }
    assert len(keys) == 4  # cpu and vulkan once each, cuda once per architecture


# ---------------------------------------------------------------------------------------------- the build


def _wheel(folder: Path, libs: Sequence[str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"  # the name pip gives the build
    with zipfile.ZipFile(path, "w") as archive:
        for lib in ("libllama.so", "libggml-base.so", "libggml-cpu.so.0.25.3", *libs):
            archive.writestr(f"llama_cpp/lib/{lib}", b"")
        for header in ("ggml-cuda.h", "ggml-metal.h", "ggml-vulkan.h"):  # in every wheel, whatever it was built for
            archive.writestr(f"include/{header}", b"")
    return path


class FakePip:
    """Records pip's invocations; ``pip wheel`` succeeds or fails per backend, leaving a wheel with its libraries."""

    def __init__(self, fails: Sequence[str] = (), cached: Sequence[str] = (), no_rpc: bool = False) -> None:
        self.calls: list[tuple[list[str], dict[str, str]]] = []
        self.no_rpc = no_rpc  # a build asked for RPC that leaves its library out
        self.fails = set(fails)
        self.cached = list(cached)  # libraries of a wheel pip's cache holds for the plain build

    def __call__(self, args: list[str], env: Mapping[str, str]) -> int:
        self.calls.append((args, dict(env)))
        if args[0] != "wheel":
            return 0
        cmake = env.get("CMAKE_ARGS", "")
        backend = next((b for b in ("cuda", "vulkan", "metal") if f"GGML_{b.upper()}=on" in cmake), "cpu")
        if backend in self.fails:
            return 1
        folder = Path(args[args.index("--wheel-dir") + 1])
        libs = self.cached if "--no-cache-dir" not in args and self.cached else ([f"libggml-{backend}.so"]
                                                                                  if backend != "cpu" else [])
        if "GGML_RPC=ON" in cmake and not self.no_rpc:
            libs = [*libs, "libggml-rpc.so"]
        _wheel(folder, libs)
        return 0

    def wheels(self) -> list[list[str]]:
        return [args for args, _ in self.calls if args[0] == "wheel"]


def _builder(tmp_path: Path, pip: FakePip) -> Builder:
    return Builder(wheel_root=tmp_path / ".whl", version="0.3.36", python_tag="cp311", pip=pip, system="Linux",
                   say=lambda line: None)  # fmt: skip


CUDA = Choice("cuda", "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86", ("test",))
CPU = Choice("cpu", "", ("test",))


def test_the_cpu_build_may_use_pips_cache_a_gpu_build_never(tmp_path: Path) -> None:
    pip = FakePip()
    builder = _builder(tmp_path, pip)
    assert builder.install(CPU, fake_machine()) == CPU
    assert builder.install(CUDA, fake_machine()) == CUDA
    cpu_wheel, cuda_wheel = pip.wheels()
    assert "--no-cache-dir" not in cpu_wheel and "--no-cache-dir" in cuda_wheel
    assert cuda_wheel[cuda_wheel.index("--no-binary") + 1] == "llama-cpp-python"  # never a ready (CPU) wheel
    assert cpu_wheel[cpu_wheel.index("--wheel-dir") + 1] == str(tmp_path / ".whl" / "cpu")
    assert cuda_wheel[cuda_wheel.index("--wheel-dir") + 1] == str(tmp_path / ".whl" / CUDA.key)
    cuda_env = pip.calls[2][1]
    assert cuda_env["CMAKE_ARGS"] == CUDA.cmake_args
    assert "CMAKE_ARGS" not in pip.calls[0][1]
    installs = [args for args, _ in pip.calls if args[0] == "install"]
    assert installs[-1][:3] == ["install", "--force-reinstall", "--no-deps"] and CUDA.key in installs[-1][-1]


def test_a_built_wheel_is_reused_not_rebuilt(tmp_path: Path) -> None:
    pip = FakePip()
    builder = _builder(tmp_path, pip)
    builder.install(CUDA, fake_machine())
    builder.install(CUDA, fake_machine())
    assert len(pip.wheels()) == 1


def test_a_failed_gpu_build_says_so_and_falls_back_to_the_cpu(tmp_path: Path) -> None:
    pip = FakePip(fails=["cuda"])
    said: list[str] = []
    builder = _builder(tmp_path, pip)
    builder.say = said.append
    installed = builder.install(CUDA, fake_machine())
    assert installed is not None and installed.backend == "cpu"
    assert any("cuda build of llama-cpp-python failed" in line and "falling back to the CPU" in line for line in said)
    assert pip.calls[-1][0][-1].endswith(".whl") and "/cpu/" in pip.calls[-1][0][-1]


def test_when_even_the_cpu_build_fails_install_fails(tmp_path: Path) -> None:
    builder = _builder(tmp_path, FakePip(fails=["cuda", "cpu"]))
    assert builder.install(CUDA, fake_machine()) is None


def test_a_gpu_wheel_in_pips_cache_is_not_installed_as_the_cpu_build(tmp_path: Path) -> None:
    pip = FakePip(cached=["libggml-cuda.so"])
    builder = _builder(tmp_path, pip)
    assert builder.install(CPU, fake_machine()) == CPU
    first, second = pip.wheels()
    assert "--no-cache-dir" not in first and "--no-cache-dir" in second
    wheel = next((tmp_path / ".whl" / "cpu").glob("*.whl"))
    assert buildenv.wheel_backends(wheel) == set()


def test_a_cpu_wheel_left_in_a_gpu_folder_is_not_reused(tmp_path: Path) -> None:
    _wheel(tmp_path / ".whl" / CUDA.key, [])
    pip = FakePip()
    assert _builder(tmp_path, pip).install(CUDA, fake_machine()) == CUDA
    assert len(pip.wheels()) == 1


RPC_CPU = Choice("cpu", buildenv.RPC_ARGS, ("test",))


def test_an_rpc_build_is_checked_for_the_rpc_library(tmp_path: Path) -> None:
    _wheel(tmp_path / ".whl" / RPC_CPU.key, [])  # a wheel left there without libggml-rpc: not reused
    pip = FakePip()
    assert _builder(tmp_path, pip).install(RPC_CPU, fake_machine()) == RPC_CPU
    (wheel,) = pip.wheels()
    assert "--no-cache-dir" in wheel  # pip's cache keys by source, not by -DGGML_RPC
    assert "ggml-rpc" in buildenv.wheel_libraries(next((tmp_path / ".whl" / RPC_CPU.key).glob("*.whl")))
    said: list[str] = []
    builder = _builder(tmp_path / "other", FakePip(no_rpc=True))
    builder.say = said.append
    assert builder.install(RPC_CPU, fake_machine()) is None
    assert any("produced no ggml-rpc library" in line for line in said)


def test_wheels_are_kept_outside_the_checkout_so_a_fresh_clone_reuses_them(tmp_path: Path) -> None:
    assert buildenv.default_wheel_root({"EDGESPEC_WHEELS": str(tmp_path)}) == tmp_path
    assert buildenv.default_wheel_root({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "edgespec" / "wheels"
    assert buildenv.default_wheel_root({}) == Path.home() / ".cache" / "edgespec" / "wheels"
    assert Builder(version="0.3.36").wheel_root == buildenv.default_wheel_root()
    out = subprocess.run(
        [sys.executable, "-I", str(ROOT / "edgespec" / "buildenv.py")], capture_output=True, text=True, check=True,
        env={"PATH": "/nonexistent", "EDGESPEC_WHEELS": str(tmp_path)},
    )  # fmt: skip
    assert f"wheel: {tmp_path}/cpu-" in out.stdout and "-DGGML_RPC=ON" in out.stdout


def test_only_wheels_this_python_installs_are_reused(tmp_path: Path) -> None:
    for name in ("llama_cpp_python-0.3.36-cp310-cp310-linux_x86_64.whl", "llama_cpp_python-0.3.35-py3-none-any.whl"):
        (tmp_path / name).touch()
    assert buildenv.find_wheel(tmp_path, "0.3.36", "cp311") is None
    (tmp_path / "llama_cpp_python-0.3.36-cp311-cp311-linux_x86_64.whl").touch()
    assert buildenv.find_wheel(tmp_path, "0.3.36", "cp311") is not None


@pytest.mark.parametrize(
    ("libs", "backends"),
    [([], set()), (["libggml-cuda.so", "libggml-cuda.so.0.25.3"], {"cuda"}), (["libggml-metal.dylib"], {"metal"}),
     (["ggml-vulkan.dll"], {"vulkan"})],
)  # fmt: skip
def test_a_wheel_is_known_by_its_backend_libraries_not_its_headers(
    tmp_path: Path, libs: list[str], backends: set[str]
) -> None:
    assert buildenv.wheel_backends(_wheel(tmp_path, libs)) == backends


def test_the_pinned_version_is_read_from_pyproject() -> None:
    assert buildenv.pinned_version(ROOT / "pyproject.toml") == "0.3.36"


def test_the_script_runs_on_the_standard_library_alone() -> None:
    # What `make backend` runs, before anything is installed: no edgespec or llama_cpp import.
    out = subprocess.run(
        [sys.executable, "-I", str(ROOT / "edgespec" / "buildenv.py"), "--json"],
        capture_output=True, text=True, check=True, env={"PATH": "/nonexistent", "EDGESPEC_BACKEND": "vulkan"},
    )  # fmt: skip
    assert '"backend": "vulkan"' in out.stdout
    bad = subprocess.run(
        [sys.executable, "-I", str(ROOT / "edgespec" / "buildenv.py")],
        capture_output=True, text=True, env={"EDGESPEC_BACKEND": "rocm"},
    )  # fmt: skip
    assert bad.returncode == 2 and "expected one of cpu, cuda, metal, vulkan" in bad.stderr
