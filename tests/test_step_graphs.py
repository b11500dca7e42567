"""Decode steps captured as CUDA graphs (engine/step_graphs.py) and the graph-ready step they capture.

On the CPU: the buckets a step is padded to, and steps run eagerly at a captured step's shapes (rows padded to their
bucket with free slots, every column of the buffers read: ``EngineConfig.graph_shapes``) against plain steps on
SmolLM2 (real weights, the first default cases): the same tokens in float32; in bfloat16 the same tokens or a first
difference at a near tie (counted). The fixture model and a SmolLM2-shaped model are compared the same way in
tests/test_host_sync.py, which also holds both kinds of step to no host round trip. The option's plumbing
(``toolfid run --cuda-graphs``) is tested with the run's other options (tests/test_flags.py).

On a GPU: a replayed step against an eager step of the same shapes, token for token and gap for gap. CI has no GPU
(docs/testing.md): that test is skipped there, the one skip this needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def test_buckets_are_powers_of_two_and_the_slot_count() -> None:
    from lm_eval_toolfid.engine.step_graphs import bucket_for, buckets

    assert buckets(1) == (1,) and buckets(2) == (1, 2) and buckets(8) == (1, 2, 4, 8)
    assert buckets(6) == (1, 2, 4, 6) and buckets(17) == (1, 2, 4, 8, 16, 17)
    assert [bucket_for(n, 6) for n in range(1, 7)] == [1, 2, 4, 4, 6, 6]
    assert bucket_for(9, 64) == 16 and bucket_for(64, 64) == 64


def test_captured_steps_are_off_by_default_and_never_on_a_cpu() -> None:
    from lm_eval_toolfid.engine.config import EngineConfig, RunContext
    from lm_eval_toolfid.engine.decode_batch import step_graphs_for

    class Runner:  # what step_graphs_for reads of a model runner
        device, torch, stats, routes_on_device = torch.device("cpu"), torch, None, False

    assert EngineConfig().cuda_graphs is False and EngineConfig().graph_shapes is False
    on = RunContext(config=EngineConfig(cuda_graphs=True), near_tie=1e-3)
    assert step_graphs_for(Runner(), on) is None  # a CPU model: eager steps
    Runner.device = torch.device("cuda")
    assert step_graphs_for(Runner(), on) is not None
    assert step_graphs_for(Runner(), RunContext(config=EngineConfig(), near_tie=1e-3)) is None
    joint = RunContext(config=EngineConfig(cuda_graphs=True), near_tie=1e-3, joint=True, views=(None, "a"))
    assert step_graphs_for(Runner(), joint) is None  # PEFT's routing is built on the host: joint runs step eagerly
    Runner.routes_on_device = True
    assert step_graphs_for(Runner(), joint) is not None


def test_steps_above_the_cap_run_at_their_own_size_and_give_the_same_tokens() -> None:
    """``max_graph_rows``: a step whose bucket is above it is not captured (nor, with ``graph_shapes``, padded): it
    runs at its own size, as without graphs; the steps at or below it are padded to their bucket; every row's tokens
    are the plain steps' (the fixture model, 6 rows leaving at different steps)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench._stand_in import Budget
    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row
    from lm_eval_toolfid.prompts.prompter import render_prompt
    from lm_eval_toolfid.prompts.settings import PromptSettings

    base = fixture_paths()["base"]
    tok, model = AutoTokenizer.from_pretrained(base), AutoModelForCausalLM.from_pretrained(base).eval()
    prompts = [tok(render_prompt(c, PromptSettings(demos=0)))["input_ids"] for c in load_cases("fixture")[:6]]

    def run(**config: Any) -> tuple[list[list[int]], list[int]]:
        rows = [Row(prompt=p, max_new=12, stopper=Budget(3 + 2 * i)) for i, p in enumerate(prompts)]
        engine = GreedyEngine(model, int(tok.pad_token_id or 0), EngineConfig(max_batch=6, refill=1, fold_gqa=False,
                                                                              **config))
        return [r.tokens for r in engine.run(rows)], list(engine.stats.step_rows)

    plain, plain_rows = run()
    capped, capped_rows = run(graph_shapes=True, max_graph_rows=4)
    assert capped == plain
    assert capped_rows == [{1: 1, 2: 2, 3: 4, 4: 4}.get(n, n) for n in plain_rows], (capped_rows, plain_rows)
    assert 3 in plain_rows and 5 in plain_rows  # a step padded (3 rows -> 4), one above the cap at its own size


def test_a_capture_that_fails_is_said_once_and_the_run_steps_eagerly(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A decode step the graph cannot hold (an operation not capturable, memory): one line in the log, that step and
    every later one run eagerly (the same logits), the statistics as if no capture had been tried. Simulated here (no
    GPU in CI): the capture raises what torch raises for a CUDA error."""
    import logging

    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.engine.step_graphs import StepGraphs

    def broken(self: Any, step: Any) -> Any:
        self.stats.forward_passes += 2  # the warm-up passes ran, then the capture failed
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore detail")

    monkeypatch.setattr(StepGraphs, "_capture", broken)
    stats = EngineStats()
    graphs = StepGraphs(torch, stats, max_rows=4)
    assert graphs.usable(4) and not graphs.usable(8)  # buckets above the cap are not captured
    logits = torch.arange(6.0)
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        assert graphs.run(2, 0, lambda: logits) is logits
    assert not graphs.usable(1) and graphs.failed == ("RuntimeError: CUDA error: operation not permitted when stream "
                                                      "is capturing")
    assert stats.forward_passes == 0 and stats.graph_captures == 0 and stats.steps_replayed == 0
    lines = [r.getMessage() for r in caplog.records if "could not be captured" in r.getMessage()]
    assert len(lines) == 1 and "run eagerly" in lines[0] and "\n" not in lines[0]


SIZES = {"float32": (4, 20), "bfloat16": (4, 12)}
"""Default cases and token budget per dtype (bfloat16 matrix products are slow on a CPU)."""


def _smol_rows(path: Path, model: Any, cases: int, max_new: int) -> tuple[list[Any], int]:
    from transformers import AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.engine.decoding import Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper, eos_token_ids
    from lm_eval_toolfid.prompts.prompter import render_prompt
    from lm_eval_toolfid.prompts.settings import PromptSettings

    tok = AutoTokenizer.from_pretrained(path)
    eos = eos_token_ids(model, tok)
    prompts = [tok(render_prompt(c, PromptSettings(demos=0)))["input_ids"] for c in load_cases("default")[:cases]]
    budgets = [max_new - i * (max_new // 5) for i in range(len(prompts))]  # rows leave at different steps
    rows = [Row(prompt=p, max_new=n, stopper=RowStopper(tok, eos, ["\n###"], n)) for p, n in zip(prompts, budgets)]
    return rows, int(tok.pad_token_id if tok.pad_token_id is not None else eos[0])


def _run(model: Any, path: Path, **config: Any) -> tuple[list[Any], Any]:
    """SmolLM2's rows in 4 slots (as rows leave, 3 live rows are padded to the bucket of 4)."""
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine

    cases, max_new = SIZES[str(model.dtype).removeprefix("torch.")]
    rows, pad = _smol_rows(path, model, cases, max_new)
    engine = GreedyEngine(model, pad, EngineConfig(max_batch=cases, refill=1, record_gaps=True, **config))
    return engine.run(rows), engine.stats


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_steps_at_captured_shapes_give_plain_steps_tokens_on_smollm2(smollm2: Path, dtype: str) -> None:
    """Rows padded to their bucket and every column read give each row's tokens of plain steps; bfloat16: a row may
    differ only from a near tie on."""
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.engine.config import near_tie_for

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=getattr(torch, dtype)).eval()
    plain, plain_stats = _run(model, smollm2)
    padded, stats = _run(model, smollm2, graph_shapes=True)
    assert stats.steps_replayed == 0 and len(stats.step_rows) == len(plain_stats.step_rows) > SIZES[dtype][1] // 2
    assert set(stats.step_rows) <= {1, 2, 4}  # every step at its bucket: some padded
    assert all(p >= q for p, q in zip(stats.step_rows, plain_stats.step_rows)) and stats.step_rows != plain_stats.step_rows
    bound = near_tie_for(model.dtype)
    for i, (a, b) in enumerate(zip(plain, padded)):
        if dtype == "float32" or a.tokens == b.tokens:
            assert a.tokens == b.tokens, i
            continue
        j = next((k for k, (s, t) in enumerate(zip(a.tokens, b.tokens)) if s != t), min(len(a.tokens), len(b.tokens)))
        gap = min(a.gaps[j] if j < len(a.gaps) else bound, b.gaps[j] if j < len(b.gaps) else bound)
        assert gap < bound, f"case {i} differs at token {j} (top-two gap {gap:.3g}): not a near tie"


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU: CI has none (docs/testing.md); run it on a GPU machine")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_steps_equal_eager_steps_of_the_same_shapes_on_a_gpu(smollm2: Path, dtype: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=getattr(torch, dtype)).to("cuda").eval()
    eager, eager_stats = _run(model, smollm2, graph_shapes=True)
    replayed, stats = _run(model, smollm2, cuda_graphs=True)
    assert [r.tokens for r in replayed] == [r.tokens for r in eager]
    assert [r.gaps for r in replayed] == [r.gaps for r in eager]  # bit for bit: the same kernels, replayed
    assert stats.steps_replayed == len(stats.step_rows) == len(eager_stats.step_rows) > 0
    # one capture per bucket (1, 2, 4) and allocation of the decode buffers
    assert stats.step_rows == eager_stats.step_rows and 1 <= stats.graph_captures < len(stats.step_rows)
    assert stats.capture_seconds > 0 and stats.graph_bytes >= 0


def test_the_option_reaches_the_model_and_a_cpu_run_ignores_it_in_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """``toolfid run --cuda-graphs on|off`` (default off) becomes the plan's model option, the session's model arg
    ``cuda_graphs`` and the engine's config; it does not apply to a server or vLLM (one line); on the CPU the model
    says once that it ignores it."""
    import logging

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.cli import parse_args
    from lm_eval_toolfid.cli.run import plan_command
    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    def plan(*extra: str) -> Any:
        return plan_command(parse_args(["run", "--base", "b", "--adapter", "x=a", *extra]))

    assert plan().plan.models.cuda_graphs is False and plan("--cuda-graphs", "off").plan.models.cuda_graphs is False
    assert plan("--cuda-graphs", "on").plan.models.cuda_graphs is True
    for other in (["--server", "http://127.0.0.1:9"], ["--backend", "vllm"]):
        with pytest.raises(ToolfidError, match=r"^--cuda-graphs does not apply to"):
            plan("--cuda-graphs", "on", *other)
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        lm = ToolfidHFLM(pretrained=str(fixture_paths()["base"]), device="cpu", batch_size=2, cuda_graphs=True)
    assert lm.cuda_graphs is False
    said = [r.getMessage() for r in caplog.records if "cuda-graphs" in r.getMessage()]
    assert said == ["toolfid: --cuda-graphs on ignored: the model is on cpu (CUDA graphs need a CUDA device)"]


def test_captures_are_counted_in_the_memory_budget_and_shown_under_verbose(monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` batch size counts each row's share of the captured steps' memory; a run's captures reach the view's
    generation record and the ``--verbose`` header (steps replayed of all, captures, seconds, memory)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.engine.config import EngineStats
    from lm_eval_toolfid.integrations.lm_eval import batch_size
    from lm_eval_toolfid.integrations.lm_eval.generation_record import (GenerationInfo, step_graphs_record,
                                                                         summarize_generation)
    from lm_eval_toolfid.reporting.screen import generation_paths

    model = AutoModelForCausalLM.from_pretrained(fixture_paths()["base"])
    monkeypatch.setattr(batch_size, "free_memory", lambda device: 1 << 36)
    plain = batch_size.auto_batch_size(model, "cuda", [300] * 10**6)
    graphs = batch_size.auto_batch_size(model, "cuda", [300] * 10**6, graphs=True)
    per_row, extra = batch_size.kv_bytes_per_token(model) * 300, batch_size.graph_bytes_per_row(model)
    assert graphs < plain and abs(graphs - plain * per_row / (per_row + extra)) <= 1, (plain, graphs)

    assert step_graphs_record(EngineStats(step_rows=[4, 4])) is None  # nothing captured: nothing said
    stats = EngineStats(step_rows=[4, 4, 2, 1], steps_replayed=4, graph_captures=3, capture_seconds=0.4567,
                        graph_bytes=3 << 20)
    record = step_graphs_record(stats)
    gen = summarize_generation([GenerationInfo(engine="toolfid", step_graphs=record), GenerationInfo(engine="toolfid")],
                               adapter_view=False)
    assert gen["step_graphs"] == {"steps_replayed": 4, "steps": 4, "captures": 3, "capture_seconds": 0.457,
                                  "graph_bytes": 3 << 20}
    shown = generation_paths([], SimpleNamespace(label="base", toolfid={"generation": gen}))
    assert " ".join(shown.split()) == "decode steps replayed from CUDA graphs: base 4 of 4 steps (3 captures, 0.46 s, 3 MiB)"
