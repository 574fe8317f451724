"""The agent class: sequences of similar requests meant to run in order through one runtime, and their recorded
greedy outputs (tests/data/agent_traces.json)."""

from __future__ import annotations

import json
from pathlib import Path

from agent_ceiling import LEAD, MAX_GAMMA, best_schedule, lookup_or_cache

from edgespec.bench.workloads import load_tasks
from edgespec.drafters.controller_sim import H200_PROFILE, lookup_ceiling
from edgespec.drafters.suffix_cache import SuffixCache

DATA = Path(__file__).parent / "data"


def test_the_agent_class_is_in_the_suite_and_keeps_its_sequences_in_order() -> None:
    assert "agent" in {t.name for t in load_tasks()}
    (task,) = load_tasks(["agent"])
    sequences = task.sequences()
    assert list(sequences) == ["tool-calls", "sql", "pytest", "extraction"]
    for name, prompts in sequences.items():
        assert len(prompts) == 8, name
        assert all(p.sequence == name and not p.constrained for p in prompts)
        assert all(p.messages[-1]["role"] == "user" for p in prompts)  # each a fresh conversation
    assert [p.id for p in sequences["sql"]] == [f"sql-{i}" for i in range(8)]
    assert len({p.id for p in task.prompts}) == len(task.prompts)
    (held,) = load_tasks(source=DATA / "held-out-agent.toml")
    assert held.name == "held-out-agent" and {k: len(v) for k, v in held.sequences().items()} == {
        "docstrings": 6, "config-edits": 6
    }  # fmt: skip
    (first,) = load_tasks(["code-edit"], prompts_per_task=1)
    assert first.sequences() == {first.prompts[0].id: [first.prompts[0]]}  # no sequence: a prompt alone


def test_the_recorded_outputs_follow_the_sequences() -> None:
    data = json.loads((DATA / "agent_traces.json").read_text())
    assert len(data["steps"]) == 17 and data["steps"][0] == 1.0
    want = [(t.name, p.sequence, p.id) for t in load_tasks(["agent"]) + load_tasks(source=DATA / "held-out-agent.toml")
            for p in t.prompts]  # fmt: skip
    assert [(t["task"], t["sequence"], t["id"]) for t in data["traces"]] == want
    for t in data["traces"]:
        assert t["prompt"] and 0 < len(t["output"]) <= 160, t["id"]


def test_earlier_outputs_in_a_suffix_cache_raise_the_lookup_ceiling_of_every_agent_sequence() -> None:
    # The recorded outputs at the H200's curve: prompt lookup alone against prompt lookup or a suffix cache of the
    # sequence's earlier requests (tests/agent_ceiling.py prints the whole table). Measured: 1.44x -> 2.11x pooled;
    # tool calls 1.35x -> 2.06x, SQL 1.07x -> 1.44x, pytest tests 2.07x -> 2.38x, extraction 1.23x -> 2.32x.
    data = json.loads((DATA / "agent_traces.json").read_text())
    cost = H200_PROFILE.verify
    by_sequence: dict[str, list[dict]] = {}
    for t in data["traces"]:
        if t["task"] == "agent":
            by_sequence.setdefault(t["sequence"], []).append(t)
    for name, traces in by_sequence.items():
        cache = SuffixCache()
        plain = alone = with_cache = 0.0
        for t in traces:
            plain += len(t["output"]) * cost(1)
            alone += lookup_ceiling(t["prompt"], t["output"], cost, MAX_GAMMA)
            with_cache += best_schedule(lookup_or_cache(t["prompt"], t["output"], cache, name), cost)
            cache.add(name, t["prompt"][-LEAD:] + t["output"])
        assert plain / with_cache >= plain / alone + 0.25, (name, plain / alone, plain / with_cache)


def test_the_bench_runs_auto_with_the_suffix_cache_and_auto_nocache_without() -> None:
    from fakes import FakeModel

    from edgespec.bench.strategies import engine_for, parse_strategies

    assert parse_strategies(["auto", "auto-nocache"], has_draft=False) == ["plain", "auto", "auto-nocache"]
    target = FakeModel()
    auto, nocache = (engine_for(name, target, None, 4, 0.0) for name in ("auto", "auto-nocache"))
    assert auto.suffix_cache is not None and auto.cache_scope is not None and nocache.suffix_cache is None
    assert auto.draft_len == nocache.draft_len == "auto"
