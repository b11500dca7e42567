"""The verify rule (issue 35): verified by default in float32, decoded by default in half precision; the
settings and CLI flags that reach it; how a view's record reports it. End to end: test_half_precision.py."""

from __future__ import annotations

import argparse

import pytest
import torch

from lm_eval_toolfid.integrations.lm_eval.verify_policy import choose_verify, combine_requests


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, "float32"])
def test_full_precision_verifies_by_default(dtype) -> None:
    choice = choose_verify(None, dtype)
    assert choice.verify is True and "exact" in choice.reason and "--no-verify" in choice.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, "bfloat16"])
def test_half_precision_decodes_by_default_and_verify_forces_it(dtype) -> None:
    name = str(dtype).removeprefix("torch.")
    default = choose_verify(None, dtype)
    assert default.verify is False and f"in {name}" in default.reason and "--verify forces it" in default.reason
    forced = choose_verify(True, dtype)
    assert forced.verify is True and f"forces it in {name}" in forced.reason and "near ties counted" in forced.reason
    assert choose_verify(False, dtype).verify is False


def test_no_verify_decodes_in_every_dtype() -> None:
    assert choose_verify(False, torch.float32).verify is False


def test_two_requests_for_one_prompt_take_the_cautious_choice() -> None:
    assert combine_requests(None, None) is None
    assert combine_requests(True, None) is True and combine_requests(None, True) is True
    assert combine_requests(True, False) is False and combine_requests(None, False) is False


@pytest.mark.parametrize("given, expected", [({}, None), ({"verify": "true"}, True), ({"verify": "false"}, False),
                                             ({"verify": True}, True), ({"verify": False}, False)])
def test_the_verify_setting_is_tri_state(given: dict, expected) -> None:
    from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings

    assert TaskSettings.from_metadata({"pretrained": "m", **given}).verify is expected


def test_cli_flags_reach_the_metadata() -> None:
    from lm_eval_toolfid.cli.common import add_model_options, metadata_from_args

    p = argparse.ArgumentParser()
    add_model_options(p)
    assert "verify" not in metadata_from_args(p.parse_args([]))
    assert metadata_from_args(p.parse_args(["--verify"]))["verify"] is True
    assert metadata_from_args(p.parse_args(["--no-verify"]))["verify"] is False
    with pytest.raises(SystemExit):
        p.parse_args(["--verify", "--no-verify"])


def test_a_views_record_says_which_path_it_took_and_why() -> None:
    from lm_eval_toolfid.integrations.lm_eval.generation_record import GenerationInfo, summarize_generation

    reason = choose_verify(None, torch.bfloat16).reason
    rows = [GenerationInfo(engine="toolfid", verify=False, verify_reason=reason, tokens=3, decoded=2)] * 4
    gen = summarize_generation(rows, verify=None)
    assert gen["verify"] is False and gen["verify_reason"] == reason and gen["verify_requested"] == "auto"
    assert gen["rows_verified"] == 0
    base = summarize_generation(rows, verify=None, adapter_view=False)
    assert base["verify_reason"].startswith("the base view")
    assert summarize_generation([], verify=False) == {"verify": False, "verify_requested": False,
                                                     "engine": "not recorded"}


def test_resume_reuses_a_view_across_verify_settings_except_a_forced_one(tmp_path) -> None:
    """A saved view is reused whatever ``verify`` said (the same tokens), except ``verify: true``: in half
    precision forced verification can give other tokens than the decoding every other setting gives. The checks it
    ran (``prefix_cache``, ``check_stops``) are recorded apart and compared."""
    from lm_eval_toolfid.reporting.view_store import view_manifest

    def manifest(meta: dict) -> dict:
        return view_manifest(str(tmp_path / "base"), None, "tool_use_fidelity", meta, {"dtype": "bfloat16"})

    default = manifest({})
    assert manifest({"verify": False}) == default
    # the checks a view ran are part of it: a resume asking for other checks runs them (tests/test_stored_files.py)
    assert manifest({"prefix_cache": False})["checks"] == {"prefix_cache": False} != default["checks"]
    forced = manifest({"verify": True})
    assert forced != default and forced["settings"]["verify"] is True
