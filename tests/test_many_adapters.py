"""Many adapters for a person: ``--adapters-from`` (a folder of PEFT folders, or a file of ``LABEL=PATH`` lines, ``-``
for stdin) instead of one ``--adapter`` per adapter; bad sources are exit 4 in one line before any model loads; a
run over the fixture's adapter folder evaluates each adapter under its folder's name, every adapter after the first
read into the engine's store (not PEFT's ``load_adapter``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lm_eval_toolfid.cases.bundled import fixture_paths
from lm_eval_toolfid.cli.common import adapters_from
from lm_eval_toolfid.core.errors import EXIT_INPUT, ToolfidError

from .lm_eval_helpers import FIXTURE_TASK, toolfid_here

FIX = fixture_paths()
ADAPTERS = Path(FIX["adapters"]["faithful"]).parent


def test_a_folder_of_adapters_gives_each_its_folders_name_sorted(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()  # a subfolder without adapter_config.json is not an adapter
    for name in ("b-step200", "a-step100"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
    assert adapters_from(str(tmp_path)) == [f"a-step100={tmp_path / 'a-step100'}", f"b-step200={tmp_path / 'b-step200'}"]


def test_a_file_of_label_path_lines_with_comments_and_relative_paths(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "ckpt").mkdir()
    listing = tmp_path / "adapters.txt"
    listing.write_text("# sweep of ranks\n\nr8 = ckpt\nserved=my-lora-name\n")
    assert adapters_from(str(listing)) == [f"r8={tmp_path / 'ckpt'}", "served=my-lora-name"]
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("x=/abs/path\n"))
    assert adapters_from("-") == ["x=/abs/path"]


@pytest.mark.parametrize("text,why", [("", "no LABEL=PATH line"), ("just-a-path\n", "is not LABEL=PATH"),
                                      ("=x\n", "is not LABEL=PATH")])
def test_a_bad_listing_is_one_line(tmp_path: Path, text: str, why: str) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text(text)
    with pytest.raises(ToolfidError, match=why):
        adapters_from(str(listing))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ToolfidError, match="no subfolder holds an adapter_config.json"):
        adapters_from(str(empty))


def test_no_adapter_at_all_and_a_source_that_does_not_read_are_exit_4(tmp_path: Path) -> None:
    for extra in ([], ["--adapters-from", str(tmp_path / "missing.txt")]):
        proc = toolfid_here(["run", "--base", FIX["base"], "--task", FIXTURE_TASK, "--output", tmp_path / "out",
                             *extra], tmp_path / "home")
        assert proc.returncode == EXIT_INPUT and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "--adapters-from" in proc.stderr and "loading" not in proc.stderr


def test_a_run_over_a_folder_of_adapters_names_each_view_after_its_folder(tmp_path: Path) -> None:
    """The fixture's adapter folder through ``--adapters-from``, one more ``--adapter`` beside it: every view, under
    its folder's name; the answers of each equal a run that names it with ``--adapter`` alone (case by case)."""
    out = tmp_path / "out"
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapters-from", ADAPTERS, "--adapter",
                         f"again={FIX['adapters']['broken']}", "--task", FIXTURE_TASK, "--limit", "8", "--device",
                         "cpu", "--output", out, "--json", "--verbose"], tmp_path / "home")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)["adapters"]
    assert sorted(report) == ["again", "broken", "faithful", "hallucinating", "prose_after_results"]
    # --verbose states the adapters' memory; all but the first read into the engine's store (no PEFT load_adapter)
    assert "adapters: 5 gathered per LoRA layer (4 read into the engine's store" in proc.stderr, proc.stderr

    def answers(folder: Path) -> dict:
        return {s["doc"]["id"]: s["resps"] for s in map(json.loads, (folder / "samples.jsonl").read_text().splitlines())}

    assert answers(out / "again") == answers(out / "broken")  # identical files: identical answers
    alone = tmp_path / "alone"
    proc = toolfid_here(["run", "--base", FIX["base"], "--adapter", f"hallucinating={FIX['adapters']['hallucinating']}",
                         "--task", FIXTURE_TASK, "--limit", "8", "--device", "cpu", "--output", alone],
                        tmp_path / "home2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert answers(out / "hallucinating") == answers(alone / "hallucinating")
    assert answers(out / "base") == answers(alone / "base")


def test_a_stored_adapter_that_reaches_transformers_generate_is_loaded_into_peft_first() -> None:
    """The engine's store holds an adapter PEFT does not; where a view falls back to transformers' ``generate`` (PEFT's
    forward), the adapter is loaded into PEFT first: the tokens are the adapter's, never the first adapter's."""
    import torch

    from lm_eval_toolfid.engine.adapter_store import store_of
    from lm_eval_toolfid.integrations.lm_eval.hf_model import ToolfidHFLM

    lm = ToolfidHFLM(pretrained=FIX["base"], peft=FIX["adapters"]["faithful"], batch_size=1, device="cpu")
    lm.attach_adapter("broken", FIX["adapters"]["broken"])
    store = store_of(lm.model)
    assert store is not None and "broken" in store.adapters and "broken" not in lm.model.peft_config
    lm.activate("broken")
    ids = torch.tensor([lm.tokenizer.encode("Call the weather tool for Paris:")])
    ours = lm._generate_in_batches(ids, ids.shape[1] + 12, [], do_sample=False)
    assert "broken" in lm.model.peft_config and not store.adapters and store.active is None
    lm.model.set_adapter("broken")
    theirs = lm.model.generate(input_ids=ids, max_length=ids.shape[1] + 12, do_sample=False,
                               pad_token_id=lm.tokenizer.pad_token_id)
    lm.model.set_adapter("default")
    faithful = lm.model.generate(input_ids=ids, max_length=ids.shape[1] + 12, do_sample=False,
                                 pad_token_id=lm.tokenizer.pad_token_id)
    assert torch.equal(ours, theirs) and not torch.equal(ours, faithful)


def _many_runs(root: Path, n: int = 20) -> list[Path]:
    """``n`` adapter runs of one base (4 cases each): every fourth loses a valid call (FAIL), the rest keep all."""
    from .reporting_helpers import case, gate, outcome, verdict, write_run

    files = []
    for k in range(n):
        lose = k % 4 == 1
        cases = [case(f"c{i}", "get_weather", outcome("valid"),
                      outcome("no_call", name=None) if lose and i == 0 else outcome("valid")) for i in range(4)]
        delta = -0.25 if lose else 0.0
        files.append(write_run(root / f"ad{k:02d}", cases, adapter=f"/ad/ad{k:02d}",
                               verdict=verdict(gate("validity_delta", delta, not lose))))
    return files


def test_a_hundred_adapters_stay_readable_worst_first(tmp_path: Path) -> None:
    """From 12 adapters on, the screen lists them worst first and names those that PASS on one line; the HTML report
    plots each adapter's delta with its interval as one row, worst first (a forest plot, not 20 bar groups)."""
    from lm_eval_toolfid.reporting import collect, html
    from lm_eval_toolfid.reporting.results import row_from_results
    from lm_eval_toolfid.reporting.screen import verdicts

    files = _many_runs(tmp_path)
    rows = [row_from_results(json.loads(f.read_text()), f.parent.name) for f in files]
    text = verdicts(rows)
    table = text.split("\n\n")[0].splitlines()
    order = [line.split()[0] for line in table if line.startswith("ad") and not line.startswith("adapter")]
    assert order[:5] == ["ad01", "ad05", "ad09", "ad13", "ad17"] and len(order) == 20, order  # the FAILs first
    assert "PASS (15): ad00, ad02" in text and "ad02: PASS" not in text and "ad01: FAIL" in text
    _, board, breakdowns = collect([tmp_path])
    page = html.render(board, breakdowns)
    assert "20 adapters, worst first" in page and page.count('class="dot"') == 20
    plot = page[page.index("20 adapters, worst first"):]
    assert plot.index(">ad01<") < plot.index(">ad00<")  # a FAIL row above a PASS row
    assert "floor -0.05" in plot


def test_a_whole_run_of_eight_adapters_costs_about_the_calls_of_one(tmp_path: Path, monkeypatch) -> None:
    """The base view and 8 B = 0 adapter views (each verifying the base's tokens) make within 30% of the aten calls
    of the base view and one adapter view, counted on the CPU the way a GPU runs them (the KV store's indexed copies:
    one copy per source buffer, not per row): per-row work is batched, so a view costs its rows' arithmetic, not
    its own launches."""
    import sys

    import torch

    import lm_eval_toolfid.engine.kv_store as kv_store
    from lm_eval_toolfid.engine.step_cost import call_counter
    from lm_eval_toolfid.run.plan import ModelOptions, RunPlan
    from lm_eval_toolfid.run.session import ModelSession

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    from bench_joint_views import make_adapters, quiet

    init = kv_store.KVStore.__init__

    def gpu_like(self, *args, **kwargs):  # noqa: ANN001, ANN202
        init(self, *args, **kwargs)
        self.indexed_copies = True

    monkeypatch.setattr(kv_store.KVStore, "__init__", gpu_like)
    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))
    adapters = make_adapters(FIX["base"], 8, tmp_path / "adapters", zero=True)
    calls = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for n in (1, 8):
            chosen = dict(list(adapters.items())[:n])
            plan = RunPlan(base=FIX["base"], adapters=chosen, task=FIXTURE_TASK, models=ModelOptions(device="cpu"),
                           limit=12, verbose=False)
            session = ModelSession(FIX["base"], plan.models, progress=quiet(), verbose=False).load(chosen)
            list(session.evaluate([plan.base_view()], plan))  # warm: the stack built, the first passes made
            with call_counter() as counter:
                results = list(session.evaluate([plan.base_view(), *plan.adapter_views()], plan))
            answers = [{s["doc"]["id"]: s["resps"] for s in r.samples} for r in results]
            assert all(a == answers[0] for a in answers[1:])  # every B = 0 view changed no output
            calls[n] = counter.calls
    finally:
        torch.set_num_threads(threads)
    assert calls[8] <= 1.3 * calls[1], calls
