"""Served identity, unit level: what is and is not part of a served base's identity."""

from __future__ import annotations

import pytest

from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.pairing.served import api_root, model_card, served_adapter, served_identity, server_origin


@pytest.mark.parametrize("url", ["http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/completions",
                                 "http://h:8000/v1/chat/completions", "http://h:8000/v1/models"])
def test_every_spelling_of_a_server_is_one_server(url: str) -> None:
    assert api_root(url) == "http://h:8000/v1" and server_origin(url) == "http://h:8000"


def test_not_a_url_is_one_line() -> None:
    with pytest.raises(ToolfidError, match="not an http"):
        server_origin("localhost:8000")


def test_identity_keeps_what_changes_outputs_and_drops_transport() -> None:
    listing = [{"id": "B", "root": "/w/base", "created": 1, "status": {"value": "loaded"}, "max_model_len": 4096}]
    args = {"model": "B", "base_url": "http://h:1/v1/completions", "num_concurrent": 8, "timeout": 30, "journal": "x",
            "tokenized_requests": "False", "api_key": "secret", "max_gen_toks": 64}
    ident = served_identity(args, None, "openai-completions", listing, None)
    assert ident["server"] == "http://h:1" and ident["served_model"] == "B" and ident["max_gen_toks"] == "64"
    assert '"root": "/w/base"' in ident["model_card"] and "created" not in ident["model_card"]
    assert not {"num_concurrent", "timeout", "journal", "api_key", "tokenized_requests"} & set(ident)
    # the adapter run of the same base has the same identity; another server or another root does not
    adapter_args = {**args, "model": "lora-a", "num_concurrent": 2}
    assert served_identity(adapter_args, "B", "openai-completions", listing, None) == ident
    assert served_identity({**args, "base_url": "http://h:2"}, None, "openai-completions", listing, None) != ident
    moved = [{**listing[0], "root": "/w/other"}]
    assert served_identity(args, None, "openai-completions", moved, None) != ident


def test_a_model_listed_only_once_loaded_keeps_one_identity() -> None:
    """transformers serve lists a model once loaded, with nothing but its id: listed or not, one identity."""
    args = {"model": "B", "base_url": "http://h:1"}
    assert model_card([{"id": "B", "owned_by": "local", "created": 0}], "B") == {}
    assert served_identity(args, None, "x", [], None) == served_identity(args, None, "x", [{"id": "B"}], None)


def test_adapter_roles() -> None:
    listing = [{"id": "B"}, {"id": "sql", "parent": "B"}]
    assert served_adapter({"model": "sql"}, "B", listing) == ("served", "sql")
    assert served_adapter({"model": "B"}, None, listing) is None
    assert served_adapter({"model": "B"}, "B", listing) is None  # naming itself as its base: a base run
    with pytest.raises(ToolfidError, match="is an adapter of 'B'"):
        served_adapter({"model": "sql"}, None, listing)
