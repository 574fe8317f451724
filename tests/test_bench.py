"""`edgespec bench`: the suite loads, the summary maths is right, and a short real run keeps working.

No test here asserts a time or a speedup: those are measurements, not properties.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from edgespec.bench.measure import RunRecord
from edgespec.bench.report import overall_speedup, summarize
from edgespec.bench.runner import run_bench
from edgespec.bench.strategies import PEER_STRATEGIES, parse_strategies
from edgespec.bench.tables import format_table, percentile
from edgespec.bench.workloads import load_tasks, render_prompt
from edgespec.cli import main
from edgespec.errors import EdgespecError
from edgespec.sampling import SamplingParams

SUITE = {"agent", "code-edit", "code-gen", "creative", "math", "structured", "summarize", "translate"}
ALL = ["plain", "draft-2", "draft-3", "draft-4", "lookup", "auto", *PEER_STRATEGIES]

# Short classes for the tests of the bench's mechanics: a run prefills its prompt again, and the shipped classes'
# prompts (hundreds of tokens) took most of these tests' time.
SHORT = Path(__file__).parent / "data" / "short"


# ----- the suite and the options ----------------------------------------------------------------------------
def test_shipped_suite_has_every_class_with_three_prompts() -> None:
    tasks = load_tasks()
    assert {t.name for t in tasks} == SUITE
    for task in tasks:
        assert len(task.prompts) >= 3, task.name
        assert len({p.id for p in task.prompts}) == len(task.prompts), f"{task.name}: duplicate prompt ids"
        for prompt in task.prompts:
            assert prompt.messages[-1]["role"] == "user"
            assert all(m["content"].strip() for m in prompt.messages)


@pytest.mark.real
def test_suite_renders_in_the_models_chat_format(tiny_model_path: Path) -> None:
    from edgespec.models.backend import Model

    with Model(tiny_model_path, n_ctx=256) as model:
        for task in load_tasks():
            for prompt in task.prompts:
                tokens = render_prompt(model, prompt.messages)
                text = model.detokenize(tokens)
                assert text.rstrip().endswith("assistant"), text[-40:]  # ChatML's generation prompt
                assert 10 < len(tokens) < 1024, (task.name, prompt.id, len(tokens))


def test_load_tasks_picks_orders_and_shortens(tmp_path: Path) -> None:
    tasks = load_tasks(["math", "code-edit"], prompts_per_task=1)
    assert [t.name for t in tasks] == ["math", "code-edit"]
    assert [len(t.prompts) for t in tasks] == [1, 1]
    with pytest.raises(EdgespecError, match="unknown task nope"):
        load_tasks(["nope"])

    own = tmp_path / "mine.toml"
    own.write_text('name = "mine"\n[[prompts]]\nid = "a"\n[[prompts.messages]]\nrole = "user"\ncontent = "hi"\n')
    [task] = load_tasks(source=own)
    assert task.name == "mine" and task.prompts[0].messages == ({"role": "user", "content": "hi"},)
    own.write_text('name = "broken"\n')
    with pytest.raises(EdgespecError, match="not a workload file"):
        load_tasks(source=own)


def test_parse_strategies() -> None:
    assert parse_strategies(["lookup", "auto"], has_draft=True) == ["plain", "lookup", "auto"]
    assert parse_strategies(["plain", "draft-5", "draft-5", "llama-cpp"], has_draft=True) == [
        "plain", "draft-5", "llama-cpp"]
    assert parse_strategies(["draft-2", "auto"], has_draft=False) == ["plain", "auto"]
    with pytest.raises(EdgespecError, match="unknown strategy"):
        parse_strategies(["fast"], has_draft=True)
    with pytest.raises(EdgespecError, match="1..64"):
        parse_strategies(["draft-0"], has_draft=True)


# ----- the maths on synthetic numbers -----------------------------------------------------------------------
def record(task: str, prompt: str, strategy: str, *, tokens: int, seconds: float, rounds: int, drafted: int = 0,
           accepted: int = 0, t_outside: float | None = 0.0, text: str = "out", times=None) -> RunRecord:
    return RunRecord(task, prompt, strategy, generated=tokens, decode_tokens=tokens, t_prefill=0.5,
                     t_decode=seconds, t_outside=t_outside, rounds=rounds, drafted=drafted, accepted=accepted,
                     finish_reason="length", text=text, token_times=times or [seconds / tokens] * tokens)


def test_percentile_interpolates_between_ranks() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(i) for i in range(1, 101)], 95) == pytest.approx(95.05)
    assert percentile([1.0, 2.0], 0) == 1.0 and percentile([1.0, 2.0], 100) == 2.0


def test_summary_pools_prompts_and_divides_by_plain() -> None:
    records = [
        record("edit", "a", "plain", tokens=10, seconds=1.0, rounds=10, t_outside=0.1),
        record("edit", "b", "plain", tokens=30, seconds=3.0, rounds=30, t_outside=0.2),
        record("edit", "a", "lookup", tokens=10, seconds=0.5, rounds=4, drafted=8, accepted=6, t_outside=0.05),
        record("edit", "b", "lookup", tokens=30, seconds=1.5, rounds=12, drafted=20, accepted=18, text="diff",
               t_outside=0.15),
        record("edit", "a", "llama-cpp", tokens=10, seconds=2.0, rounds=10, t_outside=None,
               times=[0.1] * 9 + [1.1]),
        record("gen", "c", "plain", tokens=10, seconds=1.0, rounds=10),
        record("gen", "c", "lookup", tokens=10, seconds=2.0, rounds=10),
    ]
    summary = summarize(records)
    assert list(summary) == ["edit", "gen"]
    assert list(summary["edit"]) == ["plain", "lookup", "llama-cpp"]
    assert list(summarize(records, order=["llama-cpp", "lookup"])["edit"]) == ["plain", "llama-cpp", "lookup"]
    plain, lookup, peer = (summary["edit"][s] for s in ("plain", "lookup", "llama-cpp"))
    assert plain.runs == 2 and plain.generated == 40
    assert plain.acceptance_rate is None and plain.tokens_per_verify == 1.0
    assert plain.tokens_per_second == pytest.approx(10.0) and plain.speedup == pytest.approx(1.0)
    assert plain.outside_ms == pytest.approx(1e3 * 0.3 / 40)
    assert lookup.acceptance_rate == pytest.approx(24 / 28)
    assert lookup.tokens_per_verify == pytest.approx(40 / 16)
    assert lookup.speedup == pytest.approx(2.0)
    assert lookup.p50_ms == pytest.approx(50.0) and lookup.p95_ms == pytest.approx(50.0)
    assert lookup.same_as_plain == 1  # prompt b's text differs
    assert peer.outside_ms is None and peer.speedup == pytest.approx(0.5)
    assert peer.p50_ms == pytest.approx(100.0) and peer.p95_ms == pytest.approx(1000.0 * (0.1 + 0.55 * 1.0))
    assert summary["gen"]["lookup"].speedup == pytest.approx(0.5)

    overall = overall_speedup(summary)
    assert overall["plain"] == pytest.approx(1.0)
    assert overall["lookup"] == pytest.approx(math.sqrt(2.0 * 0.5))  # geometric mean: the classes weigh alike
    assert overall["llama-cpp"] == pytest.approx(0.5)  # only measured on one class

    assert summarize(records, greedy=False)["edit"]["lookup"].same_as_plain is None
    no_plain = summarize([record("x", "a", "lookup", tokens=4, seconds=1.0, rounds=2)])
    assert no_plain["x"]["lookup"].speedup is None


def test_format_table_aligns_columns() -> None:
    table = format_table(["name", "x"], [["plain", "1.00x"], ["a", "12.50x"]]).splitlines()
    assert table == ["name        x", "-----  ------", "plain   1.00x", "a      12.50x"]


# ----- a short real run -------------------------------------------------------------------------------------
def check_counts(run: dict, max_tokens: int) -> None:
    """What every measurement must satisfy, whatever the timings."""
    assert run["generated"] == max_tokens or run["finish_reason"] == "eos", run
    assert 1 <= run["generated"] <= max_tokens
    assert len(run["token_times"]) == run["decode_tokens"] <= run["generated"]
    assert 0 <= run["accepted"] <= run["drafted"]
    assert run["t_decode"] >= 0 and all(t >= 0 for t in run["token_times"])
    assert run["rounds"] <= run["decode_tokens"]
    if run["strategy"] in ("plain", "llama-cpp"):
        assert run["drafted"] == 0 and run["accepted"] == 0
        assert run["rounds"] == run["decode_tokens"]  # one token per target decode


@pytest.mark.real
def test_run_bench_on_the_tiny_model_with_every_strategy(tiny_model_path: Path) -> None:
    from dataclasses import asdict

    from edgespec.models.backend import Model

    tasks = load_tasks(["short-edit"], source=SHORT)
    params = SamplingParams(temperature=0, max_tokens=8)
    seen: list[tuple[int, int]] = []
    # The same file as target and draft: acceptance is near total, which exercises the multi-token rounds.
    with Model(tiny_model_path, n_ctx=1024) as target, Model(tiny_model_path, n_ctx=1024) as draft:
        result = run_bench(target, draft, tasks, ALL, params, on_run=lambda r, done, total: seen.append((done, total)))
    assert [r.strategy for r in result.records] == ALL  # the first prompt starts the rotation at plain
    assert seen == [(i, len(ALL)) for i in range(1, len(ALL) + 1)]
    for r in result.records:
        check_counts(asdict(r), max_tokens=8)
    by = {r.strategy: r for r in result.records}
    assert by["draft-4"].drafted > 0 and by["llama-cpp-lookup"].rounds >= 1
    assert by["plain"].t_outside is not None and by["llama-cpp"].t_outside is None
    assert by["plain"].sampling_path == "argmax in llama.cpp" and by["llama-cpp"].sampling_path is None

    summary = result.summaries()
    assert list(summary["short-edit"]) == ALL
    assert summary["short-edit"]["plain"].speedup == pytest.approx(1.0)
    # The lookup ceiling is computed on every engine's greedy output: a speedup no lookup schedule can beat, >= 1.
    assert all(by[s].ceiling is not None and by[s].ceiling >= 1.0 for s in ("plain", "auto", "draft-4"))
    report = result.to_json()
    assert report["config"]["strategies"] == ALL and len(report["runs"]) == len(ALL)
    json.dumps(report)  # serialisable as the --json output


@pytest.mark.real
def test_repeats_rerun_each_class_on_a_fresh_auto_engine_priced_apart(tiny_model_path: Path, monkeypatch) -> None:
    import edgespec.bench.runner as runner
    from edgespec.bench.report import render_report
    from edgespec.models.backend import Model

    made: list[str] = []  # the engines built, by strategy
    real_engine_for = runner.engine_for

    def counting(name, *args, **kwargs):
        made.append(name)
        return real_engine_for(name, *args, **kwargs)

    priced: list[int] = []
    monkeypatch.setattr(runner, "engine_for", counting)
    monkeypatch.setattr(runner, "decode_costs", lambda *a, **k: priced.append(1) or {b: 0.01 * b for b in range(1, 18)})
    tasks = load_tasks(["code-edit", "summarize"], prompts_per_task=1)
    params = SamplingParams(temperature=0, max_tokens=6)
    seen: list[tuple[int, int]] = []
    with Model(tiny_model_path, n_ctx=1024) as target:
        result = run_bench(target, None, tasks, ["plain", "auto"], params, warmup=False, repeats=2,
                           on_run=lambda r, done, total: seen.append((done, total)))
    records = result.records
    assert [(r.task, r.repeat, r.strategy) for r in records] == [
        ("code-edit", 0, "plain"), ("code-edit", 0, "auto"), ("code-edit", 1, "auto"), ("code-edit", 1, "plain"),
        ("summarize", 0, "plain"), ("summarize", 0, "auto"), ("summarize", 1, "auto"), ("summarize", 1, "plain")]
    assert seen == [(i, 8) for i in range(1, 9)]
    # plain's engine once; auto's once at the start and once for every class and repeat.
    assert made.count("plain") == 1 and made.count("auto") == 1 + 2 * 2
    # The ceiling priced before the first repeat and after each: 1 + 2 classes x 2 repeats.
    assert len(priced) == 5 and len(result.config["ceiling_costs"]) == 5 and result.config["repeats"] == 2
    assert all(r.ceiling is not None for r in records)
    summary = result.summaries()["code-edit"]
    assert summary["plain"].runs == 2 and summary["plain"].same_as_plain == 2 and summary["auto"].runs == 2
    text = render_report(result)
    assert "code-edit: 1 prompt(s) x 2 repeats" in text and "speedup by repeat" in text
    with pytest.raises(ValueError, match="repeats"):
        run_bench(target, None, tasks, ["plain"], params, repeats=0)  # before anything runs


def test_the_report_pools_repeats_and_gives_the_range_of_their_speedups_and_shares() -> None:
    from dataclasses import replace

    from edgespec.bench.report import BenchResult, render_report

    def run(strategy: str, tokens: int, repeat: int) -> RunRecord:
        return replace(record("edit", "a", strategy, tokens=tokens, seconds=1.0, rounds=tokens), ceiling=2.0,
                       repeat=repeat)

    # Repeat 0: auto at 1.5x of plain (half of the ceiling's gain); repeat 1: 1.1x (a tenth); pooled 26/20 = 1.3x.
    records = [run("plain", 10, 0), run("auto", 15, 0), run("auto", 11, 1), run("plain", 10, 1)]
    summary = summarize(records)["edit"]
    assert summary["auto"].speedup == pytest.approx(1.3) and summary["auto"].ceiling_share == pytest.approx(0.3)
    config = {"target": "/m/t.gguf", "draft": None, "temperature": 0.0, "max_tokens": 10, "n_threads": 2,
              "lookup_len": 4, "ceiling_max_gamma": 16}
    text = render_report(BenchResult(config, records))
    assert "edit: 1 prompt(s) x 2 repeats" in text
    assert next(line.split() for line in text.splitlines() if line.startswith("auto"))[-4:] == [
        "2/2", "30%", "1.10-1.50x", "10%-50%"]
    assert next(line.split() for line in text.splitlines() if line.startswith("plain"))[-4:] == ["2/2", "-", "-", "-"]
    assert "2 repeats of each class, pooled" in text
    single = render_report(BenchResult(config, records[:2]))
    assert "by repeat" not in single and "repeats" not in single


@pytest.mark.real
def test_each_class_ceiling_is_priced_at_the_costs_measured_around_it(tiny_model_path: Path, monkeypatch) -> None:
    import edgespec.bench.runner as runner
    import edgespec.drafters.controller_sim as sim
    from edgespec.bench.report import render_report
    from edgespec.bench.workloads import prompt_job
    from edgespec.models.backend import Model

    # A machine whose wide decodes get dearer over the run: its k-th measurement prices a decode of b tokens at
    # 1 + k·(b - 1) single steps. Each class must be priced at the mean of the measurements before and after it.
    measured: list[int] = []  # the context each measurement was taken after

    def drifting(model, widths, reps=8, readout=None, context=64):
        k = len(measured)
        measured.append(context)
        return {b: 0.01 * (1 + k * (b - 1)) for b in widths}

    priced: list[tuple[float, float, float]] = []  # (cost of 1 row, cost of 17, the ceiling's speedup) per output
    real_ceiling = sim.lookup_ceiling

    def spy(prompt, output, verify_cost, max_gamma, **kwargs):
        seconds = real_ceiling(prompt, output, verify_cost, max_gamma, **kwargs)
        priced.append((verify_cost(1), verify_cost(17), len(output) * verify_cost(1) / seconds))
        return seconds

    monkeypatch.setattr(runner, "decode_costs", drifting)
    monkeypatch.setattr(sim, "lookup_ceiling", spy)
    tasks = load_tasks(["code-edit", "summarize"], prompts_per_task=1)
    params = SamplingParams(temperature=0, max_tokens=12)
    with Model(tiny_model_path, n_ctx=1024) as target:
        result = run_bench(target, None, tasks, ["plain", "lookup"], params, warmup=False)
        lengths = sorted(len(prompt_job(target, t.prompts[0])[0]) for t in tasks)
    # Before the first class and after each, all after a context as long as the median prompt and half the tokens.
    assert measured == [lengths[1] + 6] * 3 and result.config["ceiling_context"] == lengths[1] + 6
    assert [c["17"] for c in result.config["ceiling_costs"]] == pytest.approx([0.01, 0.17, 0.33])
    # Two runs a class, in order: code-edit at the mean of measurements 0 and 1, summarize at that of 1 and 2.
    assert [one for one, _, _ in priced] == pytest.approx([0.01] * 4)
    assert [wide for _, wide, _ in priced] == pytest.approx([0.09, 0.09, 0.25, 0.25])
    assert [r.ceiling for r in result.records] == pytest.approx([c for _, _, c in priced])
    text = render_report(result)
    assert "a 17-token decode at 1.00-33.00 single steps across 3 measurements" in text


def test_the_untuned_code_edits_load_as_a_workload() -> None:
    (task,) = load_tasks(source=Path(__file__).parent / "data" / "untuned-code-edits.toml")
    assert task.name == "untuned-code-edit" and [p.id for p in task.prompts] == [
        "rename-variable", "reindent", "add-parameter"
    ]
    (task,) = load_tasks(source=Path(__file__).parent / "data" / "held-out-code-edits.toml")
    assert task.name == "held-out-code-edit" and [p.id for p in task.prompts] == [
        "rename-function", "reindent-tabs", "add-timeout-parameter", "add-verbose-flag"
    ]


def test_structured_prompts_carry_a_schema_or_tools() -> None:
    (task,) = load_tasks(["structured"])
    schemas = [p for p in task.prompts if p.json_schema is not None]
    tools = [p for p in task.prompts if p.tools is not None]
    assert len(schemas) >= 2 and len(tools) >= 1 and all(p.constrained for p in task.prompts)
    for p in schemas:
        assert json.loads(p.json_schema)["type"] == "object"


@pytest.mark.real
def test_structured_runs_every_strategy_under_its_constraint_and_skips_the_peers(tiny_model_path: Path) -> None:
    """SmolLM2's template takes no tools: the tool prompt lists them in a system message; each reply fits its
    constraint (a schema's document, a tool call), and the report has the forced share and the mask's cost."""
    from edgespec.bench.report import render_report
    from edgespec.bench.workloads import prompt_job
    from edgespec.models.backend import Model
    from edgespec.tools import parse_calls, parse_tools

    tasks = load_tasks(["structured"])
    params = SamplingParams(temperature=0, max_tokens=400)
    strategies = ["plain", "lookup", "llama-cpp"]
    with Model(tiny_model_path, n_ctx=2048) as target:
        jobs = {p.id: prompt_job(target, p) for p in tasks[0].prompts}
        result = run_bench(target, None, tasks, strategies, params, ceiling=False)
    assert {r.strategy for r in result.records} == {"plain", "lookup"}  # llama-cpp-python's loop takes no grammar
    for r in result.records:
        prompt = next(p for p in tasks[0].prompts if p.id == r.prompt)
        assert jobs[r.prompt][1] is not None and r.t_constraint > 0
        if r.finish_reason != "eos":
            continue  # cut at max_tokens: a prefix of a valid reply
        if prompt.json_schema is not None:
            jsonschema.validate(json.loads(r.text), json.loads(prompt.json_schema))
        else:
            assert parse_calls("hermes", r.text, parse_tools(json.loads(prompt.tools))) is not None, r.text
    assert sum(r.forced for r in result.records if r.strategy == "lookup") > 0
    report = render_report(result)
    assert "forced" in report and "mask ms/tok" in report


@pytest.mark.real
def test_cli_bench_json(tiny_model_path: Path) -> None:
    args = ["bench", "-m", str(tiny_model_path), "-d", str(tiny_model_path), "--n-ctx", "1024",
            "--workloads", str(SHORT), "--tasks", "short-edit", "--max-tokens", "8",
            "--strategies", "draft-2,lookup,auto", "--no-peers", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report) == {"config", "summary", "overall_speedup", "runs"}
    assert report["config"]["strategies"] == ["plain", "draft-2", "lookup", "auto"]
    assert list(report["summary"]) == ["short-edit"]
    assert set(report["summary"]["short-edit"]) == {"plain", "draft-2", "lookup", "auto"}
    assert report["overall_speedup"]["plain"] == pytest.approx(1.0)
    for run in report["runs"]:
        check_counts(run, max_tokens=8)
    plain = report["summary"]["short-edit"]["plain"]
    assert plain["acceptance_rate"] is None and plain["tokens_per_verify"] == 1.0


def test_cli_bench_rejects_bad_options_before_loading() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["bench", "--strategies", "warp", "-m", "/nonexistent.gguf"])
    assert result.exit_code == 1 and "unknown strategy 'warp'" in result.output
    result = runner.invoke(main, ["bench", "--tasks", "poetry", "-m", "/nonexistent.gguf"])
    assert result.exit_code == 1 and "unknown task poetry" in result.output
    result = runner.invoke(main, ["bench", "--serve", "-m", "/nonexistent.gguf"])
    assert result.exit_code == 2 and "--serve runs with --concurrency" in result.output


def test_text_report_has_a_table_per_class() -> None:
    from edgespec.bench.report import BenchResult, render_report

    records = [record("edit", "a", "plain", tokens=10, seconds=1.0, rounds=10),
               record("edit", "a", "lookup", tokens=10, seconds=0.5, rounds=4, drafted=8, accepted=6)]
    config = {"target": "/m/t.gguf", "draft": None, "temperature": 0.0, "max_tokens": 10, "n_threads": 2,
              "lookup_len": 4}
    text = render_report(BenchResult(config, records))
    assert "edit: 1 prompt(s), up to 10 tokens" in text
    row = next(line.split() for line in text.splitlines() if line.startswith("lookup"))
    assert row[:5] == ["lookup", "75%", "2.50", "20.0", "2.00x"] and row[-1] == "1/1"
    assert "speedup vs plain" in text and "draft none" in text
    assert "ceiling" not in text  # none was computed


def test_lookup_ceiling_pools_over_a_class_and_is_reported() -> None:
    from dataclasses import replace

    from edgespec.bench.report import BenchResult, render_report

    records = [replace(record("edit", "a", "plain", tokens=10, seconds=1.0, rounds=10), ceiling=2.0),
               replace(record("edit", "b", "plain", tokens=30, seconds=3.0, rounds=30), ceiling=1.0),
               record("edit", "a", "auto", tokens=10, seconds=0.8, rounds=8)]
    summary = summarize(records)["edit"]
    assert summary["plain"].ceiling == pytest.approx(40 / (10 / 2.0 + 30 / 1.0))  # pooled like the rates
    assert summary["auto"].ceiling is None
    config = {"target": "/m/t.gguf", "draft": None, "temperature": 0.0, "max_tokens": 30, "n_threads": 2,
              "lookup_len": 4, "ceiling_max_gamma": 16}
    text = render_report(BenchResult(config, records))
    assert "lookup ceiling 1.14x" in text
    assert next(line.split() for line in text.splitlines() if line.startswith("(ceiling)")) == [
        "(ceiling)", "1.14x", "1.14x"]


def test_a_strategys_share_of_the_ceiling_is_taken_on_its_own_outputs() -> None:
    from dataclasses import replace

    from edgespec.bench.report import BenchResult, render_report

    # Auto's greedy output flipped at a near-tie into a text that copies less: its own ceiling is 1.2x, not plain's
    # 2.0x. 1.1x of plain's rate is half of what the best lookup schedule gets on auto's text, a tenth on plain's.
    records = [replace(record("edit", "a", "plain", tokens=10, seconds=1.0, rounds=10, text="copy"), ceiling=2.0),
               replace(record("edit", "a", "auto", tokens=11, seconds=1.0, rounds=9, text="edit"), ceiling=1.2),
               replace(record("edit", "a", "lookup", tokens=10, seconds=1.0, rounds=10, text="copy"), ceiling=1.005)]
    summary = summarize(records)["edit"]
    assert summary["auto"].speedup == pytest.approx(1.1)
    assert summary["auto"].ceiling_share == pytest.approx(0.5)
    assert summary["lookup"].ceiling_share is None  # nothing to take: no share
    assert summary["plain"].ceiling_share == pytest.approx(0.0)
    config = {"target": "/m/t.gguf", "draft": None, "temperature": 0.0, "max_tokens": 10, "n_threads": 2,
              "lookup_len": 4, "ceiling_max_gamma": 16}
    text = render_report(BenchResult(config, records))
    assert next(line.split() for line in text.splitlines() if line.startswith("auto"))[-2:] == ["0/1", "50%"]
    assert next(line.split() for line in text.splitlines() if line.startswith("lookup"))[-2:] == ["1/1", "-"]
    assert "of ceiling: the share of the lookup ceiling's gain" in text
    # Where a constraint forced tokens, the speedup is not lookup's alone: no share.
    forced = replace(records[1], forced=5)
    text = render_report(BenchResult(config, [records[0], forced]))
    assert next(line.split() for line in text.splitlines() if line.startswith("auto"))[-3:-2] == ["-"]


@pytest.mark.real
def test_costs_table_through_the_cli(tiny_model_path) -> None:
    import json

    from click.testing import CliRunner

    from edgespec.bench.probes import COST_WIDTHS
    from edgespec.cli.bench import bench

    path = str(tiny_model_path)
    result = CliRunner().invoke(bench, ["--costs", "--json", "-m", path, "-d", "none"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = json.loads(result.stdout)
    (costs,) = table["decode"].values()
    assert sorted(int(k) for k in costs) == sorted(COST_WIDTHS) and all(v > 0 for v in costs.values())
    (change,) = table["width_change"].values()
    assert 0 <= change < costs["16"]  # a graph built anew, not a decode's worth of work


@pytest.mark.real
def test_loop_cost_through_the_cli(tiny_model_path) -> None:
    """--loop-cost on a real model: plain and a draft at γ=4, greedy and at the temperature, each measured and
    replayed (the replay must reproduce each run's tokens, or the command fails)."""
    path = str(tiny_model_path)
    args = ["--loop-cost", "--json", "-m", path, "-d", path, "--n-ctx", "1024", "--tasks", "code-edit",
            "--max-tokens", "8", "--repeats", "1", "--temperature", "0.8"]
    result = CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["run"] for r in rows] == ["plain T=0", "plain T=0.8", "draft-4 T=0", "draft-4 T=0.8"]
    assert [r["sampling_path"] for r in rows[:2]] == ["argmax in llama.cpp", "top-40 in llama.cpp, rest in Python"]
    for r in rows:
        assert r["tokens_per_second"] > 0 and r["outside_ms_per_token"] > 0 and r["replayed_ms_per_token"] > 0


@pytest.mark.real
def test_loop_cost_with_penalties_and_logprobs_runs_them_side_by_side(tiny_model_path) -> None:
    path = str(tiny_model_path)
    args = ["--loop-cost", "--with-penalties-logprobs", "--json", "-m", path, "--draft", "none", "--n-ctx", "1024",
            "--tasks", "code-edit", "--max-tokens", "6", "--repeats", "1", "--temperature", "0"]  # fmt: skip
    result = CliRunner().invoke(main, ["bench", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["run"] for r in rows] == ["plain T=0", "plain T=0 +penalties+logprobs"]
    # Logprobs read the candidates (the penalised top-1 lies within the raw top 1 + 64) and each row's normaliser
    # from llama.cpp's graph, not whole rows.
    assert rows[1]["sampling_path"] == "top-65 in llama.cpp, rest in Python (log-normaliser in llama.cpp)"


# ----- many requests at once ------------------------------------------------------------------------------------
def test_concurrency_levels_parse_or_fail_clearly() -> None:
    from edgespec.bench.load import default_levels
    from edgespec.errors import EdgespecError

    assert default_levels("1, 2,4") == [1, 2, 4]
    for bad in ("", "two", "0,4", "1,17"):
        with pytest.raises(EdgespecError, match="concurrency"):
            default_levels(bad)


@pytest.mark.real
def test_cli_bench_concurrency_json(tiny_model_path: Path) -> None:
    args = ["bench", "-m", str(tiny_model_path), "-d", str(tiny_model_path), "--n-ctx", "1024",
            "--workloads", str(SHORT), "--tasks", "short-edit", "--max-tokens", "8",
            "--strategies", "draft-2,auto", "--no-peers", "--concurrency", "1,2", "--json"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)["records"]
    assert [(r["level"], r["strategy"]) for r in records] == [
        (1, "plain"), (1, "draft-2"), (1, "auto"), (2, "plain"), (2, "draft-2"), (2, "auto"), (2, "auto-serial"),
    ]  # fmt: skip
    for r in records:
        # one prompt, repeated to fill the level: one wave alone, two waves at N > 1
        assert len(r["requests"]) == (1 if r["level"] == 1 else 2 * r["level"])
        assert 0 < r["generated"] <= 8 * len(r["requests"])
        assert r["ttft_p50"] is not None and 0 < r["ttft_p50"] <= r["ttft_p95"] <= r["wall"]
        assert r["total_tokens_per_second"] > 0 and r["sampling_path"] == "argmax in llama.cpp"
    assert records[1]["acceptance"] is not None and records[0]["acceptance"] is None


def test_the_load_report_divides_by_plain_at_the_same_level() -> None:
    from edgespec.bench.load import LoadRecord, Request
    from edgespec.bench.load_report import render_load_report

    def record(level: int, strategy: str, tokens: int) -> LoadRecord:
        r = LoadRecord(level, "code-edit", strategy, wall=2.0)
        r.requests = [Request(0.0, 0.5, 2.0, tokens, 4, 2, "argmax in llama.cpp")]
        return r

    text = render_load_report(
        [record(1, "plain", 20), record(1, "auto", 30), record(4, "plain", 40), record(4, "auto", 38)],
        ["llama-server is not on PATH: its peer rows are skipped"],
        "header",
    )
    assert "1.50x" in text and "0.95x" in text and "note: llama-server" in text


def test_the_load_report_pools_rounds_and_shows_their_spread() -> None:
    from edgespec.bench.load import LoadRecord, Request
    from edgespec.bench.load_report import render_load_report

    def record(strategy: str, tokens: int, round_: int) -> LoadRecord:
        r = LoadRecord(4, "math", strategy, wall=2.0, round=round_)
        r.requests = [Request(0.0, 0.5, 2.0, tokens, 0, 0, "argmax in llama.cpp")]
        return r

    # round 0: auto 30/20 = 1.5x; round 1: auto 10/20 = 0.5x; pooled: 40/40 = 1.00x
    runs = [record("plain", 20, 0), record("auto", 30, 0), record("auto", 10, 1), record("plain", 20, 1)]
    text = render_load_report(runs, [], "header")
    auto_row = next(line for line in text.splitlines() if " math " in line and " auto " in line)
    assert "1.00x" in auto_row and "0.50-1.50" in auto_row and "rounds (2)" in text
    single = render_load_report(runs[:2], [], "header")
    assert "rounds" not in single and "1.50x" in single


@pytest.mark.real
def test_load_bench_rounds_rotate_the_strategies(tiny_model_path: Path) -> None:
    """Each round rotates which strategy goes first; auto-serial (the time-to-first-token reference) runs once."""
    from edgespec.bench.load import run_load_bench
    from edgespec.models.backend import Model

    tasks = load_tasks(["short-edit"], source=SHORT)
    params = SamplingParams(temperature=0, max_tokens=3)
    with Model(tiny_model_path, n_ctx=512, n_seq=2) as target:
        records, _ = run_load_bench(target, None, tasks, ["auto"], params, [2], lookup_len=4, peers=False, repeats=2)
    assert [(r.round, r.strategy) for r in records] == [
        (0, "plain"), (0, "auto"), (0, "auto-serial"), (1, "auto"), (1, "plain"),
    ]  # fmt: skip


@pytest.mark.real
def test_each_load_run_of_auto_starts_with_an_empty_suffix_cache(tiny_model_path: Path, monkeypatch) -> None:
    """auto's engine lives through a level, its suffix cache with it: emptied before each run, a class drafts from
    its own earlier replies only, never from another class's or from an earlier round's replies to the same prompts."""
    from edgespec.bench import load
    from edgespec.drafters.suffix_cache import SuffixCache
    from edgespec.models.backend import Model

    caches: list[SuffixCache] = []
    original_init, original_loop = SuffixCache.__init__, load.closed_loop

    def tracked(self, *args, **kwargs):  # noqa: ANN001, ANN202
        original_init(self, *args, **kwargs)
        caches.append(self)

    at_start: list[int] = []

    def closed_loop(runner, jobs, clients, params):  # noqa: ANN001, ANN202
        at_start.append(sum(c.tokens for c in caches))
        return original_loop(runner, jobs, clients, params)

    monkeypatch.setattr(SuffixCache, "__init__", tracked)
    monkeypatch.setattr(load, "closed_loop", closed_loop)
    tasks = load_tasks(["short-edit", "short-json"], source=SHORT)
    params = SamplingParams(temperature=0, max_tokens=4)
    with Model(tiny_model_path, n_ctx=1024, n_seq=1) as target:
        records, _ = load.run_load_bench(
            target, None, tasks, ["auto"], params, [1], lookup_len=4, peers=False, repeats=2
        )
    assert len(caches) == 1
    timed = dict(zip(((r.task, r.round, r.strategy) for r in records), at_start[-len(records) :], strict=True))
    assert [k for k in timed if k[2] == "auto"] and all(n == 0 for k, n in timed.items() if k[2] == "auto")
    assert any(n > 0 for k, n in timed.items() if k[2] == "plain")  # it held replies between auto's runs


FAKE_LLAMA_SERVER = '''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
with open(ARGV_LOG, "a") as log:
    log.write(json.dumps(args) + "\\n")
drafting = "-md" in args or "--spec-type" in args


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert isinstance(body["prompt"], list) and body["cache_prompt"] is False and body["stream"] is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["n_predict"]
        for _ in range(n):
            self.wfile.write(b'data: {"content": "x", "stop": false}\\n\\n')
        timings = {"predicted_n": n, "draft_n": 4 if drafting else 0, "draft_n_accepted": 3 if drafting else 0}
        self.wfile.write(("data: " + json.dumps({"content": "", "stop": True, "tokens_predicted": n,
                                                  "timings": timings}) + "\\n\\n").encode())


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
'''


@pytest.mark.real
def test_llama_server_on_path_runs_as_a_peer_at_each_level(tiny_model_path: Path, tmp_path: Path, monkeypatch) -> None:
    """A stand-in for llama.cpp's server binary (it answers /health and streams /completion as llama-server does):
    the bench starts it per level with -np N, plain, with -md and with each n-gram --spec-type, and reads its stream
    and timings. With two rounds the peers run in the first only, plain in both."""
    import stat
    import sys

    from edgespec.bench.load import run_load_bench
    from edgespec.models.backend import Model

    binary = tmp_path / "llama-server"
    binary.write_text(f"#!{sys.executable}\nARGV_LOG = {str(tmp_path / 'argv.jsonl')!r}\n{FAKE_LLAMA_SERVER}")
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    tasks = load_tasks(["short-edit"], source=SHORT)
    params = SamplingParams(temperature=0, max_tokens=6)
    with Model(tiny_model_path, n_ctx=512, n_seq=2) as target, Model(tiny_model_path, n_ctx=512, n_seq=2) as draft:
        records, notes = run_load_bench(target, draft, tasks, ["plain"], params, [2], lookup_len=4, repeats=2)
    assert notes == []
    assert sorted((r.round, r.strategy) for r in records) == [
        (0, "llama-server"), (0, "llama-server-draft"), (0, "llama-server-ngram-cache"), (0, "llama-server-ngram-mod"),
        (0, "plain"), (1, "plain"),
    ]  # fmt: skip
    by = {r.strategy: r for r in records}
    peer = by["llama-server"]
    assert len(peer.requests) == 4 and all(q.generated == 6 and q.first is not None for q in peer.requests)
    assert peer.acceptance is None
    for drafting in ("llama-server-draft", "llama-server-ngram-mod", "llama-server-ngram-cache"):
        assert by[drafting].acceptance == pytest.approx(0.75)
    # what each was started with, as the stand-in saw it
    started = [json.loads(line) for line in (tmp_path / "argv.jsonl").read_text().splitlines()]
    spec = sorted(a[a.index("--spec-type") + 1] for a in started if "--spec-type" in a)
    assert spec == ["ngram-cache", "ngram-mod"] and sum("-md" in a for a in started) == 1


@pytest.mark.real
def test_edgespec_serve_runs_as_a_peer_over_http(tiny_model_path: Path, tmp_path: Path) -> None:
    """With serve, the bench starts `edgespec serve --parallel N` and --parallel 1 on the same file and reads each
    request's first token, length and drafting from its stream."""
    from edgespec.bench.load import SERVE, SERVE_SERIAL, run_load_bench
    from edgespec.models.backend import Model

    short = tmp_path / "short.toml"  # a short prompt: each run prefills it 4 times in 4 engines and servers
    short.write_text('name = "short"\n[[prompts]]\nid = "a"\n[[prompts.messages]]\nrole = "user"\ncontent = "Hi"\n')
    tasks = load_tasks(source=short)
    params = SamplingParams(temperature=0, max_tokens=6)
    with Model(tiny_model_path, n_ctx=1024, n_seq=2) as target:
        records, notes = run_load_bench(
            target, None, tasks, ["plain"], params, [2], lookup_len=4, peers=False, serve=True
        )
    by = {r.strategy: r for r in records}
    assert set(by) == {"plain", SERVE, SERVE_SERIAL} and notes == []
    for strategy in (SERVE, SERVE_SERIAL):
        served = by[strategy]
        assert len(served.requests) == 4
        assert all(q.generated == 6 and q.first is not None and q.end >= q.first for q in served.requests)
        assert served.sampling_path == "edgespec serve"


@pytest.mark.real
def test_the_load_bench_calibrates_every_readout_before_its_timed_runs(tiny_model_path: Path, monkeypatch) -> None:
    """A constrained class reads top-k candidates where greedy reads the argmax: auto calibrates each readout once
    (seconds of decodes), and the warm-ups, not a timed run's first request, must pay for it."""
    from edgespec.bench.load import run_load_bench
    from edgespec.calibrate import Calibration
    from edgespec.models.backend import Model

    measured: list[str] = []
    original = Calibration.measure

    def counting(self, lane, ctx, readout):  # noqa: ANN001, ANN202
        measured.append(readout.kind)
        return original(self, lane, ctx, readout)

    monkeypatch.setattr(Calibration, "measure", counting)
    tasks = load_tasks(["short-edit", "short-json"], source=SHORT)
    seen_at_runs: list[list[str]] = []
    params = SamplingParams(temperature=0, max_tokens=4)
    with Model(tiny_model_path, n_ctx=1024, n_seq=2) as target:
        records, _ = run_load_bench(
            target, None, tasks, ["auto"], params, [2], lookup_len=4, peers=False,
            on_run=lambda record: seen_at_runs.append(list(measured)),
        )  # fmt: skip
    assert {r.task for r in records} == {"short-edit", "short-json"}
    assert sorted(set(measured)) == ["argmax", "top_k"]  # both readouts were calibrated...
    assert all(seen == seen_at_runs[0] for seen in seen_at_runs)  # ...all of it before the first timed run
