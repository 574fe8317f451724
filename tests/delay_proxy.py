"""A TCP proxy that adds a fixed one-way delay in each direction: a network's latency on loopback, where the kernel
has no ``netem``. For benchmarks of a target on an RPC server at a round-trip time of your choosing:

    edgespec rpc-server --port 50700 -t 1 &
    python tests/delay_proxy.py --listen 127.0.0.1:50701 --to 127.0.0.1:50700 --delay-ms 2.5 &   # 5 ms RTT
    edgespec bench --rpc 127.0.0.1:50701 ...

Each chunk read is written out ``delay`` seconds after it arrived, in order, so the link keeps its throughput and
gains latency only (a pipe, not a throttle). Nagle's algorithm is off on both sides, as llama.cpp's RPC client
sets it, so small messages are not held back.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time

CHUNK = 1 << 20


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((time.monotonic() + delay, data))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, b""))
    try:
        await sender
    except ConnectionError:
        pass
    writer.close()


async def serve(listen: str, target: str, delay: float, ready: asyncio.Event | None = None) -> None:
    """Accept on ``listen`` and forward each connection to ``target`` with ``delay`` seconds each way; forever."""
    to_host, to_port = _split(target)

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(to_host, to_port)
        except OSError:
            client_writer.close()
            return
        _no_delay(client_writer)
        _no_delay(server_writer)
        await asyncio.gather(
            _pump(client_reader, server_writer, delay), _pump(server_reader, client_writer, delay)
        )

    host, port = _split(listen)
    server = await asyncio.start_server(handle, host, port)
    if ready is not None:
        ready.set()
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept on")
    parser.add_argument("--to", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay; the round trip gains twice it")
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.listen, args.to, args.delay_ms / 1000))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
