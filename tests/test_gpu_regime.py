"""The GPU-regime emulation (tests/gpu_regime.py) runs the real engine and reproduces the recorded answers."""

from __future__ import annotations

from gpu_regime import ScriptedModel, load_traces, measure

from edgespec.drafters.controller_sim import H200_PROFILE
from edgespec.engine import Engine
from edgespec.sampling import SamplingParams


def test_the_scripted_target_gives_back_the_recorded_answer_alone_and_beside_others():
    """Greedy decoding of the scripted target, plain or auto, alone or with another request in the batch, is the
    recorded answer: the emulation runs the engine's real rounds, drafts and roll-backs."""
    trace = load_traces()["code-edit"][0]
    want = trace["output"][:24]
    for lanes in (1, 2):
        model = ScriptedModel([trace["prompt"] + trace["output"]], H200_PROFILE, switch=0.0, n_seq=lanes)
        for draft_len in (0, "auto"):
            engine = Engine(model, None, draft_len=draft_len, lookup=draft_len != 0, parallel=lanes)
            params = SamplingParams(temperature=0.0, max_tokens=len(want))
            *_, finished = engine.stream(trace["prompt"], params, cache_prompt=False)
            assert list(finished.tokens) == want


def test_a_measurement_counts_every_class_and_strategy():
    classes = {name: traces[:1] for name, traces in load_traces().items() if name in ("code-edit", "math")}
    totals = measure(classes, lanes=2, rounds=1, switch=0.0, max_tokens=8)
    assert set(totals) == {(c, s) for c in classes for s in ("plain", "auto")}
    for tokens, seconds, drafted, accepted in totals.values():
        assert tokens == 8 * 4 and seconds > 0 and 0 <= accepted <= drafted  # twice the lanes: 4 requests of 8
