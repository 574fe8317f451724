"""`edgespec doctor`: what this machine and this install give edgespec, in one report.

The llama.cpp build (version, the backends compiled in, the devices and their free memory), the build `make setup`
would choose here, the offload plan `-ngl auto` makes for the default pair, the thread count, and the decode costs
the controller has measured and cached on this machine, and with ``--rpc`` the devices of RPC servers with their
memory and round trip. Nothing is downloaded and no weights are loaded (the plan reads each model's shape from its
header). Each section that cannot be gathered says why in a sentence; the rest of the report still prints.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import click

GB = 1 << 30


def _section(gather: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """One section's facts, or ``{"error": sentence}``: a report about a broken install must not crash on it."""
    try:
        return gather(*args)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a sentence in the report
        return {"error": _sentence(exc)}


def _sentence(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if isinstance(exc, click.ClickException) else f"{text} ({type(exc).__name__})"


class Problem(click.ClickException):
    """A section that cannot be gathered, in words for the user (no exception type appended)."""


_load_problem: str | None = None  # why llama.cpp did not load, once a section found out (per report)


def _import_backend():
    global _load_problem
    import importlib

    if _load_problem is not None:  # said once, in the first section that needed it
        raise Problem("needs llama-cpp-python, which does not load here (the llama.cpp build section says why)")
    try:
        return importlib.import_module("edgespec.models.backend")  # imports llama_cpp, which may be absent
    except ImportError as exc:
        _load_problem = f"llama-cpp-python is not installed ({exc}); `make setup` builds and installs it"
    except (OSError, RuntimeError) as exc:
        _load_problem = (
            f"llama-cpp-python is installed but its libraries do not load ({str(exc).strip().splitlines()[0]}); a GPU "
            "build needs its driver: `EDGESPEC_BACKEND=cpu make setup` installs the CPU build"
        )
    raise Problem(_load_problem)


def build_section() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    backend = _import_backend()
    try:
        package = version("llama-cpp-python")
    except PackageNotFoundError:
        package = "unknown"
    devices = backend.backend_devices()
    from edgespec.models.rpc import rpc_supported

    return {
        "llama_cpp_python": package,
        "gpu_offload": backend.gpu_offload_supported(),
        "rpc": rpc_supported(),
        "backends": backend.backend_names(),
        "devices": [
            {"name": d.name, "kind": d.kind, "description": d.description, "free_bytes": d.free, "total_bytes": d.total}
            for d in devices
        ],
        "system_info": backend.system_info(),
    }


def setup_section(build: dict[str, Any]) -> dict[str, Any]:
    """The build `make setup` would choose here, and whether the installed one is it."""
    from edgespec import buildenv

    choice = buildenv.choose()
    out: dict[str, Any] = {"backend": choice.backend, "cmake_args": choice.cmake_args, "line": choice.line}
    offload = build.get("gpu_offload")
    if offload is False and choice.backend in ("cuda", "metal", "vulkan"):
        out["advice"] = (
            f"this machine can use {choice.backend}, but the installed llama-cpp-python is CPU-only: "
            "`rm .venv/.installed && make setup` rebuilds it"
        )
    elif "AMX_INT8 = 1" in str(build.get("system_info", "")):
        out["advice"] = (
            "the installed llama-cpp-python has llama.cpp's AMX kernels, which crash on batches of K-quant weights: "
            "edgespec loads weights without repacking around them (slower); `rm .venv/.installed && make setup` "
            "builds it without them"
        )
    return out


def offload_section(n_ctx: int) -> dict[str, Any]:
    """The plan `-ngl auto` makes for the registry's default pair, from the files' headers (no weights loaded)."""
    from edgespec.models.fetch import cached_path
    from edgespec.models.offload import RESERVE_BYTES, describe, plan_layers
    from edgespec.models.registry import load_registry

    registry = load_registry()
    pair = registry.default_pair()
    specs = [registry.model(pair.target), registry.model(pair.draft)]
    paths = [cached_path(spec) for spec in specs]
    missing = [spec.name for spec, path in zip(specs, paths, strict=True) if path is None]
    if missing:
        raise Problem(
            f"the default pair '{pair.name}' is not downloaded yet ({', '.join(missing)} missing): "
            f"`edgespec models pull {pair.name}` or `make models` fetches it"
        )
    backend = _import_backend()
    needs = backend.offload_needs([(path, n_ctx) for path in paths])
    gpus = backend.gpu_devices()
    free = sum(d.free for d in gpus)
    plan = plan_layers(free, needs) if gpus else [0] * len(needs)
    models = []
    for role, spec, path, need, layers in zip(("target", "draft"), specs, paths, needs, plan, strict=True):
        models.append(
            {
                "role": role,
                "name": spec.name,
                "file": str(path),
                "weights_bytes": need.weights,
                "n_layer": need.n_layer,
                "kv_bytes": need.kv_bytes,
                "n_gpu_layers": layers,
                "placement": describe(layers, need.n_layer, gpus[0].name if gpus else None),
            }
        )
    whole = sum(n.weights + n.kv_bytes for n in needs)
    return {
        "pair": pair.name,
        "n_ctx": n_ctx,
        "gpu_free_bytes": free,
        "reserve_bytes": RESERVE_BYTES if gpus else 0,
        "fits_whole": bool(gpus) and whole + RESERVE_BYTES <= free,
        "models": models,
    }


def threads_section() -> dict[str, Any]:
    backend = _import_backend()
    return {"default": backend.default_threads(), "logical_cpus": os.cpu_count()}


def costs_section(now: float | None = None) -> dict[str, Any]:
    """The decode costs cached for this machine, per setup, with their age."""
    from edgespec.calibrate import CostCache, key_models, machine_key
    from edgespec.paths import cost_cache_path

    cache = CostCache(cost_cache_path())
    entries = cache.entries(machine_key() + " ")
    if cache.problem is not None:
        raise Problem(f"the cost cache {cache.path} {cache.problem}; the next run measures the costs again")
    now = time.time() if now is None else now
    try:
        written = cache.path.stat().st_mtime
    except OSError:
        written = None
    out = []
    for entry in entries:
        measured = entry.measured_at if entry.measured_at is not None else written
        out.append(
            {
                "models": key_models(entry.key),
                "setup": entry.key[entry.key.find(" max_gamma=") + 1 :] if " max_gamma=" in entry.key else "",
                "verify_ms": {str(b): round(s * 1e3, 3) for b, s in sorted(entry.costs.verify.items())},
                "draft_ms": {d: round(s * 1e3, 3) for d, s in entry.costs.draft.items()},
                "measured_at": measured,
                "age_s": None if measured is None else round(now - measured, 1),
                "age_exact": entry.measured_at is not None,
            }
        )
    return {"path": str(cache.path), "entries": out}


def remote_section(endpoints: list[str]) -> dict[str, Any]:
    """Each RPC server's devices, memory and round trip, probed as a load would probe it; one that cannot be used
    says why, beside the others."""
    _import_backend()
    from edgespec.models.rpc import RemoteError, probe

    servers = []
    for endpoint in endpoints:
        try:
            found = probe(endpoint)
        except RemoteError as exc:
            servers.append({"endpoint": endpoint, "error": str(exc)})
            continue
        servers.append({
            "endpoint": endpoint,
            "rtt_ms": None if not found or found[0].rtt is None else round(found[0].rtt * 1e3, 3),
            "devices": [{"name": d.name, "description": d.description, "free_bytes": d.free, "total_bytes": d.total}
                        for d in found],
        })  # fmt: skip
    return {"servers": servers}


def gather(n_ctx: int = 4096, rpc: list[str] | None = None) -> dict[str, Any]:
    global _load_problem
    _load_problem = None
    build = _section(build_section)
    report = {
        "build": build,
        "setup": _section(setup_section, build),
        "offload": _section(offload_section, n_ctx),
        "threads": _section(threads_section),
        "costs": _section(costs_section),
    }
    if rpc:
        report["remote"] = _section(remote_section, rpc)
    return report


# ---------------------------------------------------------------------------------------------- text


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GiB"


def _age(seconds: float) -> str:
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            n = seconds / size
            return f"{n:.0f} {unit}{'s' if unit == 'day' and n >= 1.5 else ''} ago"
    return "just now"


def render(report: dict[str, Any]) -> list[str]:
    lines: list[str] = []

    def head(title: str, section: dict[str, Any]) -> bool:
        lines.append(title)
        if "error" in section:
            lines.append(f"  {section['error']}")
            return False
        return True

    build = report["build"]
    if head("llama.cpp build", build):
        offload = "yes" if build["gpu_offload"] else "no (a CPU-only build)"
        rpc = "yes" if build["rpc"] else "no (rebuild with `make setup` for --rpc)"
        lines.append(f"  llama-cpp-python {build['llama_cpp_python']}; GPU offload: {offload}; RPC: {rpc}")
        lines.append(f"  backends compiled in: {', '.join(build['backends']) or 'none'}")
        for d in build["devices"]:
            about = ", ".join(x for x in (d["description"], d["kind"]) if x and x != d["name"])
            lines.append(f"  device {d['name']} ({about}): {_gb(d['free_bytes'])} free of {_gb(d['total_bytes'])}")
        lines.append(f"  {build['system_info']}")
    setup = report["setup"]
    if head("make setup would build", setup):
        lines.append(f"  {setup['line']}")
        if "advice" in setup:
            lines.append(f"  note: {setup['advice']}")
    plan = report["offload"]
    if head("offload plan (-ngl auto)", plan):
        where = f"{_gb(plan['gpu_free_bytes'])} free on the GPU" if plan["gpu_free_bytes"] else "no GPU to offload to"
        lines.append(f"  pair {plan['pair']}, context {plan['n_ctx']} tokens, {where}")
        for m in plan["models"]:
            layers = "all" if m["n_gpu_layers"] < 0 else m["n_gpu_layers"]
            lines.append(
                f"  {m['role']} {m['name']}: {m['n_layer']} layers, weights {_gb(m['weights_bytes'])}, "
                f"KV {_gb(m['kv_bytes'])} -> -ngl {layers}: {m['placement']}"
            )
        if plan["gpu_free_bytes"]:
            lines.append(f"  both fit whole: {'yes' if plan['fits_whole'] else 'no'}")
    threads = report["threads"]
    if head("threads", threads):
        lines.append(f"  {threads['default']} by default (of {threads['logical_cpus']} logical CPUs); -t sets it")
    costs = report["costs"]
    if head("measured costs (cached for this machine, this boot)", costs):
        if not costs["entries"]:
            lines.append(
                f"  none yet in {costs['path']}: the first auto generation of each boot measures them "
                "(8 s for a 1.5B model on a 2-core CPU)"
            )
        for e in costs["entries"]:
            names = " + ".join(f"{m['file']} (threads {m['threads']}, ngl {m['n_gpu_layers']})" for m in e["models"])
            age = "age unknown" if e["age_s"] is None else _age(e["age_s"])
            # Without its own time, an entry is as old as the file's last write at least.
            age = age if e["age_exact"] or e["age_s"] is None else f"at least {age.replace(' ago', '')} ago"
            verify = ", ".join(f"{b}: {ms:.1f}" for b, ms in e["verify_ms"].items())
            draft = ", ".join(f"{d} {ms:.1f} ms" for d, ms in e["draft_ms"].items()) or "none"
            lines.append(f"  {names or 'a setup'} ({e['setup']}), measured {age}")
            lines.append(f"    verify ms by tokens: {verify}")
            lines.append(f"    draft step: {draft}")
    remote = report.get("remote")
    if remote is not None and head("RPC servers (--rpc)", remote):
        for server in remote["servers"]:
            if "error" in server:
                lines.append(f"  {server['endpoint']}: {server['error']}")
                continue
            rtt = "" if server["rtt_ms"] is None else f", round trip {server['rtt_ms']:.2f} ms"
            lines.append(f"  {server['endpoint']}: {len(server['devices'])} device(s){rtt}")
            for d in server["devices"]:
                lines.append(f"    {d['name']} ({d['description']}): {_gb(d['free_bytes'])} free of "
                             f"{_gb(d['total_bytes'])}")  # fmt: skip
    return lines


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of the report.")
@click.option(
    "--n-ctx", default=4096, show_default=True, type=click.IntRange(min=16), help="Context the offload plan is for."
)
@click.option(
    "--rpc",
    metavar="HOST:PORT[,...]",
    default=None,
    help="Also probe these RPC servers (`edgespec rpc-server`): their devices, memory and round trip.",
)
def doctor(as_json: bool, n_ctx: int, rpc: str | None) -> None:
    """What edgespec can use here: the llama.cpp build and its devices, the build `make setup` would choose, the
    offload plan for the default pair, threads, and the costs measured on this machine; with --rpc, the RPC
    servers' devices. Downloads and loads nothing.
    """
    from edgespec.cli.common import fail
    from edgespec.errors import InvalidParameterError
    from edgespec.models.rpc import parse_endpoints

    try:
        endpoints = parse_endpoints(rpc)
    except InvalidParameterError as exc:
        fail(str(exc))
    report = gather(n_ctx, endpoints)
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        click.echo("\n".join(render(report)))
