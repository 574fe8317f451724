"""Property-based tests of the whole HTTP API: schemathesis generates requests from the OpenAPI document that a
live `edgespec serve` publishes (the tiny model, 127.0.0.1) and checks every answer.

Every operation is run, streaming included (``stream: true`` is a field of the bodies), with bodies that fit the
published schema and bodies that break it. Each answer must be no 5xx, a status the document lists, of a media
type it lists, and of the documented shape (each server-sent event of a stream too, where an error frame must not
be a server error either). A body that breaks the published schema must get a 4xx. After the run the server must
serve a normal request. The run is bounded: at most ``EXAMPLES`` cases per operation and mode and ``BUDGET_S``
seconds in all; ``max_tokens`` is at most ``MAX_TOKENS`` (and ``n`` at most 2), so no case generates for long.

A second server with an API key gets the same cases three times: without a key and with a wrong one every route
but the public ones (``/health`` and the chat page) must be a 401, never a 500; with the key, as above.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_server import ALIAS, WAIT, LiveServer, tiny_loader

from edgespec.server import ServerSettings, create_app
from edgespec.server.openapi import PATHS, PUBLIC, RESPONSES

pytestmark = pytest.mark.real

MAX_TOKENS = 4
MAX_CHOICES = 2
MAX_TEXT = 160  # characters of any generated string
MAX_ITEMS = 4  # items of any generated list
BUDGET_S = 60.0  # the generated requests of the main run; the key's run has KEY_BUDGET_S
KEY_BUDGET_S = 12.0
EXAMPLES = 80  # per operation and mode
GENERATION_SHARE = 0.4  # of the budget, for each generation route; the GET routes share the rest
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
KEY = "sekret"

Call = Callable[[schemathesis.Case], None]
counts: Counter[tuple[str, str]] = Counter()  # (operation, status and whether streamed): requests sent
refused: Counter[str] = Counter()  # the param of each 400 of the generation routes, the field the server named
# Each case that broke a property: collected, not raised, so that the run keeps to its budget (hypothesis would
# replay a failure, and a case past the deadline is not sent) and one run reports every kind of failure.
failures: list[str] = []


def test_the_published_document_lists_exactly_the_apps_routes() -> None:
    app = create_app(lambda: None)
    routes = {
        (route.path.replace("{name:path}", "{name}"), method.lower())
        for route in app.routes
        for method in getattr(route, "methods", ())
        if method != "HEAD" and route.path != "/openapi.json"
    }
    assert routes == {(path, method) for path, ops in PATHS.items() for method in ops}


@pytest.fixture(scope="module")
def live(tiny_model_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(
        tiny_loader(tiny_model_path), ServerSettings(alias=ALIAS, max_queue=3, max_body_bytes=256 * 1024)
    ).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed(tiny_model_path: Path) -> Iterator[LiveServer]:
    server = LiveServer(tiny_loader(tiny_model_path, draft=False), ServerSettings(api_key=KEY)).start()
    yield server
    server.stop()


def published(server: LiveServer, headers: dict | None = None) -> dict:
    response = httpx.get(server.url + "/openapi.json", headers=headers or {}, timeout=WAIT)
    assert response.status_code == 200, response.text
    return response.json()


def request_validators(document: dict) -> dict[str, jsonschema.Draft202012Validator]:
    """Each POST route's published body schema, to judge whether a generated body breaks it."""
    validators = {}
    for path, operations in document["paths"].items():
        body = operations.get("post", {}).get("requestBody")
        if body is not None:
            ref = body["content"]["application/json"]["schema"]["$ref"]
            validators[path] = jsonschema.Draft202012Validator({"$ref": ref, "components": document["components"]})
    return validators


def narrowed(document: dict, n_vocab: int) -> dict:
    """The document the cases are drawn from: the published one with every text and list short, so that prompts
    prefill fast, and the values only the loaded model bounds (token ids, ``max_tokens``, ``n``) bounded. Which
    bodies must be refused is still judged by the published document."""
    copy = json.loads(json.dumps(document))

    def shorten(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "string" and "maxLength" not in node and "pattern" not in node:
                node["maxLength"] = MAX_TEXT
            if node.get("type") == "array" and "maxItems" not in node:
                node["maxItems"] = MAX_ITEMS
            for value in node.values():
                shorten(value)
        elif isinstance(node, list):
            for value in node:
                shorten(value)

    schemas = copy["components"]["schemas"]
    shorten({name: schema for name, schema in schemas.items() if name not in RESPONSES})
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        fields = schemas[name]["properties"]
        fields["max_tokens"]["maximum"] = MAX_TOKENS
        fields["n"]["maximum"] = MAX_CHOICES
        fields["logit_bias"]["propertyNames"]["pattern"] = f"^[0-9]{{1,{len(str(n_vocab)) - 1}}}$"
    schemas["ChatCompletionRequest"]["properties"]["max_completion_tokens"]["maximum"] = MAX_TOKENS
    token_ids = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"][2]["items"]
    token_ids["maximum"] = n_vocab - 1
    return copy


def bounded(body: object) -> object:
    """``body`` with a short reply: ``max_tokens`` at most MAX_TOKENS (set when the body would let the reply run to
    the end of the context) and ``n`` at most MAX_CHOICES; a value of the wrong type is left to be refused."""
    if not isinstance(body, dict):
        return body

    def is_int(value: object) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for name in ("max_tokens", "max_completion_tokens"):
        if is_int(body.get(name)) and body[name] > MAX_TOKENS:
            body[name] = MAX_TOKENS
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
    if is_int(body.get("n")) and MAX_CHOICES < body["n"] <= 16:
        body["n"] = MAX_CHOICES
    return body


def check_stream(response: schemathesis.Response) -> None:
    """A stream ends with [DONE], and an error frame in it is the client's (a 4xx), never a server error."""
    frames = [line[len("data: ") :] for line in response.content.decode().splitlines() if line.startswith("data: ")]
    assert frames and frames[-1] == "[DONE]", response.content[-300:]
    for frame in frames[:-1]:
        error = json.loads(frame).get("error")
        assert error is None or error["type"] != "server_error", frame


def caller(server: LiveServer, validators: dict, headers: dict | None = None) -> Call:
    def call(case: schemathesis.Case) -> None:
        case.body = bounded(case.body)
        response = case.call(base_url=server.url, headers=headers, timeout=WAIT)
        streamed = response.headers.get("content-type", [""])[0].startswith("text/event-stream")
        mode = case.meta.generation.mode.value if case.meta is not None else "?"
        counts[(f"{case.operation.label} ({mode})", f"{response.status_code}{' stream' if streamed else ''}")] += 1
        case.validate_response(response, checks=CHECKS)
        if response.status_code == 400 and case.operation.method.upper() == "POST":
            error = json.loads(response.content)["error"]
            refused[f"{mode} {error['param']}: {error['message'][:70]}"] += 1
        if streamed:
            check_stream(response)
        validator = validators.get(case.operation.path)
        if validator is not None and not validator.is_valid(case.body):
            assert 400 <= response.status_code < 500, f"a body the schema refuses was served: {case.body!r}"

    return call


def run(operation: schemathesis.APIOperation, mode: GenerationMode, seconds: float, call: Call, stream: bool) -> None:
    """Up to EXAMPLES cases of ``operation``, until ``seconds`` have passed (the rest are drawn, not sent);
    ``stream``: each body streamed (a generated body asks for a stream only now and then)."""
    deadline = time.monotonic() + seconds

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # shrinking a failure could run past the budget; the failing case is reported
        report_multiple_bugs=False,  # stop at the first exception: _OutOfTime
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def examples(case: schemathesis.Case) -> None:
        if time.monotonic() >= deadline:
            raise _OutOfTime  # ends hypothesis' run here: drawing the cases left would cost seconds
        if stream and isinstance(case.body, dict):
            case.body["stream"] = True
        try:
            call(case)
        except (KeyboardInterrupt, SystemExit, _OutOfTime):
            raise
        except BaseException as exc:  # noqa: BLE001 - schemathesis' FailureGroup too: all reported at the end
            failures.append(f"{case.operation.label} {case.body!r:.600}\n    {type(exc).__name__}: {exc!s:.1500}")

    try:
        examples()
    except _OutOfTime:
        pass


class _OutOfTime(Exception):
    pass


def operations(document: dict) -> list[schemathesis.APIOperation]:
    schema = schemathesis.openapi.from_dict(document)
    return [result.ok() for result in schema.get_all_operations()]


def runs(operation: schemathesis.APIOperation) -> list[tuple[GenerationMode, bool]]:
    """(mode, streamed) of each run of ``operation``. Only a body can break the schema: the GET routes take
    nothing, or a path parameter that any string fits."""
    if "requestBody" not in operation.definition.raw:
        return [(GenerationMode.POSITIVE, False)]
    return [(GenerationMode.POSITIVE, False), (GenerationMode.POSITIVE, True), (GenerationMode.NEGATIVE, False)]


def run_all(document: dict, budget: float, call: Call) -> None:
    """Each operation's runs, a generation route's sharing GENERATION_SHARE of ``budget``, the GET routes' the rest."""
    ops = operations(document)
    generation = [op for op in ops if "requestBody" in op.definition.raw]
    others = [op for op in ops if op not in generation]
    other_seconds = budget * (1 - GENERATION_SHARE * len(generation)) / max(1, len(others))
    for operation in ops:
        kinds = runs(operation)
        seconds = budget * GENERATION_SHARE / len(kinds) if operation in generation else other_seconds
        for mode, stream in kinds:
            run(operation, mode, seconds, call, stream)


def test_generated_requests_get_no_5xx_and_documented_answers(live: LiveServer) -> None:
    document = published(live)
    counts.clear()
    failures.clear()
    refused.clear()
    started = time.monotonic()
    cases = narrowed(document, live.runtime.engine.target.n_vocab)
    run_all(cases, BUDGET_S, caller(live, request_validators(document)))
    elapsed = time.monotonic() - started
    report("generated requests", elapsed)
    assert not failures, f"{len(failures)} cases failed:\n" + "\n".join(failures[:8])

    sent = {key: n for key, n in counts.items()}
    assert sum(counts.values()) >= 100, sent  # the run did run
    for route in ("POST /v1/chat/completions", "POST /v1/completions"):
        positive = f"{route} (positive)"
        assert sent.get((positive, "200"), 0) >= 1 and sent.get((positive, "200 stream"), 0) >= 1, sent
        assert sent.get((f"{route} (negative)", "400"), 0) >= 1, sent
    assert elapsed < BUDGET_S + WAIT  # each run's last case may start just before its deadline
    serves_a_normal_request(live)


def test_a_missing_or_wrong_key_is_401_on_every_route_that_needs_one(keyed: LiveServer) -> None:
    assert httpx.get(keyed.url + "/openapi.json", timeout=WAIT).status_code == 401
    document = published(keyed, {"X-Api-Key": KEY})
    validators = request_validators(document)
    counts.clear()
    failures.clear()
    refused.clear()
    with_key = caller(keyed, validators, {"Authorization": f"Bearer {KEY}"})

    def call(case: schemathesis.Case) -> None:
        case.body = bounded(case.body)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-Api-Key": KEY[:-1]}):
            for name in [k for k in case.headers or {} if k.lower() in ("authorization", "x-api-key")]:
                del case.headers[name]  # the key, if any, is only the one sent here
            response = case.call(base_url=keyed.url, headers=headers, timeout=WAIT)
            public = case.operation.path in PUBLIC
            counts[(f"{case.operation.label} (key: {'wrong' if headers else 'none'})", str(response.status_code))] += 1
            assert response.status_code < 500, response.content
            if not public:
                assert response.status_code == 401, response.content
                assert response.json()["error"]["type"] == "authentication_error"
            case.validate_response(response, checks=CHECKS)
        with_key(case)

    started = time.monotonic()
    run_all(narrowed(document, keyed.runtime.engine.target.n_vocab), KEY_BUDGET_S, call)
    report("the API key's run", time.monotonic() - started)
    assert not failures, f"{len(failures)} cases failed:\n" + "\n".join(failures[:8])
    reply = httpx.post(
        keyed.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, headers={"X-Api-Key": KEY}, timeout=WAIT
    )
    assert reply.status_code == 200, reply.text


def serves_a_normal_request(live: LiveServer) -> None:
    live.wait_idle()
    assert httpx.get(live.url + "/health", timeout=WAIT).status_code == 200
    client = live.client()
    reply = client.chat.completions.create(
        model=ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0
    )
    assert reply.choices[0].message.content is not None and reply.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model=ALIAS, prompt="Hi", max_tokens=4, stream=True))
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")


def report(what: str, seconds: float) -> None:
    """The counts so far, by operation and status (pytest -s shows them; the report of issue 56 quotes them)."""
    lines = [f"{what}: {sum(counts.values())} requests in {seconds:.0f} s"]
    lines += [f"  {operation:55} {status:11} {n:5}" for (operation, status), n in sorted(counts.items())]
    lines += ["  400s by the field named:", *(f"    {n:4} {why}" for why, n in refused.most_common())]
    print("\n".join(lines))
