"""The server's pieces without a model or a socket: request checks, response shapes, metrics, settings, the CLI's
refusals. Milliseconds each; tests/test_server.py runs the whole over HTTP."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from edgespec.cli import main
from edgespec.events import Finished, Stats
from edgespec.sampling import SamplingParams
from edgespec.server.errors import ApiError, from_validation_error
from edgespec.server.metrics import ServerMetrics
from edgespec.server.middleware import ApiKeyMiddleware
from edgespec.server.prepare import (
    GenerationRequest,
    chat_messages,
    generation_request,
    refuse_unsupported,
    requested_logprobs,
)
from edgespec.server.responses import ResponseShape, speculation, timings, usage
from edgespec.server.schemas import ChatCompletionRequest, CompletionRequest
from edgespec.server.settings import is_loopback
from edgespec.server.worker import Outcome

REPO = Path(__file__).resolve().parents[1]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}], **fields})


def outcome(**stats) -> Outcome:
    s = Stats(**stats)
    return Outcome(Finished(text="x", tokens=(1,), finish_reason="length", stats=s), ("model",), 2)


def request(draft_len="auto", lookup=True) -> GenerationRequest:
    return GenerationRequest((1, 2), SamplingParams(), draft_len, lookup)


# ----- request checks -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 3, "stream": True}, "n"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
    ],
)
def test_unsupported_chat_features_are_refused_by_name(fields, param):
    with pytest.raises(ApiError) as err:
        refuse_unsupported(chat(**fields))
    assert err.value.status == 400 and err.value.param == param
    assert "not supported" in err.value.message


@pytest.mark.parametrize(
    ("fields", "wanted"),
    [({}, None), ({"logprobs": False}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 5}, 5)],
)
def test_chat_logprobs_map_to_the_alternatives_per_token(fields, wanted):
    assert requested_logprobs(chat(**fields)) == wanted


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}, "logprobs"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": "x", "logprobs": True}, "logprobs"),
    ],
)
def test_bad_logprobs_requests_are_400_naming_the_field(body, param):
    schema = ChatCompletionRequest if "messages" in body else CompletionRequest
    with pytest.raises(ApiError) as err:
        requested_logprobs(schema.model_validate(body))
    assert err.value.status == 400 and err.value.param == param


def test_completion_logprobs_are_the_alternatives_per_token():
    assert requested_logprobs(CompletionRequest.model_validate({"prompt": "x", "logprobs": 3})) == 3
    assert requested_logprobs(CompletionRequest.model_validate({"prompt": "x", "logprobs": 0})) == 0
    assert requested_logprobs(CompletionRequest.model_validate({"prompt": "x"})) is None


def test_what_openai_sends_by_default_is_accepted():
    refuse_unsupported(chat(n=1, logprobs=False, response_format={"type": "text"}, tool_choice="none"))
    refuse_unsupported(CompletionRequest.model_validate({"prompt": "x", "echo": False, "best_of": 1}))
    # Fields nobody here knows are ignored.
    assert chat(user="me", metadata={"a": 1}, presence_penalty=0).messages[0].content == "Hi"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"echo": True, "n": 2}, "echo"),
        ({"echo": True, "logprobs": 1, "stream": True}, "echo"),
        ({"suffix": "}"}, "suffix"),
    ],
)
def test_unsupported_completion_features_are_refused(fields, param):
    with pytest.raises(ApiError) as err:
        refuse_unsupported(CompletionRequest.model_validate({"prompt": "x", **fields}))
    assert err.value.param == param


def test_a_draft_len_wider_than_a_bit_exact_target_verifies_is_a_400():
    target = SimpleNamespace(bit_exact=True, n_ctx=4096)
    runtime = SimpleNamespace(
        engine=SimpleNamespace(gamma_limit=6, max_gamma=6), target=target, draft=None, context_size=4096
    )
    loaded = SimpleNamespace(runtime=runtime, draft_len="auto", lookup=True, lookup_available=True)
    assert generation_request(loaded, chat(draft_len=6), (1, 2)).draft_len == 6
    with pytest.raises(ApiError) as refused:
        generation_request(loaded, chat(draft_len=7), (1, 2))
    assert refused.value.status == 400 and refused.value.param == "draft_len"
    assert "at most 6" in refused.value.message and "bit-exact" in refused.value.message


def test_chat_messages_map_roles_and_join_text_parts():
    body = ChatCompletionRequest.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": None},
            ]
        }
    )
    assert chat_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
    ]
    image = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    )
    with pytest.raises(ApiError, match="image_url.*not supported") as err:
        chat_messages(image)
    assert err.value.param == "messages[0].content"


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"temperature": "0.5"}, "temperature", "valid number"),
        ({"max_tokens": 1.0}, "max_tokens", "valid integer"),
        ({"seed": -5}, "seed", "greater than or equal"),
        ({"stop": [1]}, "stop", "valid string"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "valid string"),
    ],
)
def test_validation_errors_name_the_field(fields, param, words):
    with pytest.raises(ValidationError) as err:
        chat(**fields)
    error = from_validation_error(err.value)
    assert error.status == 400 and error.param == param
    assert words in error.message and error.message.startswith(param)


# ----- response shapes ----------------------------------------------------------------------------------------
def test_timings_use_llama_server_names_and_the_engines_numbers():
    s = Stats(prompt_tokens=10, prefilled_tokens=4, generated=20, drafted=12, accepted=9, t_prefill=0.5, t_total=2.5)
    t = timings(s)
    assert t["cache_n"] == 5 and t["prompt_n"] == 5  # the prompt's last token is decoded with the first round
    assert t["prompt_ms"] == 500.0 and t["predicted_ms"] == 2000.0
    assert t["predicted_n"] == 20 and t["predicted_per_second"] == 10.0 and t["predicted_per_token_ms"] == 100.0
    assert (t["draft_n"], t["draft_n_accepted"]) == (12, 9)
    assert usage(s) == {
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "total_tokens": 30,
        "prompt_tokens_details": {"cached_tokens": 5},
    }


def test_speculation_says_why_it_did_not_run():
    idle = outcome(generated=5, rounds=5, accepted_per_round=(5, 0, 0))
    assert speculation(idle, request(draft_len=0), "d")["reason"].startswith("draft_len is 0")
    assert "no draft model" in speculation(idle, request(lookup=False), None)["reason"]
    assert "controller" in speculation(idle, request(), "d")["reason"]
    assert "lookup found nothing" in speculation(idle, request(draft_len=4), None)["reason"]
    report = speculation(idle, request(), "d")
    assert report["active"] is False and report["accepted_per_round"] == [5]

    busy_outcome = outcome(generated=9, rounds=4, drafted=8, accepted=5, accepted_per_round=(1, 1, 2, 0))
    busy = speculation(busy_outcome, request(), "d")
    assert busy["active"] is True and "reason" not in busy
    assert busy["acceptance_rate"] == 0.625 and busy["tokens_per_verify"] == 2.25
    assert busy["accepted_per_round"] == [1, 1, 2] and busy["drafters"] == ["model"]


def test_chunks_carry_the_role_first_and_the_finish_reason_last():
    shape = ResponseShape("chat", "m")
    first = shape.chunk("He", first=True)
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "He"}
    assert shape.chunk("llo", first=False)["choices"][0]["delta"] == {"content": "llo"}
    last = shape.chunk(None, first=False, finish_reason="stop")
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert shape.usage_chunk(outcome(prompt_tokens=3, generated=2))["choices"] == []

    text = ResponseShape("text", "m")
    assert text.chunk("x", first=True)["choices"][0]["text"] == "x"
    whole = text.complete(outcome(generated=1), {"timings": {}})
    assert whole["object"] == "text_completion" and whole["choices"][0]["finish_reason"] == "length"


# ----- metrics ------------------------------------------------------------------------------------------------
def test_metrics_count_accepted_tokens_per_position_from_the_histogram():
    worker = SimpleNamespace(processing=1, waiting=2)
    metrics = ServerMetrics(worker)
    # 4 rounds: accepted 0, 1, 3 and 3 drafts; so position 0 was accepted 3 times, 1 twice, 2 twice.
    job = SimpleNamespace(
        cancelled=False,
        outcome=outcome(prefilled_tokens=7, generated=11, drafted=12, accepted=7, accepted_per_round=(1, 1, 0, 2)),
    )
    metrics.record(job)
    metrics.record(SimpleNamespace(cancelled=True, outcome=None))
    samples = {
        (s.name, s.labels.get("position")): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert samples[("edgespec:spec_decode_num_accepted_tokens_per_pos_total", "0")] == 3
    assert samples[("edgespec:spec_decode_num_accepted_tokens_per_pos_total", "1")] == 2
    assert samples[("edgespec:spec_decode_num_accepted_tokens_per_pos_total", "2")] == 2
    assert samples[("edgespec:spec_decode_num_drafts_total", None)] == 2
    assert samples[("edgespec:prompt_tokens_total", None)] == 7
    assert samples[("edgespec:tokens_predicted_total", None)] == 11
    assert samples[("edgespec:requests_cancelled_total", None)] == 1
    assert samples[("edgespec:requests_processing", None)] == 1
    assert samples[("edgespec:requests_deferred", None)] == 2


def test_the_speculation_block_and_metrics_tell_drafts_from_the_prompt_and_from_earlier_replies_apart():
    stats = dict(generated=30, drafted=20, accepted=15, lookup_drafted=6, lookup_accepted=2, cache_drafted=14,
                 cache_accepted=13)  # fmt: skip
    report = speculation(outcome(**stats), request(), None)
    assert {k: report[k] for k in ("lookup_drafted", "lookup_accepted", "cache_drafted", "cache_accepted")} == {
        k: stats[k] for k in ("lookup_drafted", "lookup_accepted", "cache_drafted", "cache_accepted")
    }
    metrics = ServerMetrics(SimpleNamespace(processing=0, waiting=0))
    samples = lambda: {  # noqa: E731
        (s.name, s.labels.get("source")): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    assert samples()[("edgespec:spec_decode_num_draft_tokens_by_source_total", "cache")] == 0  # there from the start
    for _ in range(2):
        metrics.record(SimpleNamespace(cancelled=False, outcome=outcome(**stats)))
    got = samples()
    assert got[("edgespec:spec_decode_num_draft_tokens_by_source_total", "lookup")] == 12
    assert got[("edgespec:spec_decode_num_accepted_tokens_by_source_total", "lookup")] == 4
    assert got[("edgespec:spec_decode_num_draft_tokens_by_source_total", "cache")] == 28
    assert got[("edgespec:spec_decode_num_accepted_tokens_by_source_total", "cache")] == 26


# ----- settings, key, CLI -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("example.com", False),
    ],
)
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("headers", "keys"),
    [
        ([(b"authorization", b"Bearer abc")], [b"abc"]),
        ([(b"authorization", b"bearer  abc ")], [b"abc"]),
        ([(b"x-api-key", b"abc")], [b"abc"]),
        ([(b"authorization", b"Bearer dummy"), (b"x-api-key", b"abc")], [b"dummy", b"abc"]),
        ([], []),
    ],
)
def test_api_keys_are_read_from_either_header(headers, keys):
    assert ApiKeyMiddleware._given_keys({"headers": headers}) == keys


def test_serve_refuses_a_public_host_without_a_key():
    result = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "-d", "none"], env={"EDGESPEC_API_KEY": ""})
    assert result.exit_code == 1
    assert result.output.startswith("error: refusing to listen on 0.0.0.0 without an API key")


def test_serve_reports_a_model_that_fails_to_load(tmp_path: Path):
    missing = tmp_path / "missing.gguf"
    result = subprocess.run(
        [sys.executable, "-m", "edgespec", "serve", "-m", str(missing), "-d", "none", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 1
    assert "error: " in result.stderr and "missing.gguf" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.real
def test_serve_command_starts_answers_and_stops(tiny_model_path: Path):
    import httpx

    process = subprocess.Popen(
        [sys.executable, "-m", "edgespec", "serve", "-m", str(tiny_model_path), "-d", "none", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        line = process.stderr.readline()  # "edgespec: loading the models; the API will be at http://HOST:PORT/v1"
        match = re.search(r"http://(\S+):(\d+)/v1", line)
        assert match, line
        url = f"http://{match.group(1)}:{match.group(2)}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        reply = httpx.post(url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 3}, timeout=60)
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0


def test_an_empty_api_key_is_an_error_line():
    result = CliRunner().invoke(main, ["serve", "--api-key", "", "-d", "none"])
    assert result.exit_code == 1 and result.output.startswith("error: --api-key is empty")


def test_the_suffix_cache_is_scoped_by_key_when_keys_are_required_and_global_when_none_are():
    from edgespec.server.settings import ServerSettings

    assert ServerSettings().cache_mode == "global"
    assert ServerSettings(api_key="a", api_keys=("b",)).cache_mode == "key"
    assert ServerSettings(api_key="a").keys == ("a",) and ServerSettings(api_keys=("a", "b")).keys == ("a", "b")
    assert ServerSettings(api_key="a", suffix_cache="global").cache_mode == "global"
    with pytest.raises(ValueError, match="needs API keys"):
        ServerSettings(suffix_cache="key")
    result = CliRunner().invoke(main, ["serve", "--suffix-cache", "key", "-d", "none"], env={"EDGESPEC_API_KEY": ""})
    assert result.exit_code == 1 and result.output.startswith("error: --suffix-cache key scopes earlier replies by")


def test_engine_errors_map_to_who_can_fix_them():
    from edgespec.errors import ContextOverflowError, EdgespecError, InvalidParameterError, ModelError
    from edgespec.server.errors import from_edgespec_error

    assert from_edgespec_error(InvalidParameterError("bad")).status == 400
    assert from_edgespec_error(ContextOverflowError("long")).status == 400
    assert from_edgespec_error(ModelError("llama_decode failed")).status == 500
    busy = from_edgespec_error(EdgespecError("the engine is busy"))
    assert busy.status == 503 and "Retry-After" in busy.headers
