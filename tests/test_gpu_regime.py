"""The GPU-regime emulation (tests/gpu_regime.py) runs the real engine and reproduces the recorded answers."""

from __future__ import annotations

from gpu_regime import AGENT_STRATEGIES, ScriptedModel, load_agent_traces, load_traces, measure

from edgespec.api import Runtime
from edgespec.drafters.controller_sim import H200_PROFILE, CostProfile
from edgespec.drafters.suffix_cache import SuffixCache
from edgespec.engine import Engine
from edgespec.planner import Planner
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


def test_the_agent_class_replays_in_order_and_later_requests_draft_from_earlier_replies():
    """The agent class's recorded replies, in order through one engine with a suffix cache: each reply is the
    recorded one, and the later requests of a sequence draft from the earlier ones' replies."""
    traces = load_agent_traces()["agent"][:4]  # the tool-call sequence's first four
    model = ScriptedModel([t["prompt"] + t["output"] for t in traces], H200_PROFILE, switch=0.0)
    engine = Engine(model, None, draft_len=8, lookup=True, suffix_cache=SuffixCache(), cache_scope=0)
    drafted = []
    for t in traces:
        *_, done = engine.stream(t["prompt"], SamplingParams(temperature=0.0, max_tokens=len(t["output"]) + 1))
        assert list(done.tokens) == t["output"] and done.finish_reason == "eos"
        drafted.append(done.stats.cache_drafted)
    assert drafted[0] == 0 and min(drafted[1:]) > 0


def test_a_measurement_in_order_counts_auto_with_the_cache_and_without():
    classes = {"agent": load_agent_traces()["agent"][:3]}
    totals = measure(classes, lanes=1, rounds=1, switch=0.0, max_tokens=8, in_order=True)
    assert set(totals) == {("agent", s) for s in AGENT_STRATEGIES}
    assert all(tokens == 8 * 3 for tokens, *_ in totals.values())  # each request once


def _lockstep_rounds(monkeypatch) -> list[list[int]]:
    """Records the rows of each sequence in every step that drafted in lockstep (see Planner._lockstep)."""
    taken: list[list[int]] = []
    original = Planner._lockstep

    def recording(self, live):  # noqa: ANN001, ANN202
        original(self, live)
        if all(g.plan.reason.startswith("lockstep") for g in live):
            taken.append([g.rows for g in live])

    monkeypatch.setattr(Planner, "_lockstep", recording)
    return taken


def _two_code_edits(profile: CostProfile, n: int) -> ScriptedModel:
    """Two recorded code edits answered at once on auto at ``profile``'s costs, checked to be the recorded greedy
    answers; the scripted target (its ``batches``) for the caller to inspect."""
    traces = load_traces()["code-edit"][:2]
    model = ScriptedModel([t["prompt"] + t["output"] for t in traces], profile, switch=0.0, n_seq=2)
    engine = Engine(model, None, draft_len="auto", lookup=True, parallel=2)
    done = Runtime(engine).generate_many([t["prompt"] for t in traces], SamplingParams(temperature=0.0, max_tokens=n))
    assert [list(f.tokens) for f in done] == [t["output"][:n] for t in traces]
    return model


def test_at_a_gpus_costs_requests_that_copy_draft_in_lockstep_and_keep_their_answers(monkeypatch):
    """Two requests that copy their prompts, at the H200's decode costs: alone each plan finds that a draft beside
    the other's single row costs a forward pass of its own, but drafting the same rows together is one pass, and
    the engine takes it. The answers stay the recorded greedy ones."""
    taken = _lockstep_rounds(monkeypatch)
    model = _two_code_edits(H200_PROFILE, 64)
    assert taken and all(len(set(rows)) == 1 and rows[0] > 1 for rows in taken)  # every sequence the same rows
    assert any(parts == [rows[0]] * 2 for rows in taken for parts in model.batches)


def test_where_every_row_costs_more_than_a_step_requests_do_not_draft_in_lockstep(monkeypatch):
    """The same requests where each row of a decode costs 2 steps: n sequences of w rows then cost more than w
    plain steps, which commit w tokens each, and a draft of w - 1 commits at most w: no lockstep step. (At a CPU's
    0.9 of a step a row, a lockstep of near-certain copies can pay by the costs as measured: a CI run took one, of
    two rows each. At 1.2 steps a row the margin, ~8 %, was within what live timings of sleeps move on a busy
    machine, and a 2x2 lockstep was taken now and then.)"""
    taken = _lockstep_rounds(monkeypatch)
    _two_code_edits(CostProfile(t_token=0.004, verify_mult={2: 3.0, 64: 127.0}, draft={}), 48)
    assert not taken
