"""Replaying recorded decodes: the same run, token for token, with no forward pass (what bench --loop-cost's
'replayed' columns measure)."""

from __future__ import annotations

import pytest
from fakes import FakeModel

from edgespec.bench.measure import measure_engine
from edgespec.bench.probes import loop_costs
from edgespec.engine import Engine
from edgespec.replay import Recorder, Replay, ReplayDiverged
from edgespec.sampling import SamplingParams


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_replay_generates_the_recorded_tokens_with_no_model_time(temperature: float) -> None:
    target, draft = Recorder(FakeModel(seed=0)), Recorder(FakeModel(seed=3, noise=1.0))
    params = SamplingParams(temperature=temperature, top_k=5, max_tokens=24, seed=7)
    recorded = measure_engine(Engine(target, draft, draft_len=3, lookup=False), [1, 2, 3], params)
    assert target.outputs and draft.outputs  # every scoring decode of both models was kept

    replay_target, replay_draft = Replay(target), Replay(draft)
    replayed = measure_engine(Engine(replay_target, replay_draft, draft_len=3, lookup=False), [1, 2, 3], params)
    assert replayed["tokens"] == recorded["tokens"] and replayed["rounds"] == recorded["rounds"]
    assert replay_target.kv_tokens == [1, 2, 3, *recorded["tokens"]][: len(replay_target.kv_tokens)]
    assert next(replay_target._outputs, None) is None  # every recorded decode was played back, in order
    if temperature > 0:  # the seed decides the tokens: another one samples another run
        other = SamplingParams(temperature=temperature, top_k=5, max_tokens=24, seed=8)
        again = measure_engine(Engine(FakeModel(seed=0), FakeModel(seed=3, noise=1.0), draft_len=3, lookup=False),
                               [1, 2, 3], other)
        assert again["tokens"] != recorded["tokens"]


def test_a_replay_starts_from_the_cache_the_recorded_run_found() -> None:
    # A model reused across runs keeps the last prompt's KV; the next run reuses the shared prefix.
    model = FakeModel(seed=0)
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=10, seed=4)
    measure_engine(Engine(model, None, draft_len=0, lookup=False), [1, 2, 3, 4], params)
    recorder = Recorder(model)
    recorded = measure_engine(Engine(recorder, None, draft_len=0, lookup=False), [1, 2, 3, 5], params)
    assert recorder.kept[0] == 3  # the shared prefix was kept
    replayed = measure_engine(Engine(Replay(recorder), None, draft_len=0, lookup=False), [1, 2, 3, 5], params)
    assert replayed["tokens"] == recorded["tokens"]


def test_a_replay_that_asks_for_other_decodes_says_so() -> None:
    target = Recorder(FakeModel())
    measure_engine(Engine(target, None, draft_len=0, lookup=False), [1, 2], SamplingParams(max_tokens=8, seed=1))
    with pytest.raises(ReplayDiverged):  # a longer run than the recording
        measure_engine(Engine(Replay(target), None, draft_len=0, lookup=False), [1, 2], SamplingParams(max_tokens=12))


def test_loop_costs_reports_the_replayed_loop_beside_the_measured_one() -> None:
    target, draft = FakeModel(seed=0), FakeModel(seed=3, noise=1.0)
    runs: list[None] = []
    rows = loop_costs(target, draft, [[1, 2], [3, 4, 5]], [0.0, 0.8], max_tokens=10, repeats=2,
                      on_run=lambda: runs.append(None))
    assert [r.run for r in rows] == ["plain T=0", "plain T=0.8", "draft-4 T=0", "draft-4 T=0.8"]
    assert len(runs) == 2 * 4 + 4  # the repetitions, then a recorded run of each with its replays
    for r in rows:
        assert r.outside_ms_per_token > 0 and r.replayed_ms_per_token > 0
        assert r.replayed_ms_per_round >= r.replayed_ms_per_token  # a round commits one token or more


class _RecurrentFake(FakeModel):
    """A memory that cannot drop part of a sequence: any rollback clears it (as Model.truncate does then)."""

    def truncate(self, n_keep: int) -> None:
        if n_keep < len(self.kv_tokens):
            del self.kv_tokens[:]


def test_a_replay_follows_a_draft_memory_that_clears_on_rollback() -> None:
    target, draft = Recorder(FakeModel(seed=0)), Recorder(_RecurrentFake(seed=3, noise=2.0))
    params = SamplingParams(temperature=0.8, top_k=5, max_tokens=30, seed=2)
    recorded = measure_engine(Engine(target, draft, draft_len=3, lookup=False), [1, 2, 3], params)
    assert 0 in draft.kept[1:]  # a rejection cleared the draft's memory (the next draft decoded everything)
    replayed = measure_engine(Engine(Replay(target), Replay(draft), draft_len=3, lookup=False), [1, 2, 3], params)
    assert replayed["tokens"] == recorded["tokens"]
