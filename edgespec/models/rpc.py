"""Remote devices: a model's layers on other machines, through llama.cpp's RPC backend.

An ``rpc-server`` (``edgespec rpc-server`` on the other machine, or llama.cpp's ``ggml-rpc-server`` of the same
llama.cpp) offers its devices over TCP; here they join llama.cpp's device list as GPUs do, and a model placed on them
runs its layers there, one network round trip or so per decode whatever its width (docs/design.md, "RPC").

llama.cpp's RPC client has no error path: an unreachable server, a server of another protocol version, or one that
dies between two decodes ends in ``GGML_ABORT``, which kills the process. So:

- every server is *probed* first, in a child process (:func:`probe`), where an abort costs nothing but the child:
  an unreachable host or a mismatched server becomes a :class:`RemoteError` naming it, before this process
  connects;
- an abort that comes from the RPC client later (a server that died mid-request) goes to :func:`_on_abort`,
  which fails the decode waiting on it with a :class:`RemoteError`, marks the servers lost (every later decode of a
  model on them says it must be reloaded), and parks the aborting thread for good instead of returning into
  ``abort()``: the process and its local models live on.

A server that stops answering without closing its connection (a black-holed network) is not detected: llama.cpp's
client sets no socket timeouts, so the decode waits.

The protocol has no authentication: whoever reaches the port runs graphs on that machine. :func:`serve` binds
127.0.0.1 unless told otherwise, and says so loudly when it is.
"""

from __future__ import annotations

import ctypes
import json
import logging
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from edgespec.errors import InvalidParameterError, ModelError

log = logging.getLogger("edgespec.models.rpc")

DEFAULT_PORT = 50052  # llama.cpp's rpc-server's
PROBE_SECONDS = 30.0  # a probe's child connects, shakes hands and reads the memory: well under a second on a LAN
CONNECT_SECONDS = 5.0
RTT_SAMPLES = 9  # memory queries timed for the round trip (each is one request and its answer)


class RemoteError(ModelError):
    """An RPC server cannot be reached, speaks another protocol, or was lost."""


@dataclass(frozen=True)
class RemoteDevice:
    """A device an RPC server offers, as this process sees it."""

    endpoint: str  # host:port
    name: str  # llama.cpp's: RPC0, RPC1, ...
    description: str
    free: int  # bytes (a CPU server reports its RAM, all of it "free")
    total: int
    rtt: float | None = None  # seconds: the median round trip of a memory query, when measured


def parse_endpoints(spec: str | Iterable[str] | None) -> list[str]:
    """``HOST:PORT[,HOST:PORT...]`` (or a list of them) as endpoints; a bare HOST gets llama.cpp's default port."""
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    endpoints: list[str] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        host, sep, port_text = item.rpartition(":")
        if not sep:
            host, port_text = item, str(DEFAULT_PORT)
        if not host or ":" in host:
            # llama.cpp splits an endpoint at its first colon, so an IPv6 address cannot be given.
            raise InvalidParameterError(f"RPC server {item!r}: expected HOST:PORT (a host name or an IPv4 address)")
        try:
            port = int(port_text)
        except ValueError:
            port = -1
        if not 1 <= port <= 65535:
            raise InvalidParameterError(f"RPC server {item!r}: the port must be a number 1..65535")
        if f"{host}:{port}" not in endpoints:
            endpoints.append(f"{host}:{port}")
    return endpoints


def rpc_supported() -> bool:
    """Whether this llama-cpp-python build has the RPC backend (``make setup`` builds it in)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_rpc())


def _require_rpc() -> None:
    if not rpc_supported():
        raise RemoteError(
            "this llama-cpp-python build has no RPC backend: rebuild it with `make setup` (which builds it in, "
            "unless EDGESPEC_RPC=0), or with CMAKE_ARGS=-DGGML_RPC=ON"
        )


# ---------------------------------------------------------------------------------------------- probing


def probe(endpoint: str, timeout: float = PROBE_SECONDS) -> list[RemoteDevice]:
    """The devices the server at ``endpoint`` offers, with their memory and the round trip, asked by a child
    process (see the module doc). Raises :class:`RemoteError` naming the server when it cannot be used."""
    _require_rpc()
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=min(CONNECT_SECONDS, timeout)):
            pass
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        raise RemoteError(
            f"cannot reach the RPC server at {endpoint}: {reason} (is an rpc-server running there?)"
        ) from None
    try:
        child = subprocess.run(
            [sys.executable, "-m", "edgespec.models.rpc", endpoint],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(f"the RPC server at {endpoint} did not answer within {timeout:g} s") from None
    if child.returncode != 0:
        raise RemoteError(f"the RPC server at {endpoint} cannot be used: {_why(child.stderr)}")
    try:
        found = json.loads(child.stdout.strip().splitlines()[-1])
        return [RemoteDevice(endpoint, d["name"], d["description"], d["free"], d["total"], found["rtt"])
                for d in found["devices"]]  # fmt: skip
    except (ValueError, KeyError, IndexError, TypeError):
        raise RemoteError(f"the RPC server at {endpoint} gave an answer this build cannot read") from None


def _why(stderr: str) -> str:
    """The reason in a probe child's output: ggml's abort message, made plain where it is a known one."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    message = next((line for line in reversed(lines) if "ggml-rpc" in line or "error" in line.lower()), "")
    if "handshake" in message:
        return (
            "it speaks another RPC protocol version (a server must come from the same llama.cpp as this "
            "client: run `edgespec rpc-server` from the same edgespec install)"
        )
    if "connect" in message.lower():
        return "the connection failed"
    return message.partition(": ")[2] or message or (lines[-1] if lines else "the probe failed")


def _probe_here(endpoint: str) -> dict:
    """What the probe child does: connect, list the server's devices, time memory queries."""
    reg = _add_server(endpoint)
    devices, rtts = [], []
    for dev in _reg_devices(reg):
        free, total = _memory(dev)
        for _ in range(RTT_SAMPLES):
            t0 = time.perf_counter()
            _memory(dev)
            rtts.append(time.perf_counter() - t0)
        g = _ggml()
        devices.append({
            "name": g.ggml_backend_dev_name(dev).decode(errors="replace"),
            "description": (g.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
            "free": free,
            "total": total,
        })  # fmt: skip
    return {"devices": devices, "rtt": statistics.median(rtts) if rtts else None}


# ---------------------------------------------------------------------------------------------- this process


class _Attached:
    """The servers this process has connected to (llama.cpp keeps one connection per endpoint for the process's
    life), their devices, and whether one was lost."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.devices: dict[str, list[RemoteDevice]] = {}
        self.handles: dict[str, list[int]] = {}
        self.lost: RemoteError | None = None


_attached = _Attached()


def attach(endpoints: Sequence[str]) -> list[int]:
    """The device handles of the servers at ``endpoints`` (for ``llama_model_params.devices``), each probed and then
    connected once per process. Raises :class:`RemoteError` naming a server that cannot be used."""
    if not endpoints:
        return []  # nothing asked of the RPC backend: a build without it loads as before
    _require_rpc()
    with _attached.lock:
        if _attached.lost is not None:
            raise _attached.lost
        handles: list[int] = []
        for endpoint in endpoints:
            if endpoint not in _attached.handles:
                found = probe(endpoint)
                reg = _add_server(endpoint)
                _ggml().ggml_backend_register(reg)
                _attached.handles[endpoint] = _reg_devices(reg)
                _attached.devices[endpoint] = found
                _install_abort_hook()
            handles.extend(_attached.handles[endpoint])
        return handles


def attached(endpoints: Sequence[str]) -> list[RemoteDevice]:
    """The devices of the servers at ``endpoints``, as probed when each was attached (attaching it now if not yet:
    a load reads their memory before placing any layers, and a server is probed once)."""
    attach(endpoints)
    with _attached.lock:
        return [d for e in endpoints for d in _attached.devices[e]]


def model_devices(servers: Sequence[str]) -> list[int] | None:
    """The devices a model loads onto: the RPC servers' and this machine's GPUs for a model placed remotely, this
    machine's alone once the process has attached any server (llama.cpp's default list would put every model there),
    else None (llama.cpp's default)."""
    from edgespec.models.devices import local_gpu_handles

    remote = attach(servers) if servers else []
    if not remote and not any_attached():
        return None
    return remote + local_gpu_handles()


def any_attached() -> bool:
    return bool(_attached.handles)


def lost() -> bool:
    """Whether a server this process attached was lost (see :func:`_on_abort`)."""
    return _attached.lost is not None


def check_alive() -> None:
    """Raise the loss of a server, if one was lost: a model with layers there cannot decode again."""
    if _attached.lost is not None:
        raise _attached.lost


def is_remote(dev: int) -> bool:
    """Whether a ggml device handle is an RPC server's."""
    g = _ggml()
    reg = g.ggml_backend_dev_backend_reg(dev)
    return bool(reg) and g.ggml_backend_reg_name(reg) == b"RPC"


_abort_hook = None  # the ctypes callback, kept alive for the process's life


def _install_abort_hook() -> None:
    global _abort_hook
    if _abort_hook is None:
        _abort_hook = _ABORT_CALLBACK(_on_abort)
        set_callback = _ggml().ggml_set_abort_callback
        set_callback.restype, set_callback.argtypes = ctypes.c_void_p, [_ABORT_CALLBACK]
        set_callback(_abort_hook)


def _on_abort(message: bytes) -> None:
    """ggml is about to ``abort()``. From the RPC client, a server was lost: fail the decode that waits on it and
    park this thread for good (returning would abort the process). Any other abort goes on as ggml's own."""
    text = (message or b"").decode(errors="replace")
    if "ggml-rpc" not in text or not _attached.handles:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    dead = [e for e in _attached.handles if not _reachable(e)] or list(_attached.handles)
    error = RemoteError(
        f"lost the RPC server{'s' if len(dead) > 1 else ''} at {', '.join(dead)} ({text.partition(': ')[2]}): "
        "the model with layers there must be reloaded (in a new process: llama.cpp keeps its connection)"
    )
    _attached.lost = error
    log.error("%s", error)
    from edgespec.models.llama_thread import abandon

    abandon(error)
    threading.Event().wait()


def _reachable(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- the server


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host == "::1"


def local_server_devices() -> list[int]:
    """What ``edgespec rpc-server`` offers: this machine's GPUs, else its CPU."""
    from edgespec.models.llama_init import init_backend

    init_backend()
    g = _ggml()
    gpus = [g.ggml_backend_dev_get(i) for i in range(g.ggml_backend_dev_count())]
    gpus = [d for d in gpus if g.ggml_backend_dev_type(d) in (1, 2) and not is_remote(d)]  # GPU, iGPU
    return gpus or [g.ggml_backend_dev_by_type(0)]  # GGML_BACKEND_DEVICE_TYPE_CPU


def serve(host: str, port: int, threads: int, cache_dir: str | None = None) -> None:
    """Run an RPC server on ``host:port`` offering this machine's devices; blocks (in llama.cpp) for good."""
    _require_rpc()
    devices = local_server_devices()
    g = _ggml()
    start_addr = g.ggml_backend_reg_get_proc_address(_rpc_reg(), b"ggml_backend_rpc_start_server")
    start = _START_SERVER(start_addr)
    array = (ctypes.c_void_p * len(devices))(*devices)
    cache = cache_dir.encode() if cache_dir else None
    start(f"{host}:{port}".encode(), cache, threads, len(devices), array)
    # It returns only when it could not start (the reason is on stderr: a port in use, ...).
    raise RemoteError(f"the RPC server could not listen on {host}:{port} (llama.cpp's message above says why)")


# ---------------------------------------------------------------------------------------------- ggml's calls

_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_START_SERVER = ctypes.CFUNCTYPE(
    None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)
)
_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def _ggml():
    from edgespec.models.devices import libggml

    return libggml()


def _rpc_reg() -> int:
    from edgespec.models.llama_init import init_backend

    init_backend()
    reg = _ggml().ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise RemoteError("this llama.cpp build has no RPC backend")
    return reg


def _add_server(endpoint: str) -> int:
    """llama.cpp's client for ``endpoint`` (connects and shakes hands: aborts the process when that fails)."""
    add = _ADD_SERVER(_ggml().ggml_backend_reg_get_proc_address(_rpc_reg(), b"ggml_backend_rpc_add_server"))
    return add(endpoint.encode())


def _reg_devices(reg: int) -> list[int]:
    g = _ggml()
    return [g.ggml_backend_reg_dev_get(reg, i) for i in range(g.ggml_backend_reg_dev_count(reg))]


def _memory(dev: int) -> tuple[int, int]:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _ggml().ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


if __name__ == "__main__":  # the probe's child: python -m edgespec.models.rpc HOST:PORT
    print(json.dumps(_probe_here(sys.argv[1])))
