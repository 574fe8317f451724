"""`edgespec serve`'s suffix cache over real HTTP on 127.0.0.1, on a fake model: whose earlier replies a request
drafts from, by --suffix-cache mode and API key."""

from __future__ import annotations

import httpx
import pytest
from fakes import FakeModel
from test_server import WAIT, LiveServer

from edgespec.api import Runtime, suffix_cache_for
from edgespec.engine import Engine
from edgespec.server import ServerSettings

A, B = "key-of-a", "key-of-b"
PROMPT = "cegikm"  # the fake's tokens 3, 5, 7, ...: no bigram twice, so prompt lookup has nothing to copy at first


def fake_runtime(mode: str) -> Runtime:
    cache, scope, _ = suffix_cache_for(mode, 10_000, None, None)
    engine = Engine(FakeModel(n_vocab=40, eos_bias=-9), None, draft_len=4, suffix_cache=cache, cache_scope=scope)
    return Runtime(engine, target_name="fake")


@pytest.fixture
def serve():
    servers: list[LiveServer] = []

    def start(settings: ServerSettings) -> LiveServer:
        server = LiveServer(lambda: fake_runtime(settings.cache_mode), settings).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def from_cache(server: LiveServer, key: str | None = None) -> tuple[int, str]:
    """A greedy completion of PROMPT: the tokens it drafted from earlier replies, and its text."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"model": "fake", "prompt": PROMPT, "max_tokens": 30, "temperature": 0}
    reply = httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=WAIT)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    return data["speculation"]["cache_drafted"], data["choices"][0]["text"]


def test_with_api_keys_a_request_drafts_only_from_replies_to_its_own_key(serve) -> None:
    server = serve(ServerSettings(api_key=A, api_keys=(B,)))
    assert server.runtime.engine.suffix_cache is not None and server.runtime.engine.cache_scope is None  # "key"
    first, text = from_cache(server, A)
    assert first == 0
    assert from_cache(server, B) == (0, text)  # the same reply, none of it drafted from A's
    drafted, again = from_cache(server, A)
    assert drafted > 0 and again == text
    assert len(server.runtime.engine.suffix_cache.scopes()) == 2  # one scope a key, named by a hash of it
    assert A not in server.runtime.engine.suffix_cache.scopes()


def test_without_keys_every_request_drafts_from_every_earlier_reply_and_off_from_none(serve) -> None:
    server = serve(ServerSettings())
    assert from_cache(server)[0] == 0 and from_cache(server)[0] > 0
    off = serve(ServerSettings(api_key=A, suffix_cache="off"))
    assert off.runtime.engine.suffix_cache is None
    assert from_cache(off, A)[0] == from_cache(off, A)[0] == 0


def test_global_mode_with_keys_shares_every_reply(serve) -> None:
    server = serve(ServerSettings(api_key=A, api_keys=(B,), suffix_cache="global"))
    from_cache(server, A)
    assert from_cache(server, B)[0] > 0
