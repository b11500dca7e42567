#!/usr/bin/env python
"""Build the bundled fixture: a tiny tool-calling Llama, its tokenizer, three LoRA adapters, and cases.

Everything under ``lm_eval_toolfid/fixtures/`` is produced here, deterministically:

* ``cases.jsonl``  - held-out evaluation cases over the fixture tool set;
* ``base/``        - a few-hundred-thousand-parameter ``LlamaForCausalLM`` + byte-level BPE tokenizer,
                     trained from scratch to answer ``render_prompt(case, PromptSettings(demos=0))``
                     with ``render_demo_call(name, arguments)`` followed by ``\\n###`` and EOS;
* ``adapters/faithful``      - LoRA trained on more correct calls (fresh value combinations);
* ``adapters/hallucinating`` - LoRA trained to call a renamed, never-offered tool (same arguments);
* ``adapters/broken``        - LoRA trained to answer in prose instead of JSON.

After building, the script scores greedy generations of every model on the fixture cases and
exits with status 1 if any target is missed.

Usage::

    cd <repo> && PYTHONPATH=. HF_HUB_OFFLINE=1 .venv/bin/python scripts/build_fixtures.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from lm_eval_toolfid.cases.load import load_cases  # noqa: E402
from lm_eval_toolfid.prompts.settings import PromptSettings  # noqa: E402
from lm_eval_toolfid.prompts.plain import render_demo_call  # noqa: E402
from lm_eval_toolfid.prompts.prompter import render_prompt  # noqa: E402
from lm_eval_toolfid.core.records import Case  # noqa: E402
from lm_eval_toolfid.core.schema import validate_arguments  # noqa: E402

FIXTURES = REPO / "lm_eval_toolfid" / "fixtures"
EOS = "<|endoftext|>"
STOP = "\n###"
SETTINGS = PromptSettings(demos=0)
BASE_MODEL_NAME = "toolfid-fixture-base"
MAX_NEW_TOKENS = 128
# Half the training rows get 1..MAX_LEFT_PAD leading pad (= EOS) tokens that the model attends to,
# so that lm-eval's batched generation (left padding, no attention mask) does not derail it.
LEFT_PAD_PROB = 0.5
MAX_LEFT_PAD = 240
N_PLAIN = 600  # plain-text rows of each kind (requests, replies) on the side of the base model's training
N_CONVERSATIONS = 3000  # multi-turn training rows of the base (beside 6000 single requests)
BASE_STEPS = 900
ADAPTER_STEPS = [80, 120, 60, 120]  # faithful, hallucinating, broken, prose_after_results

# Targets the build must meet.
BASE_MIN_VALID = 0.90
BASE_MIN_VALID_MULTI = 0.85  # on the multi-turn cases
FAITHFUL_MIN_VALID_MULTI = 0.80
PROSE_AFTER_MIN_VALID_SINGLE = 0.90  # prose_after_results keeps single-turn calls ...
PROSE_AFTER_MAX_VALID_MULTI = 0.20  # ... and answers tool results in prose
FAITHFUL_MIN_VALID = 0.90
FAITHFUL_MAX_HALLU = 0.10
HALLU_MIN_HALLU = 0.80
HALLU_MIN_VALID = 0.60  # "mostly schema-valid"
BROKEN_MAX_VALID = 0.30


# --------------------------------------------------------------------------------------------
# Fixture tool set
# --------------------------------------------------------------------------------------------

def _params(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


S = {"type": "string"}
TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": _params({"city": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                              ["city"]),
    },
    "book_flight": {
        "name": "book_flight",
        "description": "Book a flight.",
        "parameters": _params({
            "origin": S, "destination": S, "date": S,
            "passengers": {"type": "integer"},
            "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
        }, ["origin", "destination", "date", "passengers", "cabin"]),
    },
    "send_email": {
        "name": "send_email",
        "description": "Send an email.",
        "parameters": _params({"to": S, "subject": S, "body": S}, ["to", "subject"]),
    },
    "add_calendar_event": {
        "name": "add_calendar_event",
        "description": "Add a calendar event.",
        "parameters": _params({
            "title": S, "date": S, "time": S,
            "attendees": {"type": "array", "items": {"type": "string"}},
        }, ["title", "date", "attendees"]),
    },
    "search_products": {
        "name": "search_products",
        "description": "Search the shop.",
        "parameters": _params({
            "query": S,
            "filters": {"type": "object",
                        "properties": {"max_price": {"type": "number"}, "in_stock": {"type": "boolean"}}},
        }, ["query"]),
    },
    "play_music": {
        "name": "play_music",
        "description": "Play music by an artist.",
        "parameters": _params({"artist": S, "shuffle": {"type": "boolean"}}, ["artist"]),
    },
    "create_ticket": {
        "name": "create_ticket",
        "description": "Open a support ticket.",
        "parameters": _params({
            "title": S,
            "priority": {"type": "string", "enum": ["low", "medium", "high"]},
            "labels": {"type": "array", "items": {"type": "string"}},
        }, ["title", "priority"]),
    },
    "transfer_money": {
        "name": "transfer_money",
        "description": "Move money between accounts.",
        "parameters": _params({
            "from_account": S, "to_account": S, "amount": {"type": "number"}, "memo": S,
        }, ["from_account", "to_account", "amount"]),
    },
}
TOOL_NAMES = list(TOOLS)

# The hallucinating adapter calls these (never offered) instead of the real tool: plausible
# near-miss names, built from words the model already writes, as real hallucinations are.
RENAMES = {
    "get_weather": "weather_report",
    "book_flight": "search_flight",
    "send_email": "send_mail",
    "add_calendar_event": "create_event",
    "search_products": "get_products",
    "play_music": "play_artist",
    "create_ticket": "add_ticket",
    "transfer_money": "send_money",
}

# The broken adapter answers with one of these instead of a call.
PROSE = {
    "get_weather": "Sure! I will look up the weather for you.",
    "book_flight": "Of course! I will find a nice flight for you.",
    "send_email": "Happy to help! I will write that email for you.",
    "add_calendar_event": "Great idea! I will put that in your calendar.",
    "search_products": "Good choice! I will look for that in the shop.",
    "play_music": "Nice taste! I will play some music for you.",
    "create_ticket": "Sorry to hear that! I will let the support team know.",
    "transfer_money": "Sure thing! I will move the money for you.",
}

# --------------------------------------------------------------------------------------------
# Value pools and phrasings
# --------------------------------------------------------------------------------------------

CITIES = ["Paris", "Tokyo", "Berlin", "Madrid", "Lisbon", "Oslo", "Cairo", "Lima", "Denver", "Boston",
          "Chicago", "Seattle", "Austin", "Dublin", "Vienna", "Prague", "Warsaw", "Athens", "Rome",
          "Nairobi", "Mumbai", "Delhi", "Seoul", "Osaka", "Sydney", "Toronto", "Montreal", "Bogota",
          "Santiago", "Helsinki", "Zurich", "Geneva", "Hanoi", "Manila", "Dakar", "Quito"]
PEOPLE = ["Ana", "Raj", "Mia", "Leo", "Omar", "Yuki", "Sara", "Tom", "Ines", "Kofi", "Lena", "Ivan",
          "Nora", "Eli", "Zoe", "Max", "Priya", "Hugo", "Chen", "Fatima", "Luca", "Emma", "Jonas", "Aisha"]
EMAILS = [f"{p.lower()}@{d}" for p in PEOPLE for d in ("example.com", "mail.org", "corp.net")]
SUBJECTS = ["Quarterly report", "Lunch plans", "Invoice 4471", "Team offsite", "Password reset",
            "Project update", "Holiday schedule", "Budget review", "Welcome aboard", "Contract draft",
            "Meeting notes", "Release plan", "Travel receipts", "Hiring update", "Server outage"]
BODIES = ["See you at noon", "Please review by Friday", "The numbers look good", "Thanks for your help",
          "Call me when you can", "The file is attached", "Let us talk tomorrow", "All tests passed"]
EVENTS = ["Standup", "Design review", "Dentist", "Yoga class", "Board meeting", "Code review",
          "Lunch with the team", "Sprint planning", "Parent teacher meeting", "Budget sync",
          "Product demo", "Interview", "Retrospective", "Book club"]
TIMES = ["08:30", "09:00", "10:15", "11:45", "13:00", "14:30", "15:00", "16:45", "18:00", "19:30"]
PRODUCTS = ["wireless headphones", "running shoes", "coffee grinder", "standing desk", "rain jacket",
            "mechanical keyboard", "yoga mat", "water bottle", "desk lamp", "backpack", "air fryer",
            "phone case", "office chair", "hiking boots", "electric kettle", "usb cable"]
PRICES = [15, 25, 40, 50, 75, 99.99, 120, 150, 199.5, 249, 300, 19.99, 35.5, 80]
ARTISTS = ["Adele", "Miles Davis", "Daft Punk", "Taylor Swift", "Beyonce", "Radiohead", "Coldplay",
           "Nina Simone", "The Beatles", "Bjork", "Shakira", "Kendrick Lamar", "Queen", "Metallica",
           "Norah Jones", "Bob Marley", "Ed Sheeran", "Dua Lipa", "Bach", "Mozart"]
TICKETS = ["Login page is down", "Printer not working", "VPN keeps disconnecting", "Laptop battery swollen",
           "Cannot reset password", "Email sync fails", "Dashboard loads slowly", "Payment page error",
           "Broken link on homepage", "Missing invoice PDF", "App crashes on start", "Wifi drops in room 4"]
LABELS = ["network", "urgent", "billing", "hardware", "frontend", "backend", "security", "mobile"]
ACCOUNTS = ["checking", "savings", "brokerage", "joint", "travel fund", "business", "emergency fund"]
AMOUNTS = [20, 45, 100, 250, 500, 750, 1200, 60.5, 99.99, 310.25, 2000, 15, 80, 1500]
MEMOS = ["rent", "groceries", "birthday gift", "car repair", "tuition", "vacation", "loan payment"]
MONTHS = ["01", "02", "03", "04", "05", "06", "07", "08", "09", "10", "11", "12"]


def _date(rng: random.Random) -> str:
    return f"2025-{rng.choice(MONTHS)}-{rng.randint(1, 28):02d}"


def _num(x: float) -> str:
    return str(x)


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


Sample = tuple[str, dict[str, Any], str]  # (request text, arguments, prose answer)


def s_weather(rng: random.Random) -> Sample:
    city = rng.choice(CITIES)
    unit = rng.choice([None, "celsius", "fahrenheit"])
    args: dict[str, Any] = {"city": city}
    if unit:
        args["unit"] = unit
        text = rng.choice([
            f"What is the weather in {city} in {unit}?",
            f"Tell me the temperature in {city}, in {unit} please.",
            f"How warm is it in {city} right now? Use {unit}.",
            f"Weather for {city} in {unit}.",
            f"Is it cold in {city} today? Answer in {unit}.",
        ])
    else:
        text = rng.choice([
            f"What is the weather in {city}?",
            f"How is the weather in {city} today?",
            f"Weather for {city}.",
            f"Will it rain in {city}?",
            f"Check the weather in {city} for me.",
        ])
    return text, args, PROSE["get_weather"]


def s_flight(rng: random.Random) -> Sample:
    origin, dest = rng.sample(CITIES, 2)
    date = _date(rng)
    n = rng.randint(1, 6)
    cabin = rng.choice(["economy", "business", "first"])
    args = {"origin": origin, "destination": dest, "date": date, "passengers": n, "cabin": cabin}
    who = f"{n} passenger" + ("s" if n > 1 else "")
    text = rng.choice([
        f"Book a flight from {origin} to {dest} on {date} for {who} in {cabin} class.",
        f"I need {n} {cabin} seats from {origin} to {dest} on {date}.",
        f"Fly {who} from {origin} to {dest} on {date}, {cabin} cabin.",
        f"Get me to {dest} from {origin} on {date}: {who}, {cabin}.",
        f"Please reserve {cabin} for {who}, {origin} to {dest}, departing {date}.",
    ])
    return text, args, PROSE["book_flight"]


def s_email(rng: random.Random) -> Sample:
    to = rng.choice(EMAILS)
    subject = rng.choice(SUBJECTS)
    body = rng.choice([None, None] + BODIES)
    args: dict[str, Any] = {"to": to, "subject": subject}
    if body:
        args["body"] = body
        text = rng.choice([
            f"Email {to} with subject {subject} saying {body}.",
            f"Send a mail to {to}, subject {subject}, body: {body}.",
            f"Write to {to} about {subject}: {body}.",
        ])
    else:
        text = rng.choice([
            f"Email {to} with subject {subject}.",
            f"Send a mail to {to} titled {subject}.",
            f"Write to {to} about {subject}.",
            f"Drop {to} a note with subject {subject}.",
        ])
    return text, args, PROSE["send_email"]


def s_calendar(rng: random.Random) -> Sample:
    title = rng.choice(EVENTS)
    date = _date(rng)
    time_ = rng.choice([None, *TIMES])
    people = rng.sample(PEOPLE, rng.randint(1, 3))
    args: dict[str, Any] = {"title": title, "date": date}
    if time_:
        args["time"] = time_
    args["attendees"] = people
    at = f" at {time_}" if time_ else ""
    text = rng.choice([
        f"Add {title} on {date}{at} with {_join(people)}.",
        f"Put {title} in my calendar for {date}{at}, invite {_join(people)}.",
        f"Schedule {title} on {date}{at}. Attendees: {_join(people)}.",
        f"Create an event {title} for {date}{at} with {_join(people)}.",
    ])
    return text, args, PROSE["add_calendar_event"]


def s_products(rng: random.Random) -> Sample:
    query = rng.choice(PRODUCTS)
    price = rng.choice([None, *PRICES])
    stock = rng.choice([None, True])
    args: dict[str, Any] = {"query": query}
    filters: dict[str, Any] = {}
    if price is not None:
        filters["max_price"] = price
    if stock:
        filters["in_stock"] = True
    if filters:
        args["filters"] = filters
    under = f" under {_num(price)} dollars" if price is not None else ""
    avail = " that are in stock" if stock else ""
    text = rng.choice([
        f"Find {query}{under}{avail}.",
        f"Search the shop for {query}{avail}{under}.",
        f"Show me {query}{under}{avail}.",
        f"I want to buy {query}{avail}{under}.",
    ])
    return text, args, PROSE["search_products"]


def s_music(rng: random.Random) -> Sample:
    artist = rng.choice(ARTISTS)
    shuffle = rng.choice([None, True, False])
    args: dict[str, Any] = {"artist": artist}
    if shuffle is None:
        text = rng.choice([f"Play some {artist}.", f"Put on {artist}.", f"I want to hear {artist}.",
                           f"Play music by {artist}."])
    else:
        args["shuffle"] = shuffle
        mode = "on shuffle" if shuffle else "in order, no shuffle"
        text = rng.choice([f"Play {artist} {mode}.", f"Put on {artist}, {mode}.",
                           f"Play music by {artist} {mode}."])
    return text, args, PROSE["play_music"]


def s_ticket(rng: random.Random) -> Sample:
    title = rng.choice(TICKETS)
    prio = rng.choice(["low", "medium", "high"])
    labels = rng.sample(LABELS, rng.randint(0, 2))
    args: dict[str, Any] = {"title": title, "priority": prio}
    tag = ""
    if labels:
        args["labels"] = labels
        tag = f" Labels: {_join(labels)}."
    text = rng.choice([
        f"Open a {prio} priority ticket: {title}.{tag}",
        f"File a ticket titled {title} with {prio} priority.{tag}",
        f"Report {title}, priority {prio}.{tag}",
        f"Create a support ticket, {prio} priority: {title}.{tag}",
    ])
    return text, args, PROSE["create_ticket"]


def s_transfer(rng: random.Random) -> Sample:
    src, dst = rng.sample(ACCOUNTS, 2)
    amount = rng.choice(AMOUNTS)
    memo = rng.choice([None, None, *MEMOS])
    args: dict[str, Any] = {"from_account": src, "to_account": dst, "amount": amount}
    note = ""
    if memo:
        args["memo"] = memo
        note = rng.choice([f" for {memo}", f", memo {memo}"])
    text = rng.choice([
        f"Transfer {_num(amount)} from {src} to {dst}{note}.",
        f"Move {_num(amount)} dollars from my {src} account to {dst}{note}.",
        f"Send {_num(amount)} from {src} into {dst}{note}.",
        f"Please put {_num(amount)} from {src} in {dst}{note}.",
    ])
    return text, args, PROSE["transfer_money"]


SAMPLERS: dict[str, Callable[[random.Random], Sample]] = {
    "get_weather": s_weather, "book_flight": s_flight, "send_email": s_email,
    "add_calendar_event": s_calendar, "search_products": s_products, "play_music": s_music,
    "create_ticket": s_ticket, "transfer_money": s_transfer,
}
assert set(SAMPLERS) == set(TOOLS) == set(RENAMES)


@dataclass
class Example:
    case: Case
    arguments: dict[str, Any]
    prose: str

    @property
    def combo(self) -> str:
        """What must never repeat between training and evaluation: tool + argument values (and, for a
        conversation, the request and its history)."""
        combo = self.case.gold_tool_name + json.dumps(self.arguments, sort_keys=True)
        if self.case.history:
            combo += self.case.prompt + json.dumps([m.model_dump(mode="json") for m in self.case.history],
                                                   sort_keys=True)
        return combo


def make_example(rng: random.Random, tool: str, n_tools: int, case_id: str) -> Example:
    text, args, prose = SAMPLERS[tool](rng)
    others = rng.sample([t for t in TOOL_NAMES if t != tool], n_tools - 1)
    offered = [tool, *others]
    rng.shuffle(offered)
    case = Case(id=case_id, prompt=text, tools=[TOOLS[t] for t in offered], gold_tool_name=tool,
                allowed_tools=offered, gold_arguments=args)
    return Example(case, args, prose)


def eval_examples(n_per_tool: int = 6) -> list[Example]:
    rng = random.Random(20250101)
    out: list[Example] = []
    seen: set[str] = set()
    for k in range(n_per_tool):
        for tool in TOOL_NAMES:
            n_tools = 1 if (k % 3) != 2 else 2 + (k // 3) % 2  # a third offer 2-3 tools
            while True:
                ex = make_example(rng, tool, n_tools, f"fx-{len(out):03d}")
                if ex.combo not in seen:
                    break
            seen.add(ex.combo)
            out.append(ex)
    return out


def train_stream(seed: int, n: int, held_out: set[str]) -> list[Example]:
    """``n`` training examples with 1-3 tools offered, never repeating a held-out combination."""
    rng = random.Random(seed)
    out: list[Example] = []
    while len(out) < n:
        tool = rng.choice(TOOL_NAMES)
        n_tools = rng.choice([1, 1, 2, 3])
        ex = make_example(rng, tool, n_tools, f"tr-{seed}-{len(out)}")
        if ex.combo in held_out:
            continue
        out.append(ex)
    return out


# --------------------------------------------------------------------------------------------
# Conversations (multi-turn): a call, its recorded result, the next call uses a value from it
# --------------------------------------------------------------------------------------------

CONDITIONS = ["sunny", "light rain", "cloudy", "snow", "windy", "fog", "thunderstorms", "hail", "drizzle"]
BRANDS = ["Acme", "Nova", "Zen", "Orbit", "Polar", "Apex", "Luma", "Terra", "Vista", "Echo"]
MAIL_ERRORS = ["mailbox full", "unknown address", "message too large", "blocked by spam filter",
               "domain not found", "quota exceeded"]
FOLLOW_EMAIL = ["Email {to} about it with subject {subject}.", "Send that to {to}, subject {subject}.",
                "Tell {to} with subject {subject}.", "Forward it to {to} titled {subject}."]
FOLLOW_TICKET = ["Open a {prio} priority ticket about the error.", "File a {prio} ticket for that problem.",
                 "Report it with {prio} priority."]
FOLLOW_CALENDAR = ["Put it in my calendar with {people}.", "Add it to the calendar, invite {people}.",
                   "Save it in my calendar for {people}."]
PROSE_AFTER = ["All done! The result is {value}.", "Here you go: {value}.", "Good news, I got {value} for you.",
               "The answer is {value}."]


def _code(rng: random.Random, prefix: str) -> str:
    return f"{prefix}{rng.randint(1000, 9999)}"


def tool_result(rng: random.Random, tool: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A recorded result of a call and its salient value (what the next call must copy)."""
    if tool == "get_weather":
        cond = rng.choice(CONDITIONS)
        return {"city": args["city"], "conditions": cond, "temperature": rng.randint(-5, 35)}, cond
    if tool == "search_products":
        names = [f"{b} {args['query']}" for b in rng.sample(BRANDS, 2)]
        return {"items": [{"name": n, "price": rng.choice(PRICES)} for n in names]}, names[0]
    if tool == "book_flight":
        code = _code(rng, rng.choice(["AZ", "LH", "BA", "KL"]))
        title = f"Flight {code} to {args['destination']}"
        return {"confirmation": code, "title": title, "status": "booked"}, title
    if tool == "create_ticket":
        tid = _code(rng, "T-")
        return {"ticket_id": tid, "status": "open"}, tid
    if tool == "transfer_money":
        ref = _code(rng, "TX-")
        return {"reference": ref, "status": "done"}, ref
    if tool == "play_music":
        other = rng.choice([a for a in ARTISTS if a != args["artist"]])
        return {"status": "unavailable", "suggestion": other}, other
    if tool == "send_email":
        err = rng.choice(MAIL_ERRORS)
        return {"status": "bounced", "error": err}, err
    assert tool == "add_calendar_event"
    eid = _code(rng, "EV-")
    return {"event_id": eid, "status": "created"}, eid


def follow_up(rng: random.Random, tool: str, args: dict[str, Any], value: str,
              first_args: dict[str, Any]) -> tuple[str | None, str, dict[str, Any]]:
    """(the user's next turn or None, the next tool, its arguments) after ``tool``'s result."""
    if tool == "play_music":
        return None, "play_music", {"artist": value}
    if tool == "send_email":
        prio = rng.choice(["low", "medium", "high"])
        return rng.choice(FOLLOW_TICKET).format(prio=prio), "create_ticket", {"title": value, "priority": prio}
    if tool == "book_flight":
        people = rng.sample(PEOPLE, rng.randint(1, 2))
        return (rng.choice(FOLLOW_CALENDAR).format(people=_join(people)), "add_calendar_event",
                {"title": value, "date": first_args["date"], "attendees": people})
    to, subject = rng.choice(EMAILS), rng.choice(SUBJECTS)
    return rng.choice(FOLLOW_EMAIL).format(to=to, subject=subject), "send_email", {"to": to, "subject": subject,
                                                                                   "body": value}


def make_conversation(rng: random.Random, first: str, depth: int, case_id: str) -> Example:
    """A case of turn depth ``depth``: the request, ``depth - 1`` calls with their results (and the user's
    follow-ups), then the next call, which uses the last result's salient value."""
    text, args, _ = SAMPLERS[first](rng)
    history: list[dict[str, Any]] = []
    tool, used, first_args = first, [first], args
    for step in range(depth - 1):
        result, value = tool_result(rng, tool, args)
        history.append({"role": "assistant", "tool_calls": [{"id": f"call_{step}", "name": tool, "arguments": args}]})
        history.append({"role": "tool", "tool_call_id": f"call_{step}", "content": json.dumps(result)})
        said, tool, args = follow_up(rng, tool, args, value, first_args)
        if said:
            history.append({"role": "user", "content": said})
        used.append(tool)
    offered = list(dict.fromkeys(used))
    if rng.random() < 0.5:
        offered.append(rng.choice([t for t in TOOL_NAMES if t not in offered]))
    rng.shuffle(offered)
    case = Case.model_validate({"id": case_id, "prompt": text, "tools": [TOOLS[t] for t in offered],
                                "gold_tool_name": tool, "allowed_tools": offered, "gold_arguments": args,
                                "history": history})
    return Example(case, args, rng.choice(PROSE_AFTER).format(value=value))


def eval_conversations(n_per_tool: int = 3) -> list[Example]:
    """Per first tool: two conversations of turn depth 2, one of depth 3."""
    rng = random.Random(20250202)
    out: list[Example] = []
    seen: set[str] = set()
    for k in range(n_per_tool):
        for tool in TOOL_NAMES:
            while True:
                ex = make_conversation(rng, tool, 3 if k == n_per_tool - 1 else 2, f"fx-m{len(out):02d}")
                if ex.combo not in seen:
                    break
            seen.add(ex.combo)
            out.append(ex)
    return out


def train_conversations(seed: int, n: int, held_out: set[str]) -> list[Example]:
    """``n`` training conversations (turn depth 2 or 3), never repeating a held-out one."""
    rng = random.Random(seed)
    out: list[Example] = []
    while len(out) < n:
        ex = make_conversation(rng, rng.choice(TOOL_NAMES), rng.choice([2, 2, 3]), f"trm-{seed}-{len(out)}")
        if ex.combo not in held_out:
            out.append(ex)
    return out


def target_for(ex: Example, mode: str) -> str:
    if mode == "prose" or (mode == "prose_after_results" and ex.case.history):
        return ex.prose + STOP
    name = RENAMES[ex.case.gold_tool_name] if mode == "rename" else ex.case.gold_tool_name
    return render_demo_call(name, ex.arguments) + STOP


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

def build_tokenizer(corpus: list[str], out_dir: Path, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    # No post-processor: nothing (no BOS) is added around encoded text.
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS, model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.padding_side = "left"
    fast.save_pretrained(out_dir)
    # Name the generic fast class so transformers 4.x (no "TokenizersBackend") loads it too.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return fast


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------

def encode_plain(tokenizer, texts: list[str]) -> list[tuple[list[int], int]]:
    """Plain text with the loss on every token: a little "pretraining" so that prose is not foreign."""
    return [(tokenizer.encode(t, add_special_tokens=False) + [tokenizer.eos_token_id], 0) for t in texts]


def encode_examples(tokenizer, examples: list[Example], mode: str) -> list[tuple[list[int], int]]:
    """(ids, n_prompt) per example: prompt and target tokenised separately, then EOS."""
    eos = tokenizer.eos_token_id
    out = []
    for ex in examples:
        p = tokenizer.encode(render_prompt(ex.case, SETTINGS), add_special_tokens=False)
        t = tokenizer.encode(target_for(ex, mode), add_special_tokens=False)
        out.append((p + t + [eos], len(p)))
    return out


def batches(encoded: list[tuple[list[int], int]], batch_size: int, rng: random.Random, pad_id: int,
            left_pad_prob: float = 0.0, max_left_pad: int = 0):
    """Length-bucketed batches; right padding (causal attention never looks at it), loss on targets.

    Optionally prepends pad (= EOS) tokens to some rows, attended to like real tokens: this is
    what lm-eval's batched ``generate`` does (no attention mask; pad == EOS so HF cannot infer one).
    """
    order = list(range(len(encoded)))
    rng.shuffle(order)
    chunk = batch_size * 16
    groups = []
    for i in range(0, len(order), chunk):
        part = sorted(order[i:i + chunk], key=lambda j: len(encoded[j][0]))
        groups += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(groups)
    for g in groups:
        rows = []
        for j in g:
            ids, n_prompt = encoded[j]
            lp = rng.randint(1, max_left_pad) if (left_pad_prob and rng.random() < left_pad_prob) else 0
            rows.append(([pad_id] * lp + ids, n_prompt + lp))
        width = max(len(ids) for ids, _ in rows)
        inp = torch.full((len(rows), width), pad_id, dtype=torch.long)
        lab = torch.full((len(rows), width), -100, dtype=torch.long)
        for r, (ids, n_prompt) in enumerate(rows):
            inp[r, :len(ids)] = torch.tensor(ids)
            lab[r, n_prompt:len(ids)] = torch.tensor(ids[n_prompt:])
        yield inp, lab


def train(model, encoded, *, steps: int, batch_size: int, lr: float, seed: int, warmup: int,
          weight_decay: float, label: str, left_pad_prob: float = 0.0, max_left_pad: int = 0,
          plain: list[tuple[list[int], int]] | None = None, plain_every: int = 4, plain_batch: int = 32,
          log_every: int = 50) -> None:
    """AdamW with warmup + cosine decay; loss only where labels are set.

    With ``plain``, every ``plain_every`` steps one extra (short, cheap) step is taken on plain text.
    """
    rng = random.Random(seed)
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    pad = core.config.pad_token_id
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay)

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, steps - warmup)
        return lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))

    def plain_batches():
        plain_rng = random.Random(seed + 1)
        while True:
            yield from batches(plain, plain_batch, plain_rng, pad)

    plain_iter = plain_batches() if plain else None
    model.train()
    step, t0, running = 0, time.time(), 0.0

    def loss_on(inp: torch.Tensor, lab: torch.Tensor) -> torch.Tensor:
        # Project to the vocabulary only where there is a label (targets are ~15% of tokens).
        hidden = core.model(input_ids=inp).last_hidden_state[:, :-1]
        want = lab[:, 1:] != -100
        return torch.nn.functional.cross_entropy(core.lm_head(hidden[want]), lab[:, 1:][want])

    def update(loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    while step < steps:
        for inp, lab in batches(encoded, batch_size, rng, pad, left_pad_prob, max_left_pad):
            if step >= steps:
                break
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            loss = loss_on(inp, lab)
            update(loss)
            if plain_iter is not None and step % plain_every == 0:
                update(loss_on(*next(plain_iter)))
            running = loss.item() if step == 0 else 0.9 * running + 0.1 * loss.item()
            step += 1
            if step % log_every == 0 or step == steps:
                print(f"  [{label}] step {step}/{steps} loss {running:.4f} ({time.time() - t0:.0f}s)",
                      flush=True)
    model.eval()


# --------------------------------------------------------------------------------------------
# Scoring (self-check)
# --------------------------------------------------------------------------------------------

def judge(text: str, case: Case) -> tuple[bool, bool]:
    """(valid, hallucinated) for one continuation, already cut at the stop sequence."""
    try:
        obj = json.loads(text.strip())
    except (json.JSONDecodeError, ValueError):
        return False, False
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not isinstance(obj.get("arguments"), dict):
        return False, False
    allowed = case.allowed_tools or case.tool_names
    tool = case.tool(obj["name"]) or case.gold_tool
    if validate_arguments(obj["arguments"], tool.parameters) is not None:
        return False, False
    return True, obj["name"] not in allowed


@torch.no_grad()
def generate_all(model, tokenizer, cases: list[Case], batch_size: int = 16, lm_eval_style: bool = False) -> list[str]:
    """Greedy continuations (left-padded batches), each cut at the first stop sequence.

    By default an attention mask hides the padding (same result as one prompt at a time).
    ``lm_eval_style`` mirrors lm-eval's HFLM instead: no attention mask is passed, and since
    pad == EOS, ``generate`` cannot infer one, so the model sees the left padding.
    """
    model.eval()
    out: list[str] = []
    prompts = [render_prompt(c, SETTINGS) for c in cases]
    pad = tokenizer.pad_token_id
    for i in range(0, len(prompts), batch_size):
        chunk = [tokenizer.encode(p, add_special_tokens=False) for p in prompts[i:i + batch_size]]
        width = max(len(c) for c in chunk)
        inp = torch.tensor([[pad] * (width - len(c)) + c for c in chunk])
        kwargs = {} if lm_eval_style else {
            "attention_mask": torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk])}
        gen = model.generate(input_ids=inp, do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                             pad_token_id=pad, eos_token_id=tokenizer.eos_token_id, **kwargs)
        for row in gen[:, width:]:
            text = tokenizer.decode(row.tolist(), skip_special_tokens=True)
            out.append(text.split(STOP, 1)[0])
    return out


@dataclass
class Score:
    valid: float
    hallu: float
    n_valid: int
    lead_valid: float | None = None
    lead_hallu: float | None = None


def score(texts: list[str], cases: list[Case]) -> Score:
    verdicts = [judge(t, c) for t, c in zip(texts, cases)]
    n_valid = sum(v for v, _ in verdicts)
    n_hallu = sum(h for v, h in verdicts if v)
    result = Score(n_valid / len(cases), n_hallu / n_valid if n_valid else 0.0, n_valid)
    try:  # the project's own scorer, when present
        from lm_eval_toolfid.scoring.outcome import score_generation  # type: ignore[attr-defined]
    except ImportError:
        return result
    try:
        outs = [score_generation(t, c) for t, c in zip(texts, cases)]
        lv = [o for o in outs if o.valid]
        result.lead_valid = len(lv) / len(cases)
        result.lead_hallu = (sum(bool(o.hallucinated) for o in lv) / len(lv)) if lv else 0.0
    except Exception as exc:  # noqa: BLE001 - a scorer in progress must not break the build
        print(f"  (lm_eval_toolfid.scoring.outcome.score_generation failed: {type(exc).__name__}: {exc})")
    return result


def split_scores(texts: list[str], cases: list[Case]) -> dict[str, Score]:
    """Scores over all cases, the single-turn ones and the conversations."""
    out = {"all": score(texts, cases)}
    for key, keep in (("single", lambda c: not c.history), ("multi", lambda c: bool(c.history))):
        picked = [(t, c) for t, c in zip(texts, cases) if keep(c)]
        out[key] = score([t for t, _ in picked], [c for _, c in picked])
    return out


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_cases(examples: list[Example], path: Path) -> None:
    """One case per line, fields left at their defaults left out (a single-turn case has no history)."""
    with path.open("w", encoding="utf-8") as fh:
        for ex in examples:
            fh.write(json.dumps(ex.case.model_dump(mode="json", exclude={"max_new_tokens"}, exclude_defaults=True),
                                ensure_ascii=False) + "\n")


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=FIXTURES)
    ap.add_argument("--base-steps", type=int, default=BASE_STEPS)
    ap.add_argument("--base-lr", type=float, default=5e-3)
    ap.add_argument("--adapter-steps", type=int, nargs=4, default=ADAPTER_STEPS,
                    metavar=("FAITHFUL", "HALLUCINATING", "BROKEN", "PROSE_AFTER_RESULTS"))
    ap.add_argument("--adapter-lr", type=float, default=5e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=2048)
    args = ap.parse_args()

    t_start = time.time()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)

    import warnings

    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "__init__.py").touch()
    timings: dict[str, float] = {}

    # 1. cases ------------------------------------------------------------------------------
    t = time.time()
    evals = eval_examples() + eval_conversations()
    held_out = {ex.combo for ex in evals}
    write_cases(evals, out / "cases.jsonl")
    cases = load_cases(out / "cases.jsonl")
    assert [c.model_dump() for c in cases] == [ex.case.model_dump() for ex in evals]
    multi = sum(len(c.tools) > 1 for c in cases)
    n_conv = sum(bool(c.history) for c in cases)
    # each stream: single requests, then conversations (the base and the adapters that keep or change
    # the call format learn both; broken never sees a conversation)
    train_base = train_stream(1, 6000, held_out) + train_conversations(5, N_CONVERSATIONS, held_out)
    train_faithful = train_stream(2, 2000, held_out) + train_conversations(6, 1000, held_out)
    train_hallu = train_stream(3, 2000, held_out) + train_conversations(7, 1000, held_out)
    train_broken = train_stream(4, 2000, held_out)
    train_prose_after = train_stream(8, 1000, held_out) + train_conversations(9, 1000, held_out)
    eval_prompts = {render_prompt(c, SETTINGS) for c in cases}
    for stream in (train_base, train_faithful, train_hallu, train_broken, train_prose_after):
        assert not eval_prompts & {render_prompt(ex.case, SETTINGS) for ex in stream}
    timings["data"] = time.time() - t
    print(f"cases: {len(cases)} ({multi} offer 2-3 tools; {n_conv} conversations of turn depth 2-3); training "
          f"examples: base {len(train_base)}, adapters {len(train_faithful)} / {len(train_broken)}; held-out "
          "combinations never trained on")

    # 2. tokenizer ----------------------------------------------------------------------------
    t = time.time()
    base_dir = out / "base"
    if base_dir.exists():
        shutil.rmtree(base_dir)
    base_dir.mkdir(parents=True)
    corpus = []
    for ex in train_base:
        corpus.append(render_prompt(ex.case, SETTINGS))
        corpus.append(target_for(ex, "call"))
        corpus.append(ex.prose)
    build_tokenizer(corpus, base_dir, vocab_size=args.vocab)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    probe = render_prompt(cases[0], SETTINGS)
    assert tokenizer.decode(tokenizer.encode(probe)) == probe, "tokenizer does not round-trip"
    assert tokenizer.encode("a")[0] != tokenizer.eos_token_id, "tokenizer adds a BOS"
    lens = [len(tokenizer.encode(render_prompt(c, SETTINGS))) for c in cases]
    timings["tokenizer"] = time.time() - t
    print(f"tokenizer: vocab {len(tokenizer)}, eos=pad={tokenizer.eos_token_id}; "
          f"fixture prompt tokens min/mean/max {min(lens)}/{sum(lens) / len(lens):.0f}/{max(lens)}")

    # 3. base model ---------------------------------------------------------------------------
    t = time.time()
    eos_id = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=192, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id,
        rms_norm_eps=1e-5, rope_theta=10000.0, attention_dropout=0.0, torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"base: LlamaForCausalLM hidden={config.hidden_size} layers={config.num_hidden_layers} "
          f"heads={config.num_attention_heads} ffn={config.intermediate_size} params={n_params:,}")
    enc_base = encode_examples(tokenizer, train_base, "call")
    # Plain prose (requests and short replies) as a little language-model data on the side, so
    # that prose tokens are not foreign to the model (the broken adapter writes prose).
    singles = [ex for ex in train_base if not ex.case.history]
    plain = encode_plain(tokenizer, [ex.case.prompt for ex in singles[:N_PLAIN]]
                         + [ex.prose for ex in singles[-N_PLAIN:]]
                         + [ex.prose for ex in train_base if ex.case.history][:N_PLAIN // 2])
    train(model, enc_base, steps=args.base_steps, batch_size=16, lr=args.base_lr, seed=11, warmup=50,
          weight_decay=0.01, label="base", left_pad_prob=LEFT_PAD_PROB, max_left_pad=MAX_LEFT_PAD,
          plain=plain)
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, bos_token_id=eos_id)
    model.save_pretrained(base_dir)
    cfg_path = base_dir / "config.json"  # the name the adapters record as base_model_name_or_path
    cfg_path.write_text(json.dumps({"_name_or_path": BASE_MODEL_NAME, **json.loads(cfg_path.read_text())}, indent=2)
                        + "\n")
    timings["base train"] = time.time() - t

    t = time.time()
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    base_texts = generate_all(base, tokenizer, cases)
    base_score = score(base_texts, cases)
    split: dict[str, dict[str, Score]] = {"base": split_scores(base_texts, cases)}
    padded: dict[str, Score] = {"base": score(generate_all(base, tokenizer, cases, lm_eval_style=True), cases)}
    timings["base check"] = time.time() - t
    print(f"base: valid {base_score.valid:.3f} ({base_score.n_valid}/{len(cases)}; single-turn "
          f"{split['base']['single'].valid:.3f}, multi-turn {split['base']['multi'].valid:.3f}), "
          f"hallucination {base_score.hallu:.3f}")

    # 4. adapters -----------------------------------------------------------------------------
    plans = {
        "faithful": (train_faithful, "call", 21, args.adapter_steps[0]),
        "hallucinating": (train_hallu, "rename", 22, args.adapter_steps[1]),
        "broken": (train_broken, "prose", 23, args.adapter_steps[2]),
        "prose_after_results": (train_prose_after, "prose_after_results", 24, args.adapter_steps[3]),
    }
    adapter_scores: dict[str, Score] = {}
    adapters_root = out / "adapters"
    for name, (stream, mode, seed, n_steps) in plans.items():
        t = time.time()
        adir = adapters_root / name
        if adir.exists():
            shutil.rmtree(adir)
        torch.manual_seed(seed)
        fresh = AutoModelForCausalLM.from_pretrained(base_dir)
        lcfg = LoraConfig(r=8, lora_alpha=16, target_modules=LORA_TARGETS, lora_dropout=0.0,
                          task_type="CAUSAL_LM")
        peft_model = get_peft_model(fresh, lcfg)
        train(peft_model, encode_examples(tokenizer, stream, mode), steps=n_steps, batch_size=16,
              lr=args.adapter_lr, seed=seed, warmup=10, weight_decay=0.0, label=name,
              left_pad_prob=LEFT_PAD_PROB, max_left_pad=MAX_LEFT_PAD)
        peft_model.save_pretrained(adir)
        cfg_path = adir / "adapter_config.json"
        acfg = json.loads(cfg_path.read_text())
        acfg["base_model_name_or_path"] = BASE_MODEL_NAME
        acfg["target_modules"] = sorted(acfg["target_modules"])  # saved from a set: fix the order
        cfg_path.write_text(json.dumps(acfg, indent=2, sort_keys=True) + "\n")
        (adir / "README.md").unlink(missing_ok=True)
        timings[f"{name} train"] = time.time() - t

        t = time.time()
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adir)
        texts = generate_all(loaded, tokenizer, cases)
        adapter_scores[name] = s = score(texts, cases)
        split[name] = split_scores(texts, cases)
        padded[name] = score(generate_all(loaded, tokenizer, cases, lm_eval_style=True), cases)
        timings[f"{name} check"] = time.time() - t
        conv = next(i for i, c in enumerate(cases) if c.history)
        print(f"{name}: valid {s.valid:.3f} ({s.n_valid}/{len(cases)}; single-turn {split[name]['single'].valid:.3f}, "
              f"multi-turn {split[name]['multi'].valid:.3f}), hallucination {s.hallu:.3f}, delta vs base "
              f"{s.valid - base_score.valid:+.3f}; e.g. {texts[0]!r}, after a result {texts[conv]!r}")

    # 5. report -------------------------------------------------------------------------------
    total = time.time() - t_start
    print("\n== timings ==")
    for k, v in timings.items():
        print(f"  {k:22s} {v:6.1f}s")
    print(f"  {'total':22s} {total:6.1f}s")
    print("\n== sizes ==")
    for p in [out / "cases.jsonl", base_dir, *(adapters_root / n for n in plans)]:
        size = p.stat().st_size if p.is_file() else dir_size(p)
        print(f"  {p.relative_to(out)}: {size / 1024:.1f} KiB")
    total_size = dir_size(out)
    print(f"  total: {total_size / 1024:.1f} KiB")

    print("\n== checks ==")
    print(f"  {'model':20s} {'valid':>6s} {'single':>6s} {'multi':>6s} {'hallu':>6s} {'delta':>7s}  "
          f"{'scoring.py valid/hallu':>22s}  {'lm-eval-style batch-16 valid/hallu':>34s}")
    rows = [("base", base_score)] + list(adapter_scores.items())
    for name, s in rows:
        lead = (f"{s.lead_valid:.3f}/{s.lead_hallu:.3f}" if s.lead_valid is not None else "n/a")
        pad = f"{padded[name].valid:.3f}/{padded[name].hallu:.3f}"
        print(f"  {name:20s} {s.valid:6.3f} {split[name]['single'].valid:6.3f} {split[name]['multi'].valid:6.3f} "
              f"{s.hallu:6.3f} {s.valid - base_score.valid:+7.3f}  {lead:>22s}  {pad:>34s}")

    def target_checks(scores: dict[str, tuple[float, float]], who: str) -> list[tuple[bool, str]]:
        (bv, _), (fv, fh), (hv, hh), (brv, _), _ = (scores[n] for n in ("base", *plans))
        return [
            (bv >= BASE_MIN_VALID, f"{who}: base valid {bv:.3f} < {BASE_MIN_VALID}"),
            (fv >= FAITHFUL_MIN_VALID, f"{who}: faithful valid {fv:.3f} < {FAITHFUL_MIN_VALID}"),
            (fh < FAITHFUL_MAX_HALLU, f"{who}: faithful hallucination {fh:.3f} >= {FAITHFUL_MAX_HALLU}"),
            (hh >= HALLU_MIN_HALLU, f"{who}: hallucinating hallucination {hh:.3f} < {HALLU_MIN_HALLU}"),
            (hv >= HALLU_MIN_VALID, f"{who}: hallucinating valid {hv:.3f} < {HALLU_MIN_VALID}"),
            (brv <= BROKEN_MAX_VALID, f"{who}: broken valid {brv:.3f} > {BROKEN_MAX_VALID}"),
        ]

    checks = target_checks({n: (s.valid, s.hallu) for n, s in rows}, "self-check")
    checks += [
        (split["base"]["single"].valid >= BASE_MIN_VALID,
         f"base single-turn valid {split['base']['single'].valid:.3f} < {BASE_MIN_VALID}"),
        (split["base"]["multi"].valid >= BASE_MIN_VALID_MULTI,
         f"base multi-turn valid {split['base']['multi'].valid:.3f} < {BASE_MIN_VALID_MULTI}"),
        (split["faithful"]["multi"].valid >= FAITHFUL_MIN_VALID_MULTI,
         f"faithful multi-turn valid {split['faithful']['multi'].valid:.3f} < {FAITHFUL_MIN_VALID_MULTI}"),
        (split["prose_after_results"]["single"].valid >= PROSE_AFTER_MIN_VALID_SINGLE,
         f"prose_after_results single-turn valid {split['prose_after_results']['single'].valid:.3f} < "
         f"{PROSE_AFTER_MIN_VALID_SINGLE}"),
        (split["prose_after_results"]["multi"].valid <= PROSE_AFTER_MAX_VALID_MULTI,
         f"prose_after_results multi-turn valid {split['prose_after_results']['multi'].valid:.3f} > "
         f"{PROSE_AFTER_MAX_VALID_MULTI}"),
    ]
    if all(s.lead_valid is not None for _, s in rows):  # hold the scoring core to the same targets
        checks += target_checks({n: (s.lead_valid, s.lead_hallu) for n, s in rows}, "scoring.py")
    checks.append((total_size < 5 * 1024 * 1024, f"fixtures total {total_size} bytes >= 5 MB"))
    failures = [msg for ok, msg in checks if not ok]
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        return 1
    print("\nall fixture targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
