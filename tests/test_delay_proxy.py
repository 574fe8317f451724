"""The benchmarks' latency proxy: bytes arrive intact and in order, each way no sooner than its delay."""

from __future__ import annotations

import asyncio
import os
import time

from delay_proxy import serve  # tests/ is on the path (conftest.py)

DELAY = 0.05


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1 << 16):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _through_proxy(payload: bytes) -> tuple[bytes, float, float]:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    echo_port = echo.sockets[0].getsockname()[1]
    probe = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    proxy_port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    ready = asyncio.Event()
    proxy = asyncio.create_task(serve(f"127.0.0.1:{proxy_port}", f"127.0.0.1:{echo_port}", DELAY, ready))
    await asyncio.wait_for(ready.wait(), 5)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
    t0 = time.monotonic()
    writer.write(b"x")
    await writer.drain()
    assert await asyncio.wait_for(reader.readexactly(1), 5) == b"x"
    small_rtt = time.monotonic() - t0
    t0 = time.monotonic()
    writer.write(payload)
    await writer.drain()
    back = await asyncio.wait_for(reader.readexactly(len(payload)), 30)
    big_rtt = time.monotonic() - t0
    writer.close()
    proxy.cancel()
    echo.close()
    return back, small_rtt, big_rtt


def test_the_proxy_forwards_every_byte_in_order_a_delay_each_way() -> None:
    payload = os.urandom(4 << 20)
    back, small_rtt, big_rtt = asyncio.run(_through_proxy(payload))
    assert back == payload
    assert small_rtt >= 2 * DELAY  # there and back: one delay each way
    assert big_rtt >= 2 * DELAY
