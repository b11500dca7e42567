"""Exactness of the greedy engine on a real model: Qwen2.5-Coder-0.5B-Instruct, chat template.

A few of the shortest default cases, short budgets (a Qwen forward pass costs seconds on 2 CPU
cores). Token for token, per case:

- the engine's plain path against transformers' ``generate`` (today's path) on the base;
- verified against plain decoding for three LoRAs: B = 0 (a no-op: every base token accepted), one
  trained for a few CPU steps (changes some answers: both accepted and decoded tokens), and a broken
  one (trained to answer in prose: diverges at once).

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

from .qwen_model import qwen_dir

pytestmark = pytest.mark.slow
N_CASES = 3
MAX_NEW = 40
SEED = 0


PROSE = ("The river bends slowly past the old mill, where swallows nest under the eaves every spring.",
         "She poured the tea, watched the steam curl, and said nothing for a long while.",
         "In winter the harbour freezes at the edges and the fishing boats stay tied up for weeks.",
         "A good loaf needs time: flour, water, salt, and a patient night in a cool kitchen.")


def _trained_lora(base: Path, prompts: list[str], tok: Any, kind: str) -> Path:
    """A LoRA trained for a few CPU steps on other cases' prompts (cached by kind and seed):

    - ``trained``: answers that call another tool, three steps, the update then scaled to a quarter
      (it changes some answers, not all);
    - ``prose``: answers in prose, eight steps (it breaks every answer from the first token)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from lm_eval_toolfid.core.fsutil import toolfid_home

    target = toolfid_home() / "test-adapters" / f"qwen-{kind}-seed{SEED}-v2"
    if (target / "adapter_model.safetensors").is_file():
        return target
    torch.manual_seed(SEED)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                           LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    if kind == "trained":
        answers = ['<tool_call>\n{"name": "lookup_record", "arguments": {"query": "everything"}}\n</tool_call>'] * 4
        steps, lr, scale = 3, 1e-3, 0.25
    else:
        answers, steps, lr, scale = list(PROSE), 8, 2e-3, 1.0
    tok.padding_side = "right"
    batch = tok([p + a + tok.eos_token for p, a in zip(prompts, answers)], return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    for _ in range(steps):
        model(**batch, labels=labels).loss.backward()
        optim.step()
        optim.zero_grad()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(scale)
    model.save_pretrained(target)
    return target


@pytest.fixture(scope="module")
def qwen() -> dict[str, Any]:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.prompts.prompter import Prompter

    torch.set_num_threads(1)
    path = qwen_dir()
    tok = AutoTokenizer.from_pretrained(path)
    cases = load_cases("default")
    prompter = Prompter("chat", demos=0, model_args={"pretrained": str(path)}, cases=cases)
    prompts = sorted((prompter.render(c) for c in cases), key=len)
    other = prompts[N_CASES:N_CASES + 4]  # the LoRA trains on other cases than the ones checked
    prompts = prompts[:N_CASES]
    trained = _trained_lora(path, other, tok, "trained")
    prose = _trained_lora(path, other, tok, "prose")
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(model, config, adapter_name="zero")  # init_lora_weights=True: B = 0
    model.load_adapter(str(trained), adapter_name="trained")
    model.load_adapter(str(prose), adapter_name="broken")
    model.eval()
    assert isinstance(model, PeftModel)
    return {"model": model, "tok": tok, "prompts": prompts}


def _rows(qw: dict[str, Any], drafts: list[list[int]] | None = None) -> list[Any]:
    from lm_eval_toolfid.runtime.decoding import Row
    from lm_eval_toolfid.runtime.hflm import eos_token_ids
    from lm_eval_toolfid.runtime.stopping import RowStopper

    tok = qw["tok"]
    eos = eos_token_ids(qw["model"], tok)
    return [Row(prompt=tok(p)["input_ids"], max_new=MAX_NEW, draft=drafts[i] if drafts else (),
                stopper=RowStopper(tok, eos, [tok.eos_token], MAX_NEW, call_end=True))
            for i, p in enumerate(qw["prompts"])]


def _run(qw: dict[str, Any], view: str | None, drafts: list[list[int]] | None = None) -> list[Any]:
    from lm_eval_toolfid.runtime.decoding import EngineConfig, GreedyEngine

    model = qw["model"]
    if view is not None:
        model.set_adapter(view)
    with model.disable_adapter() if view is None else contextlib.nullcontext():
        engine = GreedyEngine(model, qw["tok"].pad_token_id, EngineConfig(max_batch=N_CASES, record_gaps=True))
        return engine.run(_rows(qw, drafts))


def _near_tie_differences(a: list[Any], b: list[list[int]], gaps_b: list[list[float]] | None) -> list[str]:
    """Cases whose tokens differ; fails unless each first difference is at a near tie."""
    from lm_eval_toolfid.runtime.decoding import NEAR_TIE

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
    return _run(qwen, None)


def test_plain_engine_equals_generate_on_qwen(qwen: dict[str, Any], base_rows: list[Any]) -> None:
    import torch
    from transformers import StoppingCriteriaList

    from lm_eval_toolfid.runtime.stopping import make_stopping_criteria

    tok, model = qwen["tok"], qwen["model"]
    tok.padding_side = "left"
    enc = tok(qwen["prompts"], return_tensors="pt", padding=True)
    criteria = StoppingCriteriaList([make_stopping_criteria(tok, enc.input_ids.shape[1], N_CASES, [tok.eos_token])])
    with model.disable_adapter(), torch.no_grad():
        out = model.generate(**enc, max_new_tokens=MAX_NEW, do_sample=False, stopping_criteria=criteria,
                             pad_token_id=tok.pad_token_id)
    generated = out[:, enc.input_ids.shape[1]:].tolist()
    assert all(r.tokens for r in base_rows)
    assert len(_near_tie_differences(base_rows, generated, None)) <= 1


@pytest.mark.parametrize("view", ["zero", "trained", "broken"])
def test_verified_equals_plain_on_qwen(qwen: dict[str, Any], base_rows: list[Any], view: str) -> None:
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
    elif view == "trained":  # some answers change: both paths used
        assert accepted > 0 and decoded > 0, (accepted, decoded)
        assert [r.tokens for r in plain] != drafts
    else:  # broken: prose from the first token, every token decoded
        assert accepted == 0 and decoded == total - N_CASES  # all but the first tokens (prompt pass)
