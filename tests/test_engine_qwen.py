"""Exactness of the greedy engine on a real model: Qwen2.5-Coder-0.5B-Instruct, chat template.

A few of the shortest default cases, short budgets (a Qwen forward pass costs seconds on 2 CPU
cores). Token for token, per case:

- the engine's base view computed on shared prefixes (its tokens are the drafts below);
- verified against plain decoding for two LoRAs: B = 0 (a no-op: every base token accepted) and one
  trained for a few CPU steps (changes some answers: both accepted and decoded tokens).

An adapter that diverges at its first token (every token decoded, none accepted) is the engine's path for the
fixture's ``broken`` adapter in every schedule (tests/test_engine.py), and on Qwen's template the prose LoRA of
tests/test_qwen_coder.py goes through it in ``toolfid run`` (verified after the base, every answer decoded on past
its stop by ``--check-stops``) and gives ``lm_eval --model hf … peft=``'s answers case by case; this module ran it a
third time (about 20 s of Qwen) and no longer does.

Parallel (verification) and step-by-step (decoding) passes round differently; that can flip an
argmax only where the top two logits nearly tie. A difference is therefore allowed only at a near
tie (top-two gap below the engine's tolerance at the first differing token, in either pass), and is
counted and printed — never hidden. None has been seen on these cases.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow
N_CASES = 3
MAX_NEW = 40


OTHER_CALL = 'lookup_record", "arguments": {"query": "everything"}}'


def _common_prefix(texts: list[str]) -> str:
    prefix = texts[0]
    for t in texts[1:]:
        while not t.startswith(prefix):
            prefix = prefix[:-1]
    return prefix


@pytest.fixture(scope="module")
def qwen(qwen_coder: Path) -> dict[str, Any]:
    """The model (a B = 0 LoRA "zero" on it), its tokenizer and the checked prompts: the shortest
    default cases in Qwen's own chat template."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(qwen_coder)
    cases = load_cases("default")
    prompter = Prompter("chat", demos=0, model_args={"pretrained": str(qwen_coder)}, cases=cases)
    prompts = sorted((prompter.render(c) for c in cases if not c.history), key=len)[:N_CASES]
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(qwen_coder)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(model, config, adapter_name="zero")  # init_lora_weights=True: B = 0
    model.eval()
    assert isinstance(model, PeftModel)
    return {"model": model, "tok": tok, "prompts": prompts, "path": qwen_coder}


@pytest.fixture(scope="module")
def adapters(qwen: dict[str, Any], base_rows: list[Any]) -> None:
    """A LoRA trained in seconds (``tests/lora_recipes.py``, cached by recipe) and loaded beside "zero":
    ``trained`` writes the base's answers up to the tool name, then another tool (both accepted and decoded
    tokens)."""
    from .lora_recipes import Recipe, trained_lora

    tok, path = qwen["tok"], qwen["path"]
    prefix = _common_prefix([tok.decode(r.tokens) for r in base_rows])
    cut = prefix.rfind('"name": "')
    assert cut >= 0, f"the base's answers share no prefix up to a tool name: {prefix!r}"
    other = Recipe(contexts=tuple(qwen["prompts"]), target=prefix[:cut + len('"name": "')] + OTHER_CALL)
    qwen["model"].load_adapter(str(trained_lora(path, other)), adapter_name="trained")
    qwen["model"].eval()


def _rows(qw: dict[str, Any], drafts: list[list[int]] | None = None, max_new: int = MAX_NEW) -> list[Any]:
    from lm_eval_toolfid.engine.decoding import Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import eos_token_ids
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper

    tok = qw["tok"]
    eos = eos_token_ids(qw["model"], tok)
    return [Row(prompt=tok(p)["input_ids"], max_new=max_new, draft=drafts[i] if drafts else (),
                stopper=RowStopper(tok, eos, [tok.eos_token], max_new, call_end=True))
            for i, p in enumerate(qw["prompts"])]


def _run(qw: dict[str, Any], view: str | None, drafts: list[list[int]] | None = None,
         max_new: int = MAX_NEW) -> list[Any]:
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine

    model = qw["model"]
    if view is not None:
        model.set_adapter(view)
    with model.disable_adapter() if view is None else contextlib.nullcontext():
        engine = GreedyEngine(model, qw["tok"].pad_token_id, EngineConfig(max_batch=N_CASES, record_gaps=True))
        rows = engine.run(_rows(qw, drafts, max_new))
    qw["stats"] = engine.stats  # of the latest run
    return rows


def _near_tie_differences(a: list[Any], b: list[list[int]], gaps_b: list[list[float]] | None) -> list[str]:
    """Cases whose tokens differ; fails unless each first difference is at a near tie."""
    from lm_eval_toolfid.engine.decoding import NEAR_TIE

    found = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x.tokens == y[:len(x.tokens)]:
            continue
        j = next(k for k, (s, t) in enumerate(zip(x.tokens, y)) if s != t)
        gap = min(x.gaps[j], gaps_b[i][j] if gaps_b else x.gaps[j])
        assert gap < NEAR_TIE, f"case {i} differs at token {j} where the top-two gap is {gap:.4g}: not a near tie"
        found.append(f"case {i} token {j} gap {gap:.2e}")
    if found:
        print("near-tie differences:", "; ".join(found))
    return found


@pytest.fixture(scope="module")
def base_rows(qwen: dict[str, Any]) -> list[Any]:
    rows = _run(qwen, None)
    qwen["base_stats"] = qwen["stats"]
    return rows


def test_the_engine_shares_the_prompts_prefix_on_qwen(qwen: dict[str, Any], base_rows: list[Any]) -> None:
    """The engine computes the prompts' shared prefix (the chat template's system text and tools) once. That it then
    writes what ``generate`` writes on whole prompts is checked through the CLIs on Qwen's template by
    tests/test_qwen_coder.py (``toolfid lm-eval`` against plain ``lm_eval --model hf``: every case's outcome, calls
    and text) and token for token on SmolLM2 by tests/test_stop_flows.py; this module compared it token for token
    once more (about 26 s of Qwen) and no longer does."""
    assert all(r.tokens for r in base_rows)
    stats = qwen["base_stats"]  # the engine did share a prefix, and computed fewer prompt tokens than the prompts hold
    assert stats.shared_tokens > 0 and stats.prompt_tokens < stats.prompt_tokens_total


@pytest.mark.parametrize("view", ["zero", "trained"])
def test_verified_equals_plain_on_qwen(qwen: dict[str, Any], base_rows: list[Any], adapters: None, view: str) -> None:
    drafts = [r.tokens for r in base_rows]
    plain = _run(qwen, view)
    verified = _run(qwen, view, drafts)
    differences = _near_tie_differences(verified, [r.tokens for r in plain], [r.gaps for r in plain])
    assert len(differences) <= 1
    accepted = sum(r.accepted for r in verified)
    decoded = sum(r.decoded for r in verified)
    total = sum(len(r.tokens) for r in verified)
    if view == "zero":  # a no-op adapter: the base's answers, accepted whole, nothing decoded
        assert [r.tokens for r in plain] == drafts
        assert accepted == total and decoded == 0 or differences
    else:  # trained: some answers change, both paths used
        assert accepted > 0 and decoded > 0, (accepted, decoded)
        assert [r.tokens for r in plain] != drafts
