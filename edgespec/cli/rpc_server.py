"""`edgespec rpc-server`: offer this machine's GPUs (or its CPU) to another machine's edgespec over llama.cpp's RPC
protocol, so that a model too big for one machine runs its layers on both (`--rpc` there)."""

from __future__ import annotations

import sys
import threading

import click

from edgespec.cli.common import fail, user_errors
from edgespec.models.rpc import DEFAULT_PORT, is_loopback

EXPOSED_WARNING = (
    "WARNING: the RPC server listens on {host}:{port}. llama.cpp's RPC protocol has no authentication and no "
    "encryption: anyone who can reach this port can run computations on this machine and read what it holds. "
    "Use it only on a network you trust, or keep 127.0.0.1 and tunnel to it (ssh -L {port}:127.0.0.1:{port} ...)."
)


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535))
@click.option(
    "--threads",
    "-t",
    type=click.IntRange(min=1),
    default=None,
    help="CPU threads for a CPU server (default: physical cores; more than the cores left free slows it badly).",
)
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="A folder where the server keeps the weights it is sent (by hash), so a model reloads without crossing "
    "the network again.",
)
@click.option(
    "--expose",
    is_flag=True,
    help="Allow a --host other than the loopback. The protocol is unauthenticated: see the warning it prints.",
)
def rpc_server(host: str, port: int, threads: int | None, cache_dir: str | None, expose: bool) -> None:
    """Serve this machine's devices to edgespec (or llama.cpp) elsewhere: `--rpc HOST:PORT` on the other side.

    It offers the GPUs llama.cpp finds here, or the CPU where there is none, and serves one client at a time. The
    client and the server must come from the same llama.cpp (the same edgespec install): the protocol is
    versioned and a mismatch is refused. Listens on 127.0.0.1 unless --expose is given with another --host.

    \b
    Machine B:  edgespec rpc-server --host 192.168.1.20 --expose
    Machine A:  edgespec chat --rpc 192.168.1.20:50052
    """
    from edgespec.models.devices import default_threads
    from edgespec.models.rpc import serve

    if not is_loopback(host):
        if not expose:
            fail(f"--host {host} would let anyone who reaches it use this machine: add --expose to mean it")
        click.echo(EXPOSED_WARNING.format(host=host, port=port), err=True)
    with user_errors():
        # llama.cpp's server loop never returns; on its own thread, Ctrl+C still reaches this one.
        failed: list[BaseException] = []

        def run() -> None:
            try:
                serve(host, port, threads or default_threads(), cache_dir)
            except BaseException as error:  # noqa: BLE001  # handed to the main thread
                failed.append(error)

        worker = threading.Thread(target=run, name="rpc-server", daemon=True)
        worker.start()
        try:
            while worker.is_alive():
                worker.join(0.5)
        except KeyboardInterrupt:
            sys.exit(0)
        if failed:
            raise failed[0]
