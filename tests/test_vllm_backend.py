"""The engine-independent half of ``--backend vllm``: collect every view's requests, generate them
in one call, replay each view through lm-eval. With a Hugging Face stand-in engine (the fixture
model and two of its adapters, generating per view) the prefetched views must equal
``runner.run_plan`` (the ``toolfid run`` path) metric for metric and generation for generation.
The vLLM engine itself is not exercised here (no GPU, no vLLM).
"""

from __future__ import annotations

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cases.load import load_cases
from lm_eval_toolfid.core.errors import ToolfidError

TASK = "tool_use_fidelity_fixture"


def test_missing_vllm_is_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from lm_eval_toolfid.integrations.vllm import backend as vllm_backend

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(ToolfidError, match="needs vLLM"):
        vllm_backend.require_vllm()


@pytest.mark.slow
def test_prefetched_views_equal_toolfid_run(toolfid_home, tmp_path) -> None:
    from lm_eval_toolfid.run.plan import ModelOptions, RunPlan
    from lm_eval_toolfid.run.runner import run_plan
    from lm_eval_toolfid.run.session import ModelSession
    from lm_eval_toolfid.integrations.vllm.backend import run_views_prefetched

    fix = fixture_paths()
    adapters = {name: fix["adapters"][name] for name in ("faithful", "broken")}
    meta = {"reference_dir": str(tmp_path / "ref-a")}
    session = ModelSession(fix["base"], ModelOptions(batch_size=16, device="cpu"))
    base_a, views_a = run_plan(RunPlan(fix["base"], adapters, TASK, meta), session)

    calls = []

    def generate_all(batch):
        calls.append(len(batch))

        class Req:
            def __init__(self, ctx, gen):
                self.args = (ctx, gen)

        texts = [None] * len(batch)
        for label in ["base", *adapters]:
            idx = [i for i, (_, _, view) in enumerate(batch) if view[0] == label]
            reqs = [Req(batch[i][0], batch[i][1]) for i in idx]
            if label == "base":
                with session.base_view():
                    out = session.lm.generate_until(reqs, disable_tqdm=True)
            else:
                session.activate("default" if label == "faithful" else label)
                out = session.lm.generate_until(reqs, disable_tqdm=True)
            for i, text in zip(idx, out):
                texts[i] = text
        return texts

    base_b, views_b = run_views_prefetched(fix["base"], adapters, TASK, {"reference_dir": str(tmp_path / "ref-b")},
                                           generate_all)
    assert calls == [3 * len(load_cases("fixture"))]  # every view's requests in ONE engine call

    def gens(view):
        return {s["doc"]["id"]: s["resps"][0][0] for s in view.samples}

    def mets(view):
        return {k: v for k, v in view.results["results"][TASK].items() if "stderr" not in k}

    assert gens(base_b) == gens(base_a) and mets(base_b) == mets(base_a)
    for a, b in zip(views_a, views_b):
        assert (a.label, gens(a), mets(a)) == (b.label, gens(b), mets(b))
        assert b.results["configs"][TASK]["metadata"]["toolfid"]["pairing"].startswith("reference store")
