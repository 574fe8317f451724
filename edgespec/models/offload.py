"""How many layers of each model to put on the GPU when the user did not say: as many as fit.

llama.cpp's own default is now ``-ngl auto``: offload what fits the device's free memory. Its fitting code lives in
its ``common`` library, which llama-cpp-python does not ship, so this is a smaller version of the same idea, from
numbers that are known before any weights load: the file size (≈ the weights), the layer count, and the KV cache a
context of ``n_ctx`` tokens needs. Models are placed in order (the target first: it is the one every round waits
for), each taking what it needs from what is left. Pure arithmetic: the backend supplies the numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# Kept free on the device for llama.cpp's compute buffers, the output buffer and the driver's own context.
RESERVE_BYTES = 768 << 20
ALL_LAYERS = -1


@dataclass(frozen=True)
class Need:
    """What one model would take on the GPU."""

    weights: int  # bytes: the GGUF file size
    n_layer: int  # repeating blocks; llama.cpp counts the output layer as one more
    kv_bytes: int  # the KV cache for the context it will run with

    @property
    def per_layer(self) -> float:
        return (self.weights + self.kv_bytes) / (self.n_layer + 1)


def plan_layers(free_bytes: int, needs: list[Need]) -> list[int]:
    """``n_gpu_layers`` for each model: -1 (all) when it fits whole in what is left, else the layers that do fit
    (0 when none). The reserve is kept once, for the whole device."""
    budget = free_bytes - RESERVE_BYTES
    plan = []
    for need in needs:
        whole = need.weights + need.kv_bytes
        if whole <= budget:
            plan.append(ALL_LAYERS)
            budget -= whole
            continue
        layers = max(0, int(budget // need.per_layer)) if budget > 0 else 0
        plan.append(min(layers, need.n_layer))
        budget -= layers * need.per_layer
    return plan


def describe(n_gpu_layers: int, n_layer: int, device: str | None, kind: str = "GPU") -> str:
    """Where a loaded model runs, for the load line, the TUI status line and the JSON stats (``kind``: "GPU", or
    "RPC server" with the servers as ``device``)."""
    if device is None or n_gpu_layers == 0:
        return "CPU"
    on_gpu = n_layer + 1 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer + 1)
    if on_gpu >= n_layer + 1:
        return f"{kind} ({device}, all {n_layer} layers)"
    return f"{kind} ({device}, {on_gpu} of {n_layer + 1} layers) + CPU"


def available_memory() -> int | None:
    """Bytes of RAM the system could give a new allocation now (Linux's MemAvailable; None where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def parallel_that_fits(wanted: int, kv_bytes_per_sequence: int, free_bytes: int | None) -> tuple[int, str | None]:
    """How many sequences of ``kv_bytes_per_sequence`` to allocate, at most ``wanted``: what fits half of
    ``free_bytes`` (the rest is the weights' and the compute buffers'), at least one. Returns it and, when it is
    fewer than wanted, why."""
    if free_bytes is None or kv_bytes_per_sequence <= 0:
        return wanted, None
    fits = max(1, (free_bytes // 2) // kv_bytes_per_sequence)
    if fits >= wanted:
        return wanted, None
    gib = 1024**3
    return fits, (
        f"serving {fits} request(s) at once, not {wanted}: each needs {kv_bytes_per_sequence / gib:.2f} GiB of KV "
        f"cache at this context size and {free_bytes / gib:.1f} GiB is free (lower --n-ctx to serve more)"
    )
