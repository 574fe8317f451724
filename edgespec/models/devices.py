"""What this machine and its llama.cpp build offer: the ggml backends and devices (with their free memory), the CPU
threads to decode on, and how many layers of each model to offload to the GPUs (from the model's shape, read without
loading its weights)."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from edgespec.errors import ModelError
from edgespec.models.llama_init import init_backend
from edgespec.models.offload import ALL_LAYERS, Need, plan_layers

log = logging.getLogger("edgespec.models.devices")


# Backends that are no GPU of this machine's: the CPU's own, a BLAS library's, and RPC servers' (llama.cpp counts a
# build with the RPC backend as one that "supports GPU offload").
_NOT_LOCAL_GPU = ("CPU", "BLAS", "RPC")


def gpu_offload_supported() -> bool:
    """Whether this llama-cpp-python build can offload layers to a GPU here (CUDA, Metal, Vulkan, ...)."""
    return bool(llama_cpp.llama_supports_gpu_offload()) and any(
        name not in _NOT_LOCAL_GPU for name in backend_names()
    )


@dataclass(frozen=True)
class Device:
    name: str
    free: int  # bytes
    total: int
    kind: str = "GPU"  # ggml's device type: "CPU", "GPU", "iGPU" or "ACCEL"
    description: str = ""
    backend: str = ""  # the ggml backend it belongs to: "CUDA", "Metal", "RPC", ...


_DEVICE_KINDS = {0: "CPU", 1: "GPU", 2: "iGPU", 3: "ACCEL"}  # enum ggml_backend_dev_type
_libggml = None


def libggml():
    """llama-cpp-python's handle on libggml, with the backend registry and device calls it does not bind (those of
    this module, and of :mod:`edgespec.models.rpc`)."""
    global _libggml
    if _libggml is None:
        from llama_cpp._ggml import libggml as lib

        vp, size_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
        for name, restype, argtypes in (
            ("ggml_backend_reg_count", ctypes.c_size_t, []),
            ("ggml_backend_reg_get", vp, [ctypes.c_size_t]),
            ("ggml_backend_reg_by_name", vp, [ctypes.c_char_p]),
            ("ggml_backend_reg_name", ctypes.c_char_p, [vp]),
            ("ggml_backend_reg_get_proc_address", vp, [vp, ctypes.c_char_p]),
            ("ggml_backend_register", None, [vp]),
            ("ggml_backend_reg_dev_count", ctypes.c_size_t, [vp]),
            ("ggml_backend_reg_dev_get", vp, [vp, ctypes.c_size_t]),
            ("ggml_backend_dev_count", ctypes.c_size_t, []),
            ("ggml_backend_dev_get", vp, [ctypes.c_size_t]),
            ("ggml_backend_dev_by_type", vp, [ctypes.c_int]),
            ("ggml_backend_dev_type", ctypes.c_int, [vp]),
            ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
            ("ggml_backend_dev_memory", None, [vp, size_p, size_p]),
            ("ggml_backend_dev_backend_reg", vp, [vp]),
        ):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        _libggml = lib
    return _libggml


def backend_names() -> list[str]:
    """The ggml backends this llama.cpp build has compiled in ("CPU", "CUDA", "Metal", ...)."""
    init_backend()
    ggml = libggml()
    return [ggml.ggml_backend_reg_name(ggml.ggml_backend_reg_get(i)).decode(errors="replace")
            for i in range(ggml.ggml_backend_reg_count())]  # fmt: skip


def backend_devices() -> list[Device]:
    """Every device ggml can run on (the CPU included), with its free memory."""
    init_backend()
    ggml = libggml()
    found = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = ggml.ggml_backend_dev_backend_reg(dev)
        found.append(
            Device(
                ggml.ggml_backend_dev_name(dev).decode(errors="replace"),
                free.value,
                total.value,
                _DEVICE_KINDS.get(ggml.ggml_backend_dev_type(dev), "?"),
                (ggml.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                ggml.ggml_backend_reg_name(reg).decode(errors="replace") if reg else "",
            )
        )
    return found


def gpu_devices() -> list[Device]:
    """This machine's GPUs llama.cpp can offload to, with their free memory (empty on a CPU-only build; an RPC
    server's devices are not among them)."""
    init_backend()
    if not gpu_offload_supported():
        return []
    return [d for d in backend_devices() if d.kind in ("GPU", "iGPU") and d.backend != "RPC"]


def local_gpu_handles() -> list[int]:
    """The ggml handles of the GPUs llama.cpp would give a model by default, less any RPC server's: the discrete
    GPUs, else the integrated ones (as llama.cpp's own device selection)."""
    init_backend()
    ggml = libggml()
    by_kind: dict[str, list[int]] = {"GPU": [], "iGPU": []}
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        reg = ggml.ggml_backend_dev_backend_reg(dev)
        kind = _DEVICE_KINDS.get(ggml.ggml_backend_dev_type(dev), "?")
        if kind in by_kind and not (reg and ggml.ggml_backend_reg_name(reg) == b"RPC"):
            by_kind[kind].append(dev)
    return by_kind["GPU"] or by_kind["iGPU"]


def amx_kernels() -> bool:
    """Whether this llama.cpp build runs weights through its AMX kernels on this CPU.

    They crash the process on the first decode of more than one token with K-quant weights (a segfault in
    ggml_backend_amx_mul_mat on a 2-token decode of the Qwen 1.5B Q4_K_M; llama.cpp issue 20824), and llama.cpp
    has no switch for them alone: a model loaded with such a build goes without weight repacking (plain decoding
    of the 1.5B measured 12.5 tok/s on that CPU, and 14.6 with `make setup`'s build without AMX, which repacks).
    Said once.
    """
    global _amx_said
    found = "AMX_INT8 = 1" in system_info()
    if found and not _amx_said:
        _amx_said = True
        log.warning(
            "this llama.cpp build has AMX kernels, which crash on batches of K-quant weights (llama.cpp issue "
            "20824): weights load without repacking, slower; `make setup` builds llama-cpp-python without them"
        )
    return found


_amx_said = False


def system_info() -> str:
    """llama.cpp's one line on what this build uses (CPU features, backends)."""
    init_backend()
    return llama_cpp.llama_print_system_info().decode(errors="replace").strip()


@dataclass(frozen=True)
class Shape:
    """What offload planning needs to know of a model before loading its weights."""

    n_layer: int
    kv_bytes_per_token: int  # K and V, all layers, f16


def model_shape(path: str | os.PathLike) -> Shape:
    """Layer count and KV size per token, read by llama.cpp without allocating or reading any weights."""
    init_backend()
    params = llama_cpp.llama_model_default_params()
    params.no_alloc = True
    params.load_mode = 0  # LLAMA_LOAD_MODE_NONE: llama.cpp asserts that a no-alloc load maps nothing
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelError(f"llama.cpp could not read {path} (not a GGUF model it supports, or corrupt)")
    try:
        n_layer = int(llama_cpp.llama_model_n_layer(model))
        n_head = max(int(llama_cpp.llama_model_n_head(model)), 1)
        head_dim = int(llama_cpp.llama_model_n_embd(model)) // n_head
        kv = 2 * n_layer * int(llama_cpp.llama_model_n_head_kv(model)) * head_dim * 2
    finally:
        llama_cpp.llama_model_free(model)
    return Shape(n_layer, kv)


def offload_needs(models: Sequence[tuple[str | os.PathLike, int]]) -> list[Need]:
    """What each ``(path, n_ctx)`` would take on a GPU: its weights (the file size), layers and KV cache."""
    needs = []
    for path, n_ctx in models:
        shape = model_shape(path)
        needs.append(Need(Path(path).stat().st_size, shape.n_layer, shape.kv_bytes_per_token * n_ctx))
    return needs


def auto_gpu_layers(models: Sequence[tuple[str | os.PathLike, int]], extra_free: int = 0) -> list[int]:
    """``n_gpu_layers`` for each ``(path, n_ctx)``, offloading what fits the GPUs' free memory (0 without a GPU);
    ``extra_free``: more memory to offload to (RPC servers' devices)."""
    free = sum(d.free for d in gpu_devices()) + extra_free
    if not free:
        return [0] * len(models)
    return plan_layers(free, offload_needs(models))


def auto_layers_beside_servers(
    target: tuple[str | os.PathLike, int], draft: tuple[str | os.PathLike, int] | None, remote_free: int
) -> tuple[int, int | None]:
    """``n_gpu_layers`` for a target on RPC servers (``remote_free`` bytes) and this machine's GPUs, and for a draft
    on this machine's GPUs alone. llama.cpp splits the target's offloaded layers across its devices by their free
    memory, so the draft gets what this machine's share of the target leaves."""
    local = sum(d.free for d in gpu_devices())
    needs = offload_needs([target] + ([draft] if draft is not None else []))
    (n_target,) = plan_layers(local + remote_free, needs[:1]) if local + remote_free else (0,)
    if draft is None:
        return n_target, None
    if not local:
        return n_target, 0
    need = needs[0]
    on_devices = need.weights + need.kv_bytes if n_target == ALL_LAYERS else n_target * need.per_layer
    (n_draft,) = plan_layers(int(local - on_devices * local / (local + remote_free)), needs[1:])
    return n_target, n_draft


def default_threads() -> int:
    # llama.cpp's default is the number of physical cores; os.cpu_count() counts logical ones, and on most
    # machines with SMT the physical count is half.
    n = os.cpu_count() or 2
    return max(1, n // 2) if n > 4 else n
