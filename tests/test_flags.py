"""One yes/no parser for every flow: ``verify``, ``write_reference``, ``prefix_cache`` in the task's settings, a
``toolfid run`` view's ``verify`` and the served model's ``resume`` read the same spellings, and anything else is
a one-line error naming the setting (never a silent "not given")."""

from __future__ import annotations

import pytest

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.flags import parse_flag
from lm_eval_toolfid.integrations.lm_eval.settings import TaskSettings
from lm_eval_toolfid.run.session import verify_setting


@pytest.mark.parametrize("text,value", [("true", True), ("Yes", True), ("1", True), ("on", True), (True, True),
                                        ("false", False), ("NO", False), ("0", False), ("off", False),
                                        (False, False)])
def test_every_flow_reads_a_flag_alike(text, value) -> None:
    assert parse_flag(text, "verify") is value
    assert verify_setting(text) is value
    assert TaskSettings.from_metadata({"verify": text}).verify is value
    assert TaskSettings.from_metadata({"prefix_cache": text}).prefix_cache is value


def test_not_given_and_nonsense() -> None:
    assert parse_flag(None, "verify") is None and verify_setting(None) is None and parse_flag("", "resume", True)
    assert TaskSettings.from_metadata({}).verify is None
    for read in (lambda: verify_setting("maybe"), lambda: TaskSettings.from_metadata({"verify": "maybe"})):
        with pytest.raises(ToolfidError, match=r"verify='maybe' is neither true nor false"):
            read()
