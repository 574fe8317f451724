"""A model's layers on another machine's RPC server (here: `edgespec rpc-server` on 127.0.0.1, started per test).

llama.cpp's RPC client aborts the process on a lost server and keeps its connections for the process's life, so
every load that attaches a server runs in a child process; this one only starts servers and reads the children.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.errors import InvalidParameterError
from edgespec.models import rpc

SERVER_START_S = 60.0  # bounded wait for a server's port to open (it is up in well under a second here)
CHILD_S = 300.0


@pytest.fixture(scope="module", autouse=True)
def _rpc_build() -> None:
    if not rpc.rpc_supported():
        message = "this llama-cpp-python build has no RPC backend (`make setup` builds it in unless EDGESPEC_RPC=0)"
        if os.environ.get("CI"):  # in CI a failure, never a skip: `make setup` builds it in there
            pytest.fail(message)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, what: str) -> None:
    """Until ``proc`` accepts on the loopback ``port``, bounded by SERVER_START_S."""
    deadline = time.monotonic() + SERVER_START_S
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        assert proc.poll() is None, f"{what} exited: {proc.stdout.read() if proc.stdout else ''}"
        assert time.monotonic() < deadline, f"{what} did not open its port"
        time.sleep(0.05)


@contextlib.contextmanager
def rpc_server(*extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`edgespec rpc-server` on a free loopback port, one thread; killed on the way out."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "rpc-server", "--port", str(port), "-t", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait_for_port(port, proc, "the RPC server")
        yield f"127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=CHILD_S
    )


# ---------------------------------------------------------------------------------------------- endpoints


@pytest.mark.parametrize(
    ("spec", "endpoints"),
    [(None, []), ("10.0.0.2", ["10.0.0.2:50052"]), ("a:1, b:2,,a:1", ["a:1", "b:2"]), (["h:9"], ["h:9"])],
)
def test_endpoints_are_host_port_with_llama_cpps_default_port(spec, endpoints: list[str]) -> None:
    assert rpc.parse_endpoints(spec) == endpoints


@pytest.mark.parametrize("spec", ["h:0", "h:65536", "h:x", ":80", "::1:50052", "fe80::1"])
def test_bad_endpoints_are_refused_with_what_to_write(spec: str) -> None:
    with pytest.raises(InvalidParameterError, match="RPC server"):
        rpc.parse_endpoints(spec)


def test_an_unreachable_server_is_an_error_naming_it() -> None:
    port = _free_port()  # nothing listens there
    with pytest.raises(rpc.RemoteError, match=rf"cannot reach the RPC server at 127.0.0.1:{port}: .*rpc-server"):
        rpc.probe(f"127.0.0.1:{port}")


def test_something_else_on_the_port_is_refused_by_the_probe_not_the_process() -> None:
    # llama.cpp's client aborts on a failed handshake: the probe's child takes that, this process lives on.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def hang_up() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")
                conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        with pytest.raises(rpc.RemoteError, match=rf"the RPC server at 127.0.0.1:{port} cannot be used"):
            rpc.probe(f"127.0.0.1:{port}", timeout=60)
    finally:
        listener.close()


# ---------------------------------------------------------------------------------------------- the server


def test_the_server_refuses_another_host_than_the_loopback_unless_exposed() -> None:
    result = CliRunner().invoke(main, ["rpc-server", "--host", "0.0.0.0"])
    assert result.exit_code == 1 and "--expose" in result.output


def test_the_server_warns_when_exposed_and_says_when_it_cannot_listen() -> None:
    with rpc_server() as (endpoint, _):
        port = endpoint.rpartition(":")[2]
        second = subprocess.run(
            [sys.executable, "-m", "edgespec", "rpc-server", "--host", "0.0.0.0", "--expose", "--port", port],
            capture_output=True, text=True, timeout=CHILD_S,
        )  # fmt: skip
    assert "no authentication" in second.stderr
    assert second.returncode == 1 and f"could not listen on 0.0.0.0:{port}" in second.stderr


def test_doctor_lists_a_servers_devices_and_round_trip_and_says_why_one_cannot_be_used() -> None:
    dead = f"127.0.0.1:{_free_port()}"
    with rpc_server() as (endpoint, _):
        report = json.loads(CliRunner().invoke(main, ["doctor", "--json", "--rpc", f"{endpoint},{dead}"]).output)
        text = CliRunner().invoke(main, ["doctor", "--rpc", endpoint]).output
    alive, unreachable = report["remote"]["servers"]
    assert alive["endpoint"] == endpoint and alive["rtt_ms"] > 0
    (device,) = alive["devices"]
    assert device["name"].startswith("RPC") and device["total_bytes"] > 0
    assert unreachable == {"endpoint": dead, "error": unreachable["error"]}
    assert "cannot reach" in unreachable["error"]
    assert report["build"]["rpc"] is True
    assert f"{endpoint}: 1 device(s), round trip" in text


def test_a_build_without_rpc_asks_nothing_of_it_until_servers_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rpc, "rpc_supported", lambda: False)
    assert rpc.attach([]) == [] and rpc.attached([]) == []  # a load without --rpc, as on any build
    with pytest.raises(rpc.RemoteError, match="no RPC backend"):
        rpc.attach(["127.0.0.1:1"])


def test_rpc_draft_needs_servers() -> None:
    result = CliRunner().invoke(main, ["generate", "hi", "--rpc-draft", "-d", "none"])
    assert result.exit_code != 0 and "name them with rpc" in result.output


# ---------------------------------------------------------------------------------------------- models on it

GREEDY = """
import json, sys
from edgespec import SamplingParams
from edgespec.api import load
rpc = sys.argv[2] or None
with load(sys.argv[1], n_ctx=256, n_threads=1, rpc=rpc) as rt:
    out = rt.generate("The capital of France is", SamplingParams(max_tokens=24, temperature=0.0))
    print(json.dumps({"text": out.text, "placement": rt.target.placement, "on_gpu": rt.target.on_gpu}))
"""


def test_a_model_on_an_rpc_server_writes_what_it_writes_here(tiny_model_path: Path) -> None:
    here = _child(GREEDY, str(tiny_model_path), "")
    with rpc_server() as (endpoint, _):
        there = _child(GREEDY, str(tiny_model_path), endpoint)
    assert here.returncode == 0, here.stderr
    assert there.returncode == 0, there.stderr
    local, remote = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (here, there))
    assert remote["text"] == local["text"] and remote["text"].strip()
    assert local["placement"] == "CPU"
    assert remote["placement"].startswith(f"RPC server ({endpoint}, all ") and remote["on_gpu"]


READOUTS = """
import json, sys
from edgespec.models.backend import Model
from edgespec.sampling import ARGMAX, Readout
model = Model(sys.argv[1], n_ctx=256, n_gpu_layers=-1, n_threads=1, rpc=[sys.argv[2]])
chosen, path = model.whole_rows, model.readout_path(ARGMAX)
tokens = list(range(100, 108))
out = {}
for whole in (True, False):
    model.whole_rows = whole
    argmax = model.decode(tokens, range(8), ARGMAX)
    top = model.decode([7], [0], Readout("top_k", k=5))  # the same candidates, in any order
    out[whole] = [argmax, sorted(zip(top.ids[0], top.logits[0]))]
    model.truncate(0)
print(json.dumps({"whole_rows": chosen, "path": path, "same": out[True] == out[False]}))
"""


@contextlib.contextmanager
def delayed(endpoint: str, one_way_ms: float) -> Iterator[str]:
    """The benchmarks' latency proxy in front of ``endpoint``."""
    port = _free_port()
    proxy = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("delay_proxy.py")), "--listen", f"127.0.0.1:{port}",
         "--to", endpoint, "--delay-ms", str(one_way_ms)],
    )  # fmt: skip
    try:
        _wait_for_port(port, proxy, "the proxy")
        yield f"127.0.0.1:{port}"
    finally:
        proxy.kill()
        proxy.wait(timeout=30)


def test_over_a_slow_link_rows_come_back_whole_and_select_the_same_tokens(tiny_model_path: Path) -> None:
    # llama.cpp's in-graph readout fetches each row from the server on its own: 8 rows, 8 round trips of 40 ms,
    # where whole rows take one transfer. The load times both and keeps the cheaper.
    with rpc_server() as (endpoint, _), delayed(endpoint, one_way_ms=20) as slow:
        proc = _child(READOUTS, str(tiny_model_path), slow)
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["whole_rows"] and "faster than argmax in llama.cpp's graph over RPC" in found["path"]
    assert found["same"]


def test_generate_through_the_cli_names_an_unreachable_server(tiny_model_path: Path) -> None:
    dead = f"127.0.0.1:{_free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "edgespec", "generate", "hi", "-m", str(tiny_model_path), "-d", "none", "--rpc", dead],
        capture_output=True, text=True, timeout=CHILD_S,
    )  # fmt: skip
    assert proc.returncode == 1 and f"error: cannot reach the RPC server at {dead}" in proc.stderr


LOSE_IT = """
import sys
from edgespec import SamplingParams
from edgespec.api import load
from edgespec.models.rpc import RemoteError
path, endpoint = sys.argv[1], sys.argv[2]
local = load(path, n_ctx=256, n_threads=1)
remote = load(path, n_ctx=256, n_threads=1, rpc=endpoint)
print("loaded", flush=True)
sys.stdin.readline()  # the test kills the server, then says go
errors = []
for _ in range(2):  # the decode that meets the dead server, then one after it
    try:
        remote.generate("Once upon a time", SamplingParams(max_tokens=64, temperature=0.0))
    except RemoteError as error:
        errors.append(str(error))
print("errors", len(errors), errors[0] if errors else "", flush=True)
after = local.generate("Once upon a time", SamplingParams(max_tokens=8, temperature=0.0))
print("local", after.text.strip() != "", flush=True)
remote.close()
local.close()
"""


def test_a_server_lost_mid_run_fails_its_requests_and_the_process_lives_on(tiny_model_path: Path) -> None:
    with rpc_server() as (endpoint, server):
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(LOSE_IT), str(tiny_model_path), endpoint],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "loaded", child.communicate(timeout=CHILD_S)[1]
        server.kill()
        server.wait(timeout=30)
        out, err = child.communicate("go\n", timeout=CHILD_S)
    assert child.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("errors 2 lost the RPC server at " + endpoint), out
    assert "must be reloaded" in lines[0]
    assert lines[1] == "local True"
