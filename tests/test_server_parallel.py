"""`edgespec serve --parallel 4`: several requests in the same decodes, over real HTTP on 127.0.0.1 (SmolLM2, loaded
bit-exact so that a greedy reply is the same token for token whatever runs beside it)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest
from test_server import ALIAS, COUNTING, LONG, WAIT, LiveServer, wait_until

from edgespec.server import ServerSettings

pytestmark = pytest.mark.real

PARALLEL = 4
MAX_QUEUE = 2


@pytest.fixture(scope="module")
def live4(tiny_model_path: Path):
    def load():
        from edgespec.api import load as load_models

        return load_models(
            tiny_model_path, tiny_model_path, n_ctx=4096, draft_len=2, bit_exact=True, parallel=PARALLEL,
            show_fetch_progress=False,
        )  # fmt: skip

    server = LiveServer(load, ServerSettings(alias=ALIAS, max_queue=MAX_QUEUE)).start()
    yield server
    server.stop()


def test_eight_clients_disconnects_an_overflow_and_a_full_queue(live4: LiveServer) -> None:
    """Four long requests fill the four sequences, two more wait, the next gets a 503, a context overflow gets a
    400; two long ones disconnect, the waiting two then run beside the other two long ones and get exactly their
    solo replies; the counters add up; and the server takes the next request."""
    prompts = ["The sky is", "def square(x):"]
    solo = [live4.python_api(p, 32, temperature=0) for p in prompts]
    expected = [text for text, _ in solo]
    metrics = live4.metrics()
    cancelled_before = metrics["edgespec:requests_cancelled_total"]
    jobs_before = len(live4.jobs)
    body = {"model": ALIAS, "prompt": COUNTING, "max_tokens": LONG, "temperature": 0}
    longs = [live4.held_request("/v1/completions", body) for _ in range(PARALLEL)]
    results: dict[int, str] = {}
    errors: list[BaseException] = []
    try:
        wait_until(lambda: live4.worker.processing == PARALLEL, "four requests to run")

        def run(i: int) -> None:
            try:
                stream = live4.client().completions.create(
                    model=ALIAS, prompt=prompts[i], max_tokens=32, temperature=0, stream=True
                )
                results[i] = "".join(c.choices[0].text for c in stream)
            except BaseException as exc:  # noqa: BLE001 - reported by the main thread
                errors.append(exc)

        waiting = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in waiting:
            t.start()
        wait_until(lambda: live4.worker.waiting == MAX_QUEUE, "two requests to wait")
        with pytest.raises(openai.APIStatusError) as full:
            live4.client().completions.create(model=ALIAS, prompt="Hi", max_tokens=2)
        assert full.value.status_code == 503 and full.value.body["code"] == "queue_full"
        with pytest.raises(openai.BadRequestError) as overflow:
            live4.client().completions.create(model=ALIAS, prompt="Hi", max_tokens=5000)
        assert overflow.value.body["code"] == "context_length_exceeded"

        for sock in longs[:2]:  # two clients vanish: their sequences go to the waiting two within a step
            sock.close()
        for t in waiting:
            t.join(WAIT)
        assert not any(t.is_alive() for t in waiting) and not errors, errors
        assert [results[i] for i in range(len(prompts))] == expected
        wait_until(lambda: live4.worker.processing == 2, "the other two long ones to be all that runs")
    finally:
        for sock in longs:
            sock.close()
    live4.wait_idle()
    wait_until(lambda: len(live4.jobs) == jobs_before + PARALLEL + len(prompts), "every job to leave the server")
    left = live4.jobs[jobs_before:]
    assert sum(job.cancelled for job in left) == PARALLEL
    reasons = sorted(job.outcome.finished.finish_reason for job in left if not job.cancelled)
    assert reasons == sorted(finished.finish_reason for _, finished in solo)
    after = live4.metrics()
    assert after["edgespec:requests_cancelled_total"] == cancelled_before + PARALLEL
    # Decodes were shared: more requests than decodes, and the rows at least one per request.
    decodes = after["edgespec:batch_decodes"] - metrics["edgespec:batch_decodes"]
    sequences = after["edgespec:batch_decode_sequences"] - metrics["edgespec:batch_decode_sequences"]
    rows = after["edgespec:batch_decode_rows"] - metrics["edgespec:batch_decode_rows"]
    assert sequences > decodes > 0 and rows >= sequences
    reply = live4.client().completions.create(model=ALIAS, prompt="Hello", max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert httpx.get(live4.url + "/health").json() == {"status": "ok"}


def test_n_choices_share_the_prompt_and_each_is_seeded_apart(live4: LiveServer) -> None:
    client = live4.client()
    messages = [{"role": "user", "content": "Write one word."}]
    greedy = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=8, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    alone = client.chat.completions.create(model=ALIAS, messages=messages, max_tokens=8, temperature=0)
    assert {c.message.content for c in greedy.choices} == {alone.choices[0].message.content}
    hot_request = dict(
        model=ALIAS, prompt="Once upon a time", max_tokens=12, temperature=1.5, top_p=1.0, seed=5, n=3,
        extra_body={"top_k": 0, "min_p": 0},
    )  # fmt: skip
    hot = client.completions.create(**hot_request)
    assert len({c.text for c in hot.choices}) > 1  # three seeds, three draws
    again = client.completions.create(**hot_request)
    assert [c.text for c in again.choices] == [c.text for c in hot.choices]  # each choice's seed repeats it
    assert 3 <= hot.usage.completion_tokens <= 3 * 12  # the three choices' tokens


def test_more_choices_than_sequences_run_in_waves(live4: LiveServer) -> None:
    reply = live4.client().completions.create(model=ALIAS, prompt="The sky is", max_tokens=4, temperature=0, n=6)
    assert [c.index for c in reply.choices] == list(range(6)) and len({c.text for c in reply.choices}) == 1
