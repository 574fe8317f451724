"""-ngl auto: how many layers of each model go to the GPU, from free memory and what each model needs."""

from __future__ import annotations

import pytest

from edgespec.models import devices as machine
from edgespec.models.offload import ALL_LAYERS, RESERVE_BYTES, Need, describe, plan_layers

GB = 1 << 30


def test_models_that_fit_go_whole_the_target_first() -> None:
    target, draft = Need(4 * GB, 28, GB // 2), Need(GB, 24, GB // 4)
    assert plan_layers(16 * GB, [target, draft]) == [ALL_LAYERS, ALL_LAYERS]
    # room for the target only: the draft gets the layers that fit in what is left
    free = RESERVE_BYTES + target.weights + target.kv_bytes + int(10.5 * draft.per_layer)
    assert plan_layers(free, [target, draft]) == [ALL_LAYERS, 10]


def test_a_target_too_big_gets_the_layers_that_fit_and_the_draft_what_remains() -> None:
    target, draft = Need(20 * GB, 40, 2 * GB), Need(GB, 24, GB // 4)
    layers = plan_layers(8 * GB, [target, draft])
    assert 0 < layers[0] < 40 and layers[0] == int((8 * GB - RESERVE_BYTES) // target.per_layer)
    left = 8 * GB - RESERVE_BYTES - layers[0] * target.per_layer  # less than one of the target's layers
    assert layers[1] == int(left // draft.per_layer) < 24


def test_no_memory_means_the_cpu() -> None:
    assert plan_layers(RESERVE_BYTES // 2, [Need(GB, 24, 0)]) == [0]


def test_placement_is_said_in_words() -> None:
    assert describe(0, 28, "CUDA0") == "CPU"
    assert describe(-1, 28, None) == "CPU"  # asked for layers, but the build has no GPU
    assert describe(-1, 28, "CUDA0") == "GPU (CUDA0, all 28 layers)"
    assert describe(12, 28, "CUDA0") == "GPU (CUDA0, 12 of 29 layers) + CPU"


@pytest.mark.real
def test_auto_follows_what_this_build_has(tiny_model_path) -> None:
    """Asked of the backend, not assumed: a CPU-only build has no device and auto plans nothing; a GPU build puts
    the 98 MB model whole on the GPU (when it has that much free)."""
    devices = machine.gpu_devices()
    if not machine.gpu_offload_supported():
        assert devices == []
    layers = machine.auto_gpu_layers([(tiny_model_path, 4096)])
    if not devices:
        assert layers == [0]
        return
    shape = machine.model_shape(tiny_model_path)
    need = Need(tiny_model_path.stat().st_size, shape.n_layer, shape.kv_bytes_per_token * 4096)
    free = sum(d.free for d in devices)
    if free >= RESERVE_BYTES + 2 * (need.weights + need.kv_bytes):  # room to spare, even if memory moves a little
        assert layers == [ALL_LAYERS]
    else:  # a nearly full GPU: what the plan gives for the free memory read a moment ago
        assert layers == plan_layers(free, [need])


@pytest.mark.real
def test_auto_plans_from_the_devices_free_memory(tiny_model_path, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = machine.model_shape(tiny_model_path)  # read by llama.cpp without loading weights
    assert shape.n_layer == 30 and shape.kv_bytes_per_token > 0
    monkeypatch.setattr(machine, "gpu_devices", lambda: [machine.Device("GPU0", 8 * GB, 8 * GB)])
    assert machine.auto_gpu_layers([(tiny_model_path, 4096), (tiny_model_path, 4096)]) == [-1, -1]
    tight = RESERVE_BYTES + tiny_model_path.stat().st_size // 2
    monkeypatch.setattr(machine, "gpu_devices", lambda: [machine.Device("GPU0", tight, 8 * GB)])
    target, draft = machine.auto_gpu_layers([(tiny_model_path, 4096), (tiny_model_path, 4096)])
    assert 0 < target < 30 and draft == 0


@pytest.mark.real
def test_rpc_servers_memory_counts_where_there_is_no_gpu(tiny_model_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "gpu_devices", lambda: [])  # a CPU machine: only the servers' memory
    assert machine.auto_gpu_layers([(tiny_model_path, 4096)]) == [0]
    assert machine.auto_gpu_layers([(tiny_model_path, 4096)], extra_free=8 * GB) == [-1]
    tight = RESERVE_BYTES + tiny_model_path.stat().st_size // 2
    (layers,) = machine.auto_gpu_layers([(tiny_model_path, 4096)], extra_free=tight)
    assert 0 < layers < 30


@pytest.mark.real
def test_a_draft_beside_servers_gets_what_the_targets_share_here_leaves(
    tiny_model_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = machine.offload_needs([(tiny_model_path, 4096)])[0]
    size = whole.weights + whole.kv_bytes
    pair = ((tiny_model_path, 4096), (tiny_model_path, 4096))
    monkeypatch.setattr(machine, "gpu_devices", lambda: [])
    assert machine.auto_layers_beside_servers(*pair, remote_free=8 * GB) == (-1, 0)  # no GPU here: the draft on the CPU
    assert machine.auto_layers_beside_servers(pair[0], None, remote_free=8 * GB) == (-1, None)
    # Room here for the draft and for the target's share, half its size (the servers have as much free as here).
    here = RESERVE_BYTES + size // 2 + size + (1 << 20)
    monkeypatch.setattr(machine, "gpu_devices", lambda: [machine.Device("GPU0", here, 8 * GB)])
    assert machine.auto_layers_beside_servers(*pair, remote_free=here) == (-1, -1)
    # The same GPU with servers offering next to nothing: the target's share here is nearly all of it.
    _, draft = machine.auto_layers_beside_servers(*pair, remote_free=1 << 20)
    assert 0 < draft < 30  # not all of it: the target took its share here first
