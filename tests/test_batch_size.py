"""Batch sizing (``auto`` from free memory and the model) and the out-of-memory fallback.

The memory query is mocked (no GPU here); the model, the engine and the task view are real.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def fixture_lm() -> Any:
    import torch

    from lm_eval_toolfid.cases.bundled import fixture_paths
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    torch.set_num_threads(1)
    return ToolfidHFLM(pretrained=fixture_paths()["base"], batch_size="auto", device="cpu")


def test_kv_bytes_per_token_from_the_config(fixture_lm: Any) -> None:
    from lm_eval_toolfid.integrations.lm_eval.batch_size import kv_bytes_per_token

    config = fixture_lm.model.config  # 3 layers, 4 kv heads of 16, float32
    assert kv_bytes_per_token(fixture_lm.model) == 2 * config.num_hidden_layers * 4 * 16 * 4


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_auto_batch_is_what_free_memory_holds(fixture_lm: Any, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    from lm_eval_toolfid.integrations.lm_eval import batch_size as bs

    model = fixture_lm.model
    rows = [300] * 100 + [1000]  # every row counted at the longest
    per_row = bs.kv_bytes_per_token(model) * 1000
    reserve = bs.activation_reserve(model, bs.prefill_tokens_for(device), bs.verify_logits_for(device))
    cap = 101 if device == "cuda" else bs.CPU_MAX_BATCH

    def with_free(free: int | None) -> int:
        monkeypatch.setattr(bs, "free_memory", lambda _device: free)
        return bs.auto_batch_size(model, device, rows)

    assert with_free(None) == cap  # unknown memory: the whole view (CPU: the throughput cap)
    assert with_free(10**13) == cap  # plenty: the whole view in one batch on CUDA
    for fits in (1, 7, 20):
        free = int((reserve + fits * per_row + per_row // 2) / bs.MEMORY_FRACTION)
        assert with_free(free) == min(fits, cap)
    assert with_free(0) == 1  # never zero rows


def test_is_oom_knows_cuda_and_cpu_allocator_errors() -> None:
    import torch

    from lm_eval_toolfid.integrations.lm_eval.batch_size import is_oom

    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("[enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't allocate memory"))
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))


def test_halving_stops_at_one_row_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from lm_eval_toolfid.core.errors import ToolfidError
    from lm_eval_toolfid.integrations.lm_eval.batch_size import halve_on_oom

    tried = []

    def run(batch: int, prefill: int) -> None:
        tried.append((batch, prefill))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(ToolfidError, match="out of memory generating one row at a time"):
        halve_on_oom(run, 8, device="cpu", prefill_tokens=1024)
    assert [b for b, _ in tried] == [8, 4, 2, 1]
    assert tried[-1][1] == 256
    with pytest.raises(RuntimeError, match="shape"):
        halve_on_oom(lambda b, p: (_ for _ in ()).throw(RuntimeError("shape")), 8, device="cpu")


def test_a_view_out_of_memory_halves_its_batch_says_so_and_loses_nothing(
        fixture_lm: Any, toolfid_home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A real fixture view whose engine runs out of memory above 4 rows: it halves 16 -> 8 -> 4, one
    warning line each, and generates exactly what a batch-4 view generates."""
    import lm_eval.evaluator
    import torch
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from lm_eval_toolfid.cases.bundled import fixture_paths, tasks_path
    from lm_eval_toolfid.engine import decoding

    lm_eval.evaluator.get_git_commit_hash = lambda: None
    base = fixture_paths()["base"]
    task = "tool_use_fidelity_fixture"

    def view(batch: Any) -> tuple[dict, dict[str, str]]:
        fixture_lm.batch_size_per_gpu = batch
        manager = TaskManager(include_path=str(tasks_path()), include_defaults=False,
                              metadata={"pretrained": base, "write_reference": False})
        out = simple_evaluate(model=fixture_lm, model_args={"pretrained": base}, tasks=[task], task_manager=manager,
                              log_samples=True, bootstrap_iters=0, limit=20)
        return out, {s["doc"]["id"]: s["resps"][0][0] for s in out["samples"][task]}

    _, want = view(4)
    original = decoding.GreedyEngine.run

    def run(self: Any, rows: Any, on_done: Any = None) -> Any:
        if self.config.max_batch > 4:
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (batch {self.config.max_batch})")
        return original(self, rows, on_done=on_done)

    monkeypatch.setattr(decoding.GreedyEngine, "run", run)
    with caplog.at_level(logging.WARNING, logger="lm_eval.toolfid"):
        out, got = view(16)
    assert got == want
    lines = [r.getMessage() for r in caplog.records if "out of memory" in r.getMessage()]
    assert lines == ["toolfid: out of memory with batch 16 on cpu; running the view again with batch 8",
                     "toolfid: out of memory with batch 8 on cpu; running the view again with batch 4"]
    record = out["configs"][task]["metadata"]["toolfid"]["generation"]
    assert record["decode_batch"] == 4 and record["oom_halvings"] == 2


@pytest.mark.parametrize("total_gib,expected", [(80, 1 << 30), (16, (16 << 30) // 64), (2, 64 * 1024 * 1024)])
def test_verification_logits_budget_follows_the_card(monkeypatch: pytest.MonkeyPatch, total_gib: int,
                                                     expected: int) -> None:
    """CUDA verifies drafts in larger passes (fewer launches), but at most 1/64 of the card's memory in logit
    values, never below the CPU figure; halving the prefill budget halves it; CPU keeps its figure."""
    import types

    import torch

    from lm_eval_toolfid.integrations.lm_eval import batch_size as bs

    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda _device: types.SimpleNamespace(total_memory=total_gib << 30))
    assert bs.verify_logits_for("cuda") == expected
    assert bs.verify_logits_for("cuda", bs.PREFILL_TOKENS["cuda"] // 2) == expected // 2
    assert bs.verify_logits_for("cpu") == bs.VERIFY_LOGITS["cpu"] == 64 * 1024 * 1024
