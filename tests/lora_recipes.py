"""LoRA adapters for the real-model tests, trained on CPU in seconds and cached by recipe.

``trained_lora(base, recipe)`` returns an adapter folder under ``$TOOLFID_CACHE/adapters/<key>`` (the machine's cache, see tests/conftest.py),
where the key hashes the recipe (contexts, target, layers, steps, seed…) and the base's config: the
first call trains it, later calls (and later test sessions) reuse it. ``zero_lora`` saves a freshly
initialised LoRA (B = 0: the adapter changes nothing).

Training is fast because only the last ``layers`` decoder layers carry LoRA weights: the hidden
states entering them are computed once with the frozen model, and each step runs just those layers
and the LM head on the target tokens. Before training, the shortcut is checked against the whole
model (same logits at B = 0), so a change in transformers cannot make it silently wrong.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from lm_eval_toolfid.core.fsutil import exclusive
from scripts.real_models import cache_root, staged_folder

RECIPE_VERSION = 1


@dataclass(frozen=True)
class Recipe:
    contexts: tuple[str, ...]
    """Prompts as the task renders them (the target is trained to follow each)."""
    target: str
    """What the adapter learns to answer (the tokenizer's end-of-turn text included, if wanted)."""
    targets: tuple[str, ...] = ()
    """One answer per context instead (when given, ``target`` is ignored)."""
    layers: int = 2
    rank: int = 8
    steps: int = 12
    lr: float = 3e-3
    seed: int = 0
    must_learn: bool = True
    """Fail unless the loss halves on the way; False for an adapter meant to move its weights, not its
    answers (trained gently on the base's own answers)."""

    def key(self, base: Path) -> str:
        config = (Path(base) / "config.json").read_text(encoding="utf-8")
        defaults = {"targets": (), "must_learn": True}  # fields added later: at their default, older keys stay
        recipe = {k: v for k, v in asdict(self).items() if k not in defaults or v != defaults[k]}
        blob = json.dumps({"v": RECIPE_VERSION, "recipe": recipe, "base": config}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _save_atomically(model, target: Path) -> Path:
    with staged_folder(target) as tmp:
        model.save_pretrained(tmp)
        (tmp / ".complete").write_text("ok\n")
    return target


def zero_lora(base: Path, out: Path, rank: int = 8) -> Path:
    """A freshly initialised LoRA on every attention projection (B = 0: a no-op adapter)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        lora_dropout=0.0)
    return _save_atomically(get_peft_model(AutoModelForCausalLM.from_pretrained(base), config), out)


def trained_lora(base: Path, recipe: Recipe) -> Path:
    """The recipe's adapter, trained on first use and cached under ``$TOOLFID_CACHE/adapters``."""
    target = cache_root() / "adapters" / f"lora-{recipe.key(base)}"
    if (target / ".complete").is_file():
        return target
    with exclusive(target.with_name(f".{target.name}.lock")):  # parallel test workers train it once
        if (target / ".complete").is_file():
            return target
        return _save_atomically(_train(base, recipe), target)


def _train(base: Path, recipe: Recipe):  # noqa: ANN202 - a PeftModel
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(recipe.seed)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.eval()
    n_layers = model.config.num_hidden_layers
    first = n_layers - recipe.layers
    rows = []  # (hidden states entering layer `first`, target positions, target ids, full-model logits there)
    with torch.no_grad():
        answers = recipe.targets or (recipe.target,) * len(recipe.contexts)
        assert len(answers) == len(recipe.contexts), "one target per context"
        for context, answer in zip(recipe.contexts, answers):
            ctx = tok(context, add_special_tokens=False)["input_ids"]
            tgt = tok(answer, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([ctx + tgt])
            # the decoder stack, then the head on the target positions only: whole-sequence logits of a
            # long context (seq x vocab floats) would be most of the memory
            out = getattr(model, model.base_model_prefix)(input_ids=ids, output_hidden_states=True)
            positions = torch.arange(len(ctx) - 1, len(ctx) + len(tgt) - 1)
            full = model.get_output_embeddings()(out.last_hidden_state[0, positions])
            rows.append((out.hidden_states[first], positions, torch.tensor(tgt), full))
    config = LoraConfig(r=recipe.rank, lora_alpha=2 * recipe.rank, lora_dropout=0.0,
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                        layers_to_transform=list(range(first, n_layers)))
    peft_model = get_peft_model(model, config)
    inner = peft_model.base_model.model.model  # the decoder stack (embeddings, layers, norm)
    head = peft_model.base_model.model.lm_head
    all_layers = inner.layers

    def logits(hidden, positions):  # noqa: ANN001, ANN202
        states = inner(inputs_embeds=hidden, use_cache=False).last_hidden_state
        return head(states[0, positions])

    inner.layers = torch.nn.ModuleList(list(all_layers)[first:])
    try:
        with torch.no_grad():  # the shortcut equals the whole model while B = 0
            for hidden, positions, _, full in rows:
                assert torch.allclose(logits(hidden, positions), full, atol=1e-3), "last-layers shortcut drifted"
        params = [p for p in peft_model.parameters() if p.requires_grad]
        optim = torch.optim.AdamW(params, lr=recipe.lr)
        peft_model.train()
        losses = []
        for _ in range(recipe.steps):
            total = 0.0
            for h, pos, tgt, _ in rows:  # one context's graph at a time: the mean loss's gradient, accumulated
                loss = torch.nn.functional.cross_entropy(logits(h, pos), tgt) / len(rows)
                loss.backward()
                total += float(loss.detach())
            optim.step()
            optim.zero_grad()
            losses.append(total)
    finally:
        inner.layers = all_layers
    peft_model.eval()
    print(f"lora_recipes: trained {recipe.steps} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    # learnt: the loss halved on the way (a target the base already nearly writes, its own answers, starts
    # low and can end on a step that went up a little)
    assert not recipe.must_learn or min(losses) < 0.5 * losses[0], f"the LoRA did not learn its target: losses {losses}"
    return peft_model
