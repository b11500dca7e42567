"""The early-stop property on real generations, shared by tests/test_stop_real.py and bench/bench_stop_check.py.

For each case of a style: generate with the engine and the row's stop rule exactly as ``toolfid run`` builds it
(:class:`RowStopper`: the prompt's primer in front, the end of the call for single-call cases), running on past
the stop (:attr:`Row.run_on`) to where lm-eval's own generation ends (EOS, ``until``, the budget); score the
row up to its stop (*stopped*) and the whole run (*full*) with the task's own reader (lm-eval's cut, the
primer put back, :func:`answer_text`). Also what a rule fed the generation alone (no primer: the defect of
issue 28) would have stopped at, on the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_NEW = 192  # tool_use_fidelity's max_gen_toks
SMOLLM2_STYLES = {"plain-v3": ("plain", "plain-v3"), "plain-v1": ("plain", "plain-v1"),
                  "plain-v2": ("plain", "plain-v2"), "chat": ("chat", "plain-v1"), "raw": ("raw", "plain-v1")}
"""SmolLM2's default is plain-v3 (its template ignores tools); chat and raw apply to it as well."""
QWEN_STYLES = {"chat": ("chat", "plain-v1"), "plain-v3": ("plain", "plain-v3")}
"""Qwen's default is chat (its template renders tools); plain-v3 is the primed alternative."""


def spread_cases(n_single: int, n_multi: int) -> list[Any]:
    """``n_single`` single requests and ``n_multi`` conversations, evenly spaced over the default set (every
    domain, every conversation kind and depth)."""
    from lm_eval_toolfid.cases.load import load_cases

    cases = load_cases("default")
    single = [c for c in cases if not c.history]
    multi = [c for c in cases if c.history]
    pick = lambda xs, n: [xs[round(i * (len(xs) - 1) / max(1, n - 1))] for i in range(n)]  # noqa: E731
    return pick(single, n_single) + pick(multi, n_multi)


def cases_by_id(ids: tuple[str, ...] | list[str]) -> list[Any]:
    """The default set's cases with these ids, in this order (a test's chosen cases, named for what bites there)."""
    from lm_eval_toolfid.cases.load import load_cases

    by_id = {c.id: c for c in load_cases("default")}
    missing = [i for i in ids if i not in by_id]
    assert not missing, f"not in the default set: {missing}"
    return [by_id[i] for i in ids]


def load(path: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    return model, AutoTokenizer.from_pretrained(path)


def run_style(model: Any, tok: Any, path: Path, style: str, template: str, cases: list[Any],
              share_prefixes: bool = True) -> dict[str, Any]:
    """The task's prompts in one style, each generated full; per case the stop index and both answers."""
    return run_styles(model, tok, path, {style: (style, template, cases)}, share_prefixes)[style]


def run_styles(model: Any, tok: Any, path: Path, styles: dict[str, tuple[str, str, list[Any]]],
               share_prefixes: bool = True) -> dict[str, dict[str, Any]]:
    """Several styles' prompts (``name -> (style, template, cases)``) generated in ONE engine run: every row is
    built and scored exactly as in a run of its style alone, and each row's stop rule is its own, so the rows of
    one style gain nothing from the others; they only share the decode steps (the run ends once its longest row
    reaches lm-eval's end, as each style's run alone would). Per name: :func:`run_style`'s record; ``stats`` is
    the one run's."""
    from lm_eval.models.utils import postprocess_generated_text

    from lm_eval_toolfid.cases.load import load_cases
    from lm_eval_toolfid.formats.call_end import AnswerWatch
    from lm_eval_toolfid.prompts.prompter import Prompter
    from lm_eval_toolfid.engine.decoding import EngineConfig, GreedyEngine, Row
    from lm_eval_toolfid.integrations.lm_eval.stopping import eos_token_ids
    from lm_eval_toolfid.integrations.lm_eval.stopping import RowStopper
    from lm_eval_toolfid.scoring.outcome import answer_text

    eos = eos_token_ids(model, tok)
    default = load_cases("default")
    rows, parts = [], []
    for name, (style, template, cases) in styles.items():
        prompter = Prompter(style, demos=None, model_args={"pretrained": str(path)}, template=template,
                            cases=default, plain_demos=1)
        assert prompter.settings.style == style
        # lm-eval's until: the task's (the chat style: the template's end of turn), plus the decoded EOS token
        until = prompter.until(["\n###"]) + [tok.decode(eos[0])]
        prompts = [prompter.render(c) for c in cases]
        # each row as the engine builds it (the primer in front, the end of the call for single-call cases),
        # running on past its early stop to where lm-eval's own generation would end
        rows += [Row(prompt=tok(p)["input_ids"], max_new=MAX_NEW,
                     stopper=RowStopper(tok, eos, until, MAX_NEW, call_end=len(c.expected_calls) <= 1,
                                        prefix=prompter.answer_prefix(c)),
                     run_on=RowStopper(tok, eos, until, MAX_NEW)) for c, p in zip(cases, prompts)]
        parts.append((name, prompter, until, cases))
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos[0]
    engine = GreedyEngine(model, pad, EngineConfig(max_batch=len(rows), share_prefixes=share_prefixes,
                                                   record_gaps=True))
    done = iter(engine.run(rows))
    runs: dict[str, dict[str, Any]] = {}
    for name, prompter, until, cases in parts:
        out: dict[str, Any] = {"cases": [], "until": until, "stats": engine.stats}
        for case in cases:
            res = next(done)
            single = len(case.expected_calls) <= 1
            prefix = prompter.answer_prefix(case)
            k = res.stopped_at or len(res.tokens)

            def scored(tokens: list[int], case: Any = case, prompter: Any = prompter, until: list = until) -> str:
                text = postprocess_generated_text(tok.decode(tokens, skip_special_tokens=True), until, None)
                return answer_text(prompter.answer(text, case), case)

            # what a rule fed the generation alone (the defect) would have done on the same tokens
            naive = AnswerWatch(until, "", call_end=single)
            text, naive_k = "", len(res.tokens)
            for i in range(1, len(res.tokens) + 1):
                new = tok.decode(res.tokens[:i], skip_special_tokens=True)
                if naive.feed(new[len(text):]):
                    naive_k = i
                    break
                text = new
            out["cases"].append({"id": case.id, "k": k, "n": len(res.tokens), "finish": res.finish,
                                 "stopped": scored(res.tokens[:k]), "full": scored(res.tokens),
                                 "naive": scored(res.tokens[:naive_k]), "primed": bool(prefix),
                                 "tokens": res.tokens, "gaps": res.gaps, "shared": res.shared})
        runs[name] = out
    return runs


def same_tokens(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, int]:
    """Two runs of the same cases (e.g. with and without shared prefixes): every case's tokens are the same,
    or its first difference is at a near tie in either run (raises otherwise). Returns (cases compared,
    cases that differ at a near tie)."""
    from lm_eval_toolfid.engine.decoding import NEAR_TIE

    by_id = {c["id"]: c for c in b["cases"]}
    compared = differ = 0
    for x in a["cases"]:
        y = by_id.get(x["id"])
        if y is None:
            continue
        compared += 1
        if x["tokens"] == y["tokens"]:
            continue
        j = next((k for k, (s, t) in enumerate(zip(x["tokens"], y["tokens"])) if s != t),
                 min(len(x["tokens"]), len(y["tokens"])))
        gap = min(x["gaps"][j] if j < len(x["gaps"]) else 1.0, y["gaps"][j] if j < len(y["gaps"]) else 1.0)
        assert gap < NEAR_TIE, f"{x['id']}: tokens differ at {j} where the top-two gap is {gap:.3g}: not a near tie"
        differ += 1
    return compared, differ


def summary(run: dict[str, Any]) -> dict[str, Any]:
    """Counts of one style's run: cases, rows stopped before lm-eval's generation would end, tokens saved,
    answers that differ (must be 0), answers a generation-only rule would have changed."""
    cases = run["cases"]
    return {"cases": len(cases), "multi_turn": sum(c["id"].startswith("mt-") for c in cases),
            "stopped_early": sum(c["k"] < c["n"] for c in cases), "tokens": sum(c["n"] for c in cases),
            "tokens_saved": sum(c["n"] - c["k"] for c in cases),
            "differ": [c["id"] for c in cases if c["stopped"] != c["full"]],
            "naive_differ": [c["id"] for c in cases if c["naive"] != c["full"]]}


def assert_property(run: dict[str, Any], style: str) -> None:
    s = summary(run)
    print(f"{style}: {s['cases']} cases ({s['multi_turn']} conversations), {s['stopped_early']} stopped before "
          f"lm-eval's generation would, {s['tokens_saved']}/{s['tokens']} tokens saved; answers that differ: "
          f"{len(s['differ'])}; stopped early: {', '.join(c['id'] for c in run['cases'] if c['k'] < c['n'])}")
    assert not s["differ"], "\n".join(f"{c['id']}: stopped {c['stopped'][-80:]!r} vs full {c['full'][-80:]!r}"
                                      for c in run["cases"] if c["stopped"] != c["full"])


