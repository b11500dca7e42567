"""The default case set's vocabulary (``cases/vocab/*.json``) read into typed records.

``common.json`` holds the build settings, the domains in drawing order, shared pools and samplers;
each ``<domain>.json`` its neighbours, pools, samplers and tools (spec + recipe);
``multi_turn.json`` the conversation settings, reusable step ``blocks``, the tools only
conversations use, and the scenarios. Pools, samplers and blocks share one namespace per kind
across all files; a name defined twice is an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from lm_eval_toolfid.core.errors import ToolfidError

VOCAB_DIR = Path(__file__).resolve().parent / "vocab"


@dataclass(frozen=True)
class Tool:
    """One tool of the vocabulary: its spec and the recipe that draws a request for it."""

    domain: str
    name: str
    description: str
    parameters: dict[str, Any]
    recipe: list[dict[str, Any]]

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True)
class ConversationScenario:
    """A multi-turn recipe: a first request, a conversation, and the step the case asks for."""

    name: str
    domain: str
    kind: str
    cases: int
    recipe: list[dict[str, Any]]


KINDS = ("mt_follow_up", "mt_retry", "mt_second_tool", "mt_answer")


@dataclass(frozen=True)
class Vocab:
    """Everything the vocabulary files hold, merged."""

    settings: dict[str, Any]
    tools: list[Tool]
    """The tools single-turn cases are drawn for, in drawing order."""
    neighbours: dict[str, list[str]]
    pools: dict[str, Any] = field(default_factory=dict)
    samplers: dict[str, Any] = field(default_factory=dict)
    conversation_tools: list[Tool] = field(default_factory=list)
    """Tools only conversations use (e.g. booking the offer a search returned)."""
    conversation_settings: dict[str, Any] = field(default_factory=dict)
    scenarios: list[ConversationScenario] = field(default_factory=list)
    blocks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Named step lists that several scenarios share."""

    @property
    def all_tools(self) -> list[Tool]:
        return self.tools + self.conversation_tools


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _merge(into: dict[str, Any], more: dict[str, Any], what: str, where: str) -> None:
    clash = sorted(set(into) & set(more))
    if clash:
        raise ToolfidError(f"{where}: {what} {', '.join(clash)} defined twice in the vocabulary")
    into.update(more)


@lru_cache(maxsize=4)
def load_vocab(folder: Path = VOCAB_DIR) -> Vocab:
    """Read ``common.json`` and the domain files it lists, in its order (the order matters: it is
    the order in which cases are drawn and distractors are listed)."""
    common = _read(folder / "common.json")
    pools: dict[str, Any] = dict(common.get("pools", {}))
    samplers: dict[str, Any] = dict(common.get("samplers", {}))
    tools: list[Tool] = []
    neighbours: dict[str, list[str]] = {}
    for domain in common["domains"]:
        path = folder / f"{domain}.json"
        data = _read(path)
        if data.get("domain", domain) != domain:
            raise ToolfidError(f"{path.name}: says domain {data['domain']!r}, common.json lists it as {domain!r}")
        _merge(pools, data.get("pools", {}), "pool(s)", path.name)
        _merge(samplers, data.get("samplers", {}), "sampler(s)", path.name)
        neighbours[domain] = data["neighbours"]
        tools += [Tool(domain, t["name"], t["description"], t["parameters"], t["recipe"]) for t in data["tools"]]
    vocab = Vocab(common["settings"], tools, neighbours, pools, samplers)
    path = folder / "multi_turn.json"
    if not path.is_file():
        return vocab
    data = _read(path)
    _merge(pools, data.get("pools", {}), "pool(s)", path.name)
    _merge(samplers, data.get("samplers", {}), "sampler(s)", path.name)
    blocks = dict(data.get("blocks", {}))
    extra = [Tool(t["domain"], t["name"], t["description"], t["parameters"], []) for t in data.get("tools", [])]
    scenarios = [ConversationScenario(sc["name"], sc["domain"], sc["kind"], sc["cases"], sc["recipe"])
                 for sc in data["scenarios"]]
    unknown = sorted({sc.kind for sc in scenarios} - set(KINDS))
    if unknown:
        raise ToolfidError(f"{path.name}: unknown scenario kind(s) {', '.join(unknown)} (known: {', '.join(KINDS)})")
    return Vocab(common["settings"], tools, neighbours, pools, samplers, extra, data["settings"], scenarios, blocks)
