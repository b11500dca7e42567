"""The seeded generator of the bundled default case set (``cases/default_cases.jsonl``).

Everything the cases are made of lives in the vocabulary files ``cases/vocab/*.json`` (see the
``README.md`` there): ``common.json`` holds the build settings, the order of the domains, shared
value pools and samplers; each domain file holds its tools — name, description, parameter schema
and a *recipe* in the small language of :mod:`lm_eval_toolfid.cases.recipes` that draws a prompt
and its gold arguments — and its own pools. This module only reads and runs them.

Every case is one natural-language request, one to five OpenAI-style tool specs, the tool that
should be called and the exact arguments expected. A recipe writes every string argument verbatim
into the prompt (enum values may be paraphrased) and every number exactly as JSON writes it;
optional arguments are in the gold only when the prompt asks for them. One
``random.Random(SEED)`` drives everything, so a rerun rewrites byte-identical files.

:func:`build_cases` draws the cases, :func:`check` validates each (the :class:`Case` model, the
argument schema, every gold string and number recoverable from the prompt), :func:`stats_markdown`
describes the set, and :func:`write` saves the JSONL file and the statistics
(``default_cases_stats.md``). ``scripts/make_default_cases.py`` runs all of it.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from lm_eval_toolfid.cases.recipes import Recipe
from lm_eval_toolfid.core.errors import ToolfidError
from lm_eval_toolfid.core.records import Case
from lm_eval_toolfid.core.schema import check_tool_schema, validate_arguments

HERE = Path(__file__).resolve().parent
VOCAB_DIR = HERE / "vocab"
OUT_PATH = HERE / "default_cases.jsonl"
STATS_PATH = HERE / "default_cases_stats.md"


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
class Vocab:
    """Everything the vocabulary files hold, merged."""

    settings: dict[str, Any]
    tools: list[Tool]
    neighbours: dict[str, list[str]]
    pools: dict[str, Any] = field(default_factory=dict)
    samplers: dict[str, Any] = field(default_factory=dict)


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
    return Vocab(common["settings"], tools, neighbours, pools, samplers)


def _settings() -> dict[str, Any]:
    return load_vocab().settings


SEED: int = _settings()["seed"]


# --------------------------------------------------------------------------- drawing


def draw(vocab: Vocab, tool: Tool, r: random.Random) -> tuple[str, dict[str, Any]]:
    """One request for ``tool``: (prompt, gold arguments)."""
    env = Recipe(r, vocab.pools, vocab.samplers, vocab.settings["year"]).run(tool.recipe)
    return env["prompt"], env["args"]


def pick_distractors(r: random.Random, vocab: Vocab, gold: Tool, k: int) -> list[Tool]:
    """``k`` other tools, same domain first, then the neighbouring domains' (shuffled per case)."""
    same = [t for t in vocab.tools if t.domain == gold.domain and t.name != gold.name]
    near = [t for t in vocab.tools if t.domain in vocab.neighbours[gold.domain]]
    r.shuffle(same)
    r.shuffle(near)
    return (same + near)[:k]


def build_cases(r: random.Random, vocab: Vocab | None = None) -> list[dict[str, Any]]:
    """The default set's cases, as JSON-ready dicts, drawn from ``r``."""
    vocab = vocab or load_vocab()
    cfg = vocab.settings
    weights = {int(k): w for k, w in cfg["tools_offered_weights"].items()}
    cases: list[dict[str, Any]] = []
    seen_prompts: set[str] = set()
    per_domain: Counter[str] = Counter()
    for tool in vocab.tools:
        for _ in range(cfg["cases_per_tool"]):
            for _attempt in range(100):
                prompt, args = draw(vocab, tool, r)
                if prompt not in seen_prompts and len(prompt) <= cfg["max_prompt_chars"]:
                    break
            else:
                raise ToolfidError(f"{tool.name}: could not draw a fresh prompt of at most "
                                   f"{cfg['max_prompt_chars']} characters")
            seen_prompts.add(prompt)
            offered = [tool]
            if r.random() < cfg["multi_tool_share"]:
                offered += pick_distractors(r, vocab, tool, r.choices(list(weights), list(weights.values()))[0] - 1)
                r.shuffle(offered)
            per_domain[tool.domain] += 1
            cases.append({
                "id": f"{tool.domain}-{per_domain[tool.domain]:04d}",
                "prompt": prompt,
                "tools": [t.spec() for t in offered],
                "gold_tool_name": tool.name,
                "allowed_tools": [t.name for t in offered],
                "gold_arguments": args,
            })
    r.shuffle(cases)
    return cases


# --------------------------------------------------------------------------- checking


def number_in_text(value: int | float, text: str) -> bool:
    """``value`` occurs in ``text`` exactly as JSON writes it, not as part of a longer number."""
    literal = re.escape(json.dumps(value))
    return re.search(r"(?<![\d.])" + literal + r"(?!\d|\.\d)", text) is not None


def unrecoverable(value: Any, schema: dict[str, Any], text: str, path: str = "") -> list[str]:
    """Leaves of ``value`` that cannot be read off ``text`` (enum-constrained leaves exempt)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return [p for k, v in value.items() for p in unrecoverable(v, props.get(k, {}), text, f"{path}/{k}")]
    if isinstance(value, list):
        items = schema.get("items", {})
        return [p for i, v in enumerate(value) for p in unrecoverable(v, items, text, f"{path}/{i}")]
    if "enum" in schema or isinstance(value, bool) or value is None:
        return []
    if isinstance(value, str):
        return [] if value in text else [f"{path}={value!r}"]
    if isinstance(value, (int, float)):
        return [] if number_in_text(value, text) else [f"{path}={value!r}"]
    return [f"{path}: unexpected {type(value).__name__}"]


def check(cases: list[dict[str, Any]], vocab: Vocab | None = None) -> None:
    """Raise :class:`ToolfidError` listing every case that fails its checks."""
    vocab = vocab or load_vocab()
    problems: list[str] = []
    for c in cases:
        case = Case.model_validate(c)
        gold = case.gold_tool
        assert gold is not None
        if check_tool_schema(gold.parameters):
            problems.append(f"{case.id}: bad schema")
        violation = validate_arguments(c["gold_arguments"], gold.parameters)
        if violation is not None:
            problems.append(f"{case.id}: {violation.keyword} at {violation.path}: {violation.message}")
        problems += [f"{case.id}: not in prompt: {leaf}"
                     for leaf in unrecoverable(c["gold_arguments"], gold.parameters, c["prompt"])]
    names = [t.name for t in vocab.tools]
    if len(names) != len(set(names)):
        problems.append("duplicate tool names")
    reserved = set(vocab.settings["reserved_names"]) & set(names)
    if reserved:
        problems.append(f"reserved tool names used: {sorted(reserved)}")
    if problems:
        raise ToolfidError(f"{len(problems)} generated case problem(s): " + "; ".join(problems[:20]))


# --------------------------------------------------------------------------- statistics

FEATURES = ["enum", "nested object", "array of strings", "array of integers", "array of objects", "integer",
            "number", "boolean", "optional fields", "required list", "minimum/maximum",
            "additionalProperties: false"]
_ARRAY_KINDS = {"string": "array of strings", "integer": "array of integers", "object": "array of objects"}


def schema_features(params: dict[str, Any]) -> set[str]:
    """Which of :data:`FEATURES` a tool's ``parameters`` uses."""
    found: set[str] = set()
    if params.get("required"):
        found.add("required list")
    if set(params.get("properties", {})) - set(params.get("required", [])):
        found.add("optional fields")

    def walk(node: dict[str, Any], depth: int) -> None:
        kind = node.get("type")
        if "enum" in node:
            found.add("enum")
        if kind in ("integer", "number", "boolean"):
            found.add(kind)
        if "minimum" in node or "maximum" in node:
            found.add("minimum/maximum")
        if kind == "object":
            if depth > 0 and node.get("properties"):
                found.add("nested object")
            if node.get("additionalProperties") is False:
                found.add("additionalProperties: false")
            for sub in node.get("properties", {}).values():
                walk(sub, depth + 1)
        if kind == "array":
            items = node.get("items", {})
            if items.get("type") in _ARRAY_KINDS:
                found.add(_ARRAY_KINDS[items["type"]])
            walk(items, depth + 1)

    walk(params, 0)
    return found


def stats_markdown(cases: list[dict[str, Any]], vocab: Vocab | None = None) -> str:
    """The statistics block saved next to the case file (and quoted in the README)."""
    vocab = vocab or load_vocab()
    by_name = {t.name: t for t in vocab.tools}
    n_cases = len(cases)
    gold_names = {c["gold_tool_name"] for c in cases}
    offered_hist = Counter(len(c["tools"]) for c in cases)
    multi = sum(v for k, v in offered_hist.items() if k > 1)
    feat_counts: Counter[str] = Counter()
    with_optional_args = with_optional_schema = 0
    for c in cases:
        params = by_name[c["gold_tool_name"]].parameters
        feat_counts.update(schema_features(params))
        optional = set(params["properties"]) - set(params["required"])
        if optional:
            with_optional_schema += 1
            with_optional_args += bool(optional & set(c["gold_arguments"]))
    domains = Counter(c["id"].rsplit("-", 1)[0] for c in cases)
    tools_per_domain = Counter(t.domain for t in vocab.tools)
    lines = [
        "### Default case set (`lm_eval_toolfid/cases/default_cases.jsonl`)",
        "",
        f"Generated by `scripts/make_default_cases.py` (seed {SEED}).",
        "",
        "| statistic | value |",
        "|---|---|",
        f"| cases | {n_cases} |",
        f"| distinct tools | {len({t['name'] for c in cases for t in c['tools']})} "
        f"({len(gold_names)} appear as gold) |",
        f"| multi-tool cases (2-5 tools offered) | {multi} ({100 * multi / n_cases:.1f}%) |",
        f"| cases whose gold arguments include optional fields | {with_optional_args} of {with_optional_schema} "
        f"with optional fields in the schema ({100 * with_optional_args / with_optional_schema:.1f}%) |",
        f"| domains | {len(domains)} |",
        "",
        "Tools offered per case:",
        "",
        "| tools offered | " + " | ".join(str(k) for k in sorted(offered_hist)) + " |",
        "|---|" + "---|" * len(offered_hist),
        "| cases | " + " | ".join(str(offered_hist[k]) for k in sorted(offered_hist)) + " |",
        "",
        "Schema features of the gold tool:",
        "",
        "| feature | cases |",
        "|---|---|",
        *[f"| {f} | {feat_counts[f]} |" for f in FEATURES],
        "",
        "Domains:",
        "",
        "| domain | tools | cases |",
        "|---|---|---|",
        *[f"| {d} | {tools_per_domain[d]} | {domains[d]} |" for d in sorted(domains)],
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- writing


def to_jsonl(cases: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in cases)


def write(out_path: Path = OUT_PATH, stats_path: Path = STATS_PATH) -> str:
    """Draw, check and save the default set and its statistics; returns the statistics block."""
    cases = build_cases(random.Random(SEED))
    check(cases)
    out_path.write_text(to_jsonl(cases), encoding="utf-8")
    stats = stats_markdown(cases)
    stats_path.write_text(stats, encoding="utf-8")
    return stats
