"""A real instruct model (SmolLM2-135M-Instruct) end to end through the ``lm_eval`` CLI.

Three runs on a small subset of the default cases (the shortest, no demos to keep prompts and
CPU time small; 1 torch thread, since 2 threads on 2 busy cores are ~10x slower): the base
(stores the reference), a LoRA trained for a few CPU steps on plain prose (another skill), and a
freshly initialised LoRA (B = 0, a no-op) whose generations must equal the base's, case by case.

The model is prepared by the session fixture ``smollm2`` (conftest.py) from the package scripts/setup.sh
installs; a missing package fails the test with the command to run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lm_eval_toolfid.core.records import PairScore

from .lm_eval_helpers import lm_eval_cli, lm_eval_here, metrics, read_run, toolfid_meta

pytestmark = pytest.mark.slow
TASK = "tool_use_fidelity"
N_CASES = 5
GEN = ["--gen_kwargs", "max_gen_toks=64", "--batch_size", str(N_CASES)]
PROSE = [
    "The river bends slowly past the old mill, where swallows nest under the eaves every spring.",
    "She poured the tea, watched the steam curl, and said nothing for a long while.",
    "In winter the harbour freezes at the edges and the fishing boats stay tied up for weeks.",
    "A good loaf needs time: flour, water, salt, and a patient night in a cool kitchen.",
]


def _subset(path: Path) -> Path:
    from lm_eval_toolfid.cases.bundled import default_cases_path

    lines = [line for line in default_cases_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    lines.sort(key=lambda line: (len(line), line))
    path.write_text("\n".join(lines[:N_CASES]) + "\n", encoding="utf-8")
    return path


PROSE_STEPS = 20


def _prose_key(base: Path) -> str:
    """The prose LoRA's cache key: what it is trained on and how, and the base's config."""
    import hashlib
    import json

    blob = json.dumps({"v": 1, "prose": PROSE, "steps": PROSE_STEPS, "lr": 2e-3, "r": 8, "alpha": 16, "seed": 0,
                       "targets": ["q_proj", "v_proj"], "base": (Path(base) / "config.json").read_text()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _prose_lora(base: Path) -> Path:
    """A LoRA trained for a few CPU steps on plain prose (another skill), saved with peft; trained once per machine
    and cached under ``$TOOLFID_CACHE/adapters`` by its key (a file lock: two workers train it once; the folder
    appears by an atomic rename), as tests/lora_recipes.py caches the other test LoRAs."""
    from lm_eval_toolfid.core.fsutil import exclusive
    from scripts.real_models import cache_root, staged_folder

    target = cache_root() / "adapters" / f"real-model-prose-{_prose_key(base)}"
    if (target / ".complete").is_file():
        return target
    with exclusive(target.with_name(f".{target.name}.lock")):
        if (target / ".complete").is_file():
            return target
        model = _train_prose(base)
        with staged_folder(target) as tmp:
            model.save_pretrained(tmp)
            (tmp / ".complete").write_text("ok\n")
    return target


def _train_prose(base: Path):  # noqa: ANN202 - a PeftModel
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(base)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
    model.train()
    batch = tok(PROSE, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-3)
    first = last = None
    for _ in range(PROSE_STEPS):
        loss = model(**batch, labels=labels).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        first = first if first is not None else loss.item()
        last = loss.item()
    assert last < first  # it did learn the prose
    return model


def _adapters(base: Path, root: Path) -> tuple[Path, Path]:
    """(prose-trained LoRA, fresh no-op LoRA), both saved with peft."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    fresh = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
    fresh.save_pretrained(root / "fresh")
    return _prose_lora(base), root / "fresh"


@pytest.fixture(scope="module")
def runs(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    import os

    os.environ["OMP_NUM_THREADS"] = "1"  # inherited by the lm_eval subprocesses
    root = tmp_path_factory.mktemp("real")
    home = root / "home"
    meta = {"cases": str(_subset(root / "cases.jsonl")), "demos": 0}
    prose, fresh = _adapters(smollm2, root / "adapters")
    out = {}
    for name, args in [("base", f"pretrained={smollm2}"), ("prose", f"pretrained={smollm2},peft={prose}"),
                       ("fresh", f"pretrained={smollm2},peft={fresh}")]:
        run = lm_eval_cli if name == "base" else lm_eval_here  # the adapters: lm-eval's entry point, in process
        proc = run(args, root / name, home, metadata=meta, task=TASK, extra=GEN)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = read_run(root / name, TASK)
    return out


def _generations(samples: list[dict]) -> dict[str, str]:
    return {s["doc"]["id"]: s["resps"][0][0] for s in samples}


def test_base_run_generates_and_scores_every_case(runs: dict) -> None:
    results, samples = runs["base"]
    m = metrics(results, TASK)
    assert len(samples) == N_CASES
    assert 0.0 <= m["json_valid_rate"] <= m["parse_rate"] <= 1.0
    assert any(g.strip() for g in _generations(samples).values())
    assert Path(toolfid_meta(results, TASK)["reference_written"]).is_file()


def test_fresh_lora_is_identical_to_the_base(runs: dict) -> None:
    (_, base_samples), (results, samples) = runs["base"], runs["fresh"]
    assert _generations(samples) == _generations(base_samples)
    m = metrics(results, TASK)
    assert m["validity_delta"] == 0.0
    assert m["base_json_valid_rate"] == m["json_valid_rate"]
    if "identical_output_rate" in m:
        assert m["identical_output_rate"] == 1.0
    assert toolfid_meta(results, TASK)["pairing"].startswith("reference store")


def test_prose_lora_pairs_with_the_base_and_gets_a_verdict(runs: dict) -> None:
    (base_results, _), (results, samples) = runs["base"], runs["prose"]
    m = metrics(results, TASK)
    assert m["base_json_valid_rate"] == pytest.approx(metrics(base_results, TASK)["json_valid_rate"])
    verdict = toolfid_meta(results, TASK)["verdict"]
    assert verdict["passed"] in {True, False, None} and verdict["gates"]
    assert verdict.get("label", "PASS") in {"PASS", "FAIL", "UNDECIDED"}  # label: once the lead's verdict lands
    records = [PairScore.model_validate(s["fidelity_pass"]) for s in samples]
    assert {r.case_id for r in records} == {s["doc"]["id"] for s in samples}
    assert all(r.base is not None for r in records)
