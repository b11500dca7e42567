#!/usr/bin/env python3
"""Generate the bundled default case set: ``lm_eval_toolfid/cases/default_cases.jsonl``.

Every case is one natural-language request, one to five OpenAI-style tool specs, the tool
that should be called and the exact arguments expected. Values are sampled from small pools
with a single ``random.Random(1234)``, so re-running the script rewrites byte-identical files.

Each tool below is a schema plus a generator ``gen(r) -> (prompt, gold_arguments)``. A
generator writes every string argument verbatim into the prompt (enum values may be
paraphrased: "in Fahrenheit" -> "fahrenheit") and every number exactly as JSON writes it;
optional arguments appear in ``gold_arguments`` only when the prompt asks for them.

The script checks every case (pydantic model, argument schema, values recoverable from the
prompt), writes the JSONL file, prints a markdown statistics block and saves that block to
``lm_eval_toolfid/cases/default_cases_stats.md``.

Usage: python scripts/make_default_cases.py
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lm_eval_toolfid.core.records import Case  # noqa: E402
from lm_eval_toolfid.core.schema import check_tool_schema, validate_arguments  # noqa: E402

SEED = 1234
OUT_PATH = ROOT / "lm_eval_toolfid" / "cases" / "default_cases.jsonl"
STATS_PATH = ROOT / "lm_eval_toolfid" / "cases" / "default_cases_stats.md"

CASES_PER_TOOL = 4
MULTI_TOOL_SHARE = 0.5  # probability that a case offers distractor tools
TOOLS_OFFERED_WEIGHTS = {2: 4, 3: 3, 4: 2, 5: 2}  # how many tools a multi-tool case offers
MAX_PROMPT_CHARS = 300
RESERVED_NAMES = {"convert_currency", "set_alarm", "cancel_alarm", "translate_text", "list_files", "delete_file"}

# Domains whose tools make plausible distractors for each other (same domain first).
NEIGHBOURS: dict[str, list[str]] = {
    "weather": ["maps", "travel"],
    "calendar": ["email", "tasks", "hr"],
    "email": ["calendar", "tasks"],
    "travel": ["maps", "weather", "dining"],
    "shop": ["shipping", "bank"],
    "bank": ["shop", "hr"],
    "home": ["music", "weather"],
    "maps": ["travel", "weather", "dining"],
    "recipes": ["fitness", "shop", "dining"],
    "fitness": ["recipes", "music"],
    "music": ["home", "cinema"],
    "files": ["db", "email"],
    "db": ["files", "issues"],
    "issues": ["db", "tasks"],
    "hr": ["calendar", "bank"],
    "shipping": ["shop"],
    "tasks": ["calendar", "issues", "email"],
    "dining": ["maps", "recipes", "cinema"],
    "cinema": ["dining", "music"],
}

# --------------------------------------------------------------------------- schema helpers


def s(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **kw}


def e(desc: str, values: list[str]) -> dict[str, Any]:
    return {"type": "string", "enum": list(values), "description": desc}


def i(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "integer", "description": desc, **kw}


def n(desc: str, **kw: Any) -> dict[str, Any]:
    return {"type": "number", "description": desc, **kw}


def b(desc: str) -> dict[str, Any]:
    return {"type": "boolean", "description": desc}


def arr(desc: str, items: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"type": "array", "description": desc, "items": items, **kw}


def obj(props: dict[str, Any], required: list[str], desc: str | None = None, closed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object"}
    if desc:
        out["description"] = desc
    out["properties"] = props
    out["required"] = required
    if closed:
        out["additionalProperties"] = False
    return out


STR_ITEM = {"type": "string"}
INT_ITEM = {"type": "integer"}

# --------------------------------------------------------------------------- tool registry

Gen = Callable[[random.Random], "tuple[str, dict[str, Any]]"]


@dataclass
class Tool:
    domain: str
    name: str
    description: str
    parameters: dict[str, Any]
    gen: Gen

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


TOOLS: list[Tool] = []


def tool(domain: str, name: str, description: str, props: dict[str, Any], required: list[str],
         closed: bool = False) -> Callable[[Gen], Gen]:
    def deco(fn: Gen) -> Gen:
        TOOLS.append(Tool(domain, name, description, obj(props, required, closed=closed), fn))
        return fn

    return deco


# --------------------------------------------------------------------------- value pools

CITIES = ["Lisbon", "Osaka", "Denver", "Nairobi", "Montreal", "Krakow", "Austin", "Melbourne", "Seattle",
          "Edinburgh", "Valparaiso", "Hanoi", "Reykjavik", "Cape Town", "Bologna", "Tucson", "Bergen", "Porto",
          "Kyoto", "Chicago", "Ljubljana", "Halifax", "Cusco", "Tallinn"]
REGIONS = ["Colorado", "Queensland", "Bavaria", "Ontario", "Kyushu", "Andalusia", "Florida", "Patagonia",
           "the Scottish Highlands", "Kerala", "British Columbia", "Tasmania"]
AIRPORTS = ["LIS", "JFK", "SFO", "NRT", "LHR", "CDG", "DEN", "SYD", "YUL", "BCN", "AMS", "SIN", "ORD", "MEX",
            "DXB", "FCO", "KIX", "ZRH"]
AIRLINES = ["TP", "LH", "UA", "BA", "NH", "AF", "KL", "QF", "DL", "AC"]
FIRST = ["Amara", "Bruno", "Chen", "Dana", "Elif", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kofi", "Lena",
         "Mateo", "Nadia", "Oskar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara",
         "Zoe"]
LAST = ["Okafor", "Silva", "Nakamura", "Fischer", "Haddad", "Lindqvist", "Moreau", "Patel", "Kowalski",
        "Reyes", "Brennan", "Osei", "Duarte", "Ivanova", "Larsen", "Mendes"]
MAIL_DOMAINS = ["example.com", "acme.io", "northwind.org", "contoso.net", "globex.co"]
ADDRESSES = [  # street, city, postal code, ISO country code
    ("14 Rua Augusta", "Lisbon", "1100-048", "PT"),
    ("221 Elm Street", "Austin", "78701", "US"),
    ("Kastanienallee 12", "Berlin", "10435", "DE"),
    ("5 Rue des Lilas", "Lyon", "69003", "FR"),
    ("88 George Street", "Edinburgh", "EH2 3ES", "GB"),
    ("1200 Pine Avenue", "Seattle", "98101", "US"),
    ("Via Zamboni 33", "Bologna", "40126", "IT"),
    ("47 Queen Street West", "Toronto", "M5H 2M5", "CA"),
    ("Prinsengracht 263", "Amsterdam", "1016 GV", "NL"),
    ("9 Harbour Road", "Cape Town", "8001", "ZA"),
]
EVENT_TITLES = ["Quarterly planning", "Dentist appointment", "Design critique", "Sprint retro", "Coffee with Sven",
                "Parent-teacher meeting", "Vendor demo", "Budget review", "Yoga class", "Onboarding session",
                "Board prep", "Team lunch"]
MEETING_PLACES = ["Room 4B", "the Harbor conference room", "Cafe Lumen", "Building 2, floor 3", "the main lobby"]
EMAIL_MSGS = [
    ("Q3 budget review", "The draft budget is in the shared folder, please comment by Friday."),
    ("Lunch on Thursday?", "Are you free for lunch on Thursday around noon?"),
    ("Invoice 4471 overdue", "A friendly reminder that invoice 4471 is now two weeks overdue."),
    ("Offsite agenda", "Attached is the agenda for next week's offsite."),
    ("Server maintenance tonight", "The staging server will be down from 22:00 to 23:00."),
    ("Welcome aboard", "Welcome to the team! Your laptop will be ready on Monday."),
    ("Contract signed", "Good news: the client signed the contract this morning."),
    ("Running late", "Stuck in traffic, I will be about 15 minutes late."),
    ("Slides for Monday", "Could you send me the final slides before Monday?"),
]
MAIL_QUERIES = ["flight confirmation", "invoice", "password reset", "team offsite", "tax documents",
                "order shipped", "contract renewal", "wedding photos", "expense approval"]
ORDER_PREFIX = "ORD-"
PRODUCT_QUERIES = {
    "wireless earbuds": ["electronics", "audio"],
    "standing desk": ["furniture", "home office"],
    "trail running shoes": ["sports", "footwear"],
    "espresso machine": ["kitchen", "appliances"],
    "mechanical keyboard": ["electronics", "computer accessories"],
    "rain jacket": ["outdoor", "clothing"],
    "yoga mat": ["sports", "fitness"],
    "air purifier": ["home", "appliances"],
}
COUPONS = ["SPRING15", "WELCOME10", "FREESHIP", "VIP20"]
PAYEES = ["City Water Utility", "Metro Electric", "Sunrise Dental", "Greenfield Property Management",
          "Northside Internet", "Bright Kids Daycare"]
INVOICE_CLIENTS = [("Northwind Traders", "billing@northwind.org"), ("Globex Corporation", "ap@globex.co"),
                   ("Initech", "accounts@initech.com"), ("Umbrella Studio", "finance@umbrella.studio")]
INVOICE_LINES = ["Logo design", "Consulting", "Website hosting", "Setup fee", "Copywriting", "Data migration",
                 "Training workshop"]
ROOMS = ["living room", "kitchen", "bedroom", "office", "hallway", "nursery", "dining room", "basement"]
LIGHT_COLORS = ["warm white", "blue", "soft pink", "amber", "daylight", "green"]
SCENES = ["Movie Night", "Good Morning", "Away Mode", "Dinner Party", "Bedtime", "Reading"]
LANDMARKS = ["Alexanderplatz, Berlin", "Union Square, San Francisco", "Shibuya Station, Tokyo",
             "Plaza Mayor, Madrid", "Circular Quay, Sydney", "Grand Central Terminal, New York",
             "Rossio Square, Lisbon", "Dam Square, Amsterdam", "Old Town Square, Prague"]
CITY_STOPS = {
    "Berlin": ["Alexanderplatz", "Brandenburg Gate", "Checkpoint Charlie", "East Side Gallery", "Tempelhofer Feld"],
    "Lisbon": ["Rossio Square", "Belem Tower", "LX Factory", "Alfama", "Parque das Nacoes"],
    "Tokyo": ["Shibuya Station", "Tokyo Tower", "Ueno Park", "Asakusa", "Shinjuku Gyoen"],
    "Chicago": ["Union Station", "Navy Pier", "Wrigley Field", "Millennium Park", "O'Hare Airport"],
}
INGREDIENTS = ["chickpeas", "spinach", "salmon", "tofu", "sweet potato", "mushrooms", "lentils", "chicken thighs",
               "zucchini", "feta", "quinoa", "coconut milk", "eggplant", "rice noodles", "black beans"]
CUISINES = ["Thai", "Italian", "Mexican", "Indian", "Japanese", "Greek", "Moroccan", "Korean"]
GROCERIES = [("potatoes", "kg"), ("milk", "litres"), ("eggs", None), ("flour", "kg"), ("tomatoes", None),
             ("olive oil", "bottles"), ("apples", None), ("cheddar", "grams"), ("rice", "kg")]
FOODS = ["oatmeal with berries", "a banana", "greek yogurt", "a turkey sandwich", "a green salad", "salmon",
         "brown rice", "two boiled eggs", "a protein bar", "lentil soup", "an apple", "toast with peanut butter"]
ARTISTS = ["Fleetwood Mac", "Miles Davis", "Daft Punk", "Nina Simone", "Radiohead", "Bad Bunny", "Arctic Monkeys",
           "Fela Kuti"]
ALBUMS = ["Kind of Blue", "Rumours", "Random Access Memories", "OK Computer", "Blue Train", "Abbey Road"]
PLAYLISTS = ["Deep Focus", "Sunday Morning Jazz", "Workout Hits", "Road Trip Classics", "Rainy Day Lo-Fi"]
SONGS = ["Dreams", "Get Lucky", "Feeling Good", "Karma Police", "Here Comes the Sun", "So What"]
DEVICES = ["Kitchen speaker", "Living Room TV", "Bedroom Echo", "Office soundbar"]
PLAYLIST_NAMES = ["Summer Drive 2026", "Focus Beats", "Dinner Jazz", "Morning Run", "Chill Sundays"]
LOCAL_FILES = ["/home/dana/Downloads/taxes-2025.pdf", "/Users/sven/Desktop/site-photos.zip",
               "C:/Users/priya/Documents/offer-letter.docx", "/home/kofi/reports/q3-summary.xlsx",
               "/Users/lena/Pictures/IMG_4821.jpg", "/tmp/export/customers.csv"]
CLOUD_FOLDERS = ["/Finance/2025", "/Projects/Apollo", "/Shared/Marketing", "/Photos/Site visits", "/HR/Contracts"]
CLOUD_FILES = ["/Projects/Apollo/specs.docx", "/Finance/2025/budget.xlsx", "/Shared/Marketing/launch-deck.pptx",
               "/HR/Contracts/template.pdf", "/Photos/Site visits/roof.jpg", "/Research/interviews.csv"]
FILE_TYPES = ["pdf", "docx", "xlsx", "pptx", "png", "csv"]
FILE_QUERIES = ["budget", "onboarding", "roadmap", "invoice", "floor plan", "press release"]
DATABASES = ["analytics", "orders_prod", "inventory", "crm_staging", "billing"]
SQL_QUERIES = [
    "SELECT country, COUNT(*) FROM customers GROUP BY country",
    "SELECT * FROM orders WHERE status = 'pending'",
    "SELECT sku, stock FROM products WHERE stock < 10",
    "SELECT AVG(total) FROM invoices WHERE paid = true",
    "SELECT email FROM users ORDER BY created_at DESC",
]
TABLES = ["sessions", "audit_log", "orders", "carts", "events", "customers"]
PROJECT_KEYS = ["WEB", "API", "MOB", "OPS", "DATA", "PAY"]
ISSUE_TITLES = ["Login button unresponsive on Safari", "CSV export drops the last row",
                "Checkout times out for large carts", "Dark mode colors unreadable in settings",
                "Nightly backup job fails silently", "Search returns duplicates"]
ISSUE_DESCRIPTIONS = ["Happens every time since the last release.", "Reported by three customers this week.",
                      "Steps to reproduce are in the support ticket.", "Only on production, not staging."]
USERNAMES = ["dana.okafor", "hiro.n", "priya.patel", "mateo.reyes", "greta.f", "kofi.osei"]
REPOS = ["acme/web-frontend", "acme/billing-service", "northwind/mobile-app", "contoso/infra", "globex/data-pipeline"]
LABELS = ["bug", "regression", "ui", "backend", "needs-triage", "good-first-issue", "performance", "security"]
POSITIONS = ["Senior Data Engineer", "Product Designer", "Backend Developer", "Customer Success Manager",
             "Site Reliability Engineer", "Marketing Analyst"]
LEAVE_NOTES = ["Family trip, handover doc is ready.", "Moving house.", "Visiting my grandparents.",
               "Back online on the following Monday."]
EXPENSE_DESCRIPTIONS = {"travel": ["airport taxi", "train ticket"], "meals": ["client dinner", "team lunch"],
                        "lodging": ["hotel, two nights", "conference hotel"], "supplies": ["printer paper", "USB-C hub"]}
CARRIERS = ["UPS", "FedEx", "DHL", "USPS"]
RESTAURANTS = ["Casa Nostra", "Blue Fin Sushi", "The Copper Pot", "Le Petit Jardin", "Taqueria El Sol",
               "Saffron House", "Nordic Table"]
DISHES = ["pad thai", "margherita pizza", "chicken tikka masala", "falafel wrap", "miso ramen", "caesar salad",
          "beef burrito", "veggie burger", "garlic naan", "spring rolls"]
SPECIAL_REQUESTS = ["It's a birthday, a small cake would be lovely.", "One guest uses a wheelchair.",
                    "We need a high chair.", "Quiet table if possible."]
CINEMAS = ["Rialto Cinema", "Odeon Leicester Square", "Cineworld Glasgow", "The Roxy", "Metro Cinemas Downtown"]
MOVIES = ["The Last Lighthouse", "Orbital Drift", "Paper Tigers", "Midnight in Lagos", "The Glass Orchard",
          "Salt and Iron"]
TASK_TITLES = ["Renew passport", "Prepare tax return", "Book venue for the offsite", "Fix the garden fence",
               "Draft the Q2 newsletter", "Order birthday present for Rosa"]
SUBTASKS = ["Collect receipts", "Fill in the form", "Get photos taken", "Email the venue", "Compare quotes",
            "Buy wrapping paper", "Write the intro"]
NOTE_ITEMS = [("Wifi password for guests", "Network GuestNet, password is on the fridge magnet."),
              ("Gift ideas", "Rosa: pottery class. Sven: hiking socks."),
              ("Meeting notes 2026-02-11", "Agreed to ship the beta in April; Hiro owns QA."),
              ("Book list", "Piranesi, The Overstory, Braiding Sweetgrass.")]
NOTE_FOLDERS = ["Personal", "Work", "Recipes", "Travel"]

# --------------------------------------------------------------------------- samplers


def person(r: random.Random) -> str:
    return f"{r.choice(FIRST)} {r.choice(LAST)}"


def email(r: random.Random) -> str:
    first, last = r.choice(FIRST), r.choice(LAST)
    return f"{first.lower()}.{last.lower()}@{r.choice(MAIL_DOMAINS)}"


def emails(r: random.Random, k: int) -> list[str]:
    out: list[str] = []
    while len(out) < k:
        x = email(r)
        if x not in out:
            out.append(x)
    return out


def day(r: random.Random) -> dt.date:
    return dt.date(2026, r.randint(1, 12), r.randint(1, 28))


def iso(d: dt.date) -> str:
    return d.isoformat()


def date_str(r: random.Random) -> str:
    return iso(day(r))


def date_range(r: random.Random, lo: int, hi: int) -> tuple[str, str]:
    start = day(r)
    return iso(start), iso(start + dt.timedelta(days=r.randint(lo, hi)))


def clock(r: random.Random, lo: int = 7, hi: int = 19) -> str:
    return f"{r.randint(lo, hi):02d}:{r.choice(['00', '15', '30', '45'])}"


def token(r: random.Random, k: int, alphabet: str = "abcdefghjkmnpqrstuvwxyz23456789") -> str:
    return "".join(r.choice(alphabet) for _ in range(k))


def digits(r: random.Random, k: int) -> str:
    return str(r.randint(10 ** (k - 1), 10 ** k - 1))


def money(r: random.Random, lo: int, hi: int, whole_share: float = 0.3) -> int | float:
    """An amount: sometimes whole, otherwise with two decimals whose last digit is not 0."""
    if r.random() < whole_share:
        return r.randint(lo, hi)
    cents = r.randint(lo * 100, hi * 100)
    if cents % 10 == 0:
        cents += r.randint(1, 9)
    return cents / 100


def tenths(r: random.Random, lo: int, hi: int) -> float:
    """A number with one non-zero decimal, e.g. 8.4."""
    return r.randint(lo, hi - 1) + r.randint(1, 9) / 10


def join_en(xs: list[Any], conj: str = "and") -> str:
    xs = [str(x) for x in xs]
    if len(xs) == 1:
        return xs[0]
    return ", ".join(xs[:-1]) + f" {conj} " + xs[-1]


def pick(r: random.Random, templates: list[str], **kw: Any) -> str:
    return r.choice(templates).format(**kw)


def chance(r: random.Random, p: float = 0.5) -> bool:
    return r.random() < p


# =========================================================================== tools
# --------------------------------------------------------------------------- weather

UNITS = ["celsius", "fahrenheit"]


@tool("weather", "get_current_weather",
      "Get the current weather conditions (temperature, wind, precipitation) for a city.",
      {"location": s("City name, e.g. 'Lisbon'."),
       "units": e("Temperature unit for the response.", UNITS),
       "include_air_quality": b("Also return the air-quality index.")},
      ["location"])
def _current_weather(r):
    loc = r.choice(CITIES)
    a: dict[str, Any] = {"location": loc}
    u = aq = ""
    if chance(r):
        a["units"] = r.choice(UNITS)
        u = f" (temperatures in {a['units'].capitalize()})"
    if chance(r, 0.35):
        a["include_air_quality"] = True
        aq = r.choice([" Also include the air quality index.", " I'd like the air quality too."])
    return pick(r, ["What's the weather in {loc} right now{u}?{aq}",
                    "Can you check the current conditions in {loc}{u}?{aq}",
                    "I'm about to go for a walk in {loc}. How is the weather at the moment{u}?{aq}",
                    "Current weather for {loc}{u}, please.{aq}"], loc=loc, u=u, aq=aq), a


@tool("weather", "get_weather_forecast", "Get a daily (or hourly) weather forecast for the coming days.",
      {"location": s("City name."),
       "days": i("Number of days to forecast.", minimum=1, maximum=14),
       "units": e("Temperature unit.", UNITS),
       "hourly": b("Return hourly values instead of daily summaries.")},
      ["location", "days"])
def _forecast(r):
    loc, days = r.choice(CITIES), r.randint(2, 10)
    a: dict[str, Any] = {"location": loc, "days": days}
    u = h = ""
    if chance(r, 0.4):
        a["units"] = r.choice(UNITS)
        u = f" in {a['units'].capitalize()}"
    if chance(r, 0.3):
        a["hourly"] = True
        h = r.choice([" I want hourly values.", " Break it down by hour."])
    return pick(r, ["Give me a {days}-day forecast for {loc}{u}.{h}",
                    "What will the weather be like in {loc} over the next {days} days{u}?{h}",
                    "I'm visiting {loc} soon. Forecast for the coming {days} days{u}, please.{h}"],
                loc=loc, days=days, u=u, h=h), a


@tool("weather", "get_weather_alerts", "List active weather warnings and advisories for a region.",
      {"region": s("Region, state or city."),
       "min_severity": e("Only return alerts at or above this severity.", ["minor", "moderate", "severe", "extreme"])},
      ["region"])
def _alerts(r):
    region = r.choice(REGIONS)
    a: dict[str, Any] = {"region": region}
    sev = ""
    if chance(r):
        lvl = r.choice(["moderate", "severe", "extreme"])
        a["min_severity"] = lvl
        sev = {"moderate": " (moderate severity or worse)", "severe": ", only severe or extreme ones",
               "extreme": ", only the extreme ones"}[lvl]
    return pick(r, ["Are there any weather warnings for {region}{sev}?",
                    "Check active weather alerts in {region}{sev}.",
                    "My parents live in {region} - is there a storm advisory or any other weather alert out{sev}?"],
                region=region, sev=sev), a


# --------------------------------------------------------------------------- calendar


@tool("calendar", "create_calendar_event", "Create an event in the user's primary calendar.",
      {"title": s("Event title."),
       "date": s("Date as YYYY-MM-DD."),
       "start_time": s("Start time, 24-hour HH:MM."),
       "duration_minutes": i("Length of the event in minutes.", minimum=5, maximum=720),
       "attendees": arr("Email addresses of people to invite.", STR_ITEM),
       "location": s("Where the event takes place."),
       "reminder": obj({"minutes_before": i("How long before the start to remind.", minimum=0),
                        "method": e("How to deliver the reminder.", ["email", "popup"])},
                       ["minutes_before"], "Reminder settings.")},
      ["title", "date", "start_time", "duration_minutes"])
def _create_event(r):
    title, d, tm, dur = r.choice(EVENT_TITLES), date_str(r), clock(r), r.choice([15, 30, 45, 60, 90, 120])
    a: dict[str, Any] = {"title": title, "date": d, "start_time": tm, "duration_minutes": dur}
    att = loc = rem = ""
    opts = r.sample(["att", "loc", "rem"], r.choice([0, 1, 1, 2]))
    if "att" in opts:
        people = emails(r, r.randint(1, 2))
        a["attendees"] = people
        att = f", and invite {join_en(people)}"
    if "loc" in opts:
        a["location"] = r.choice(MEETING_PLACES)
        loc = f", location: {a['location']}"
    if "rem" in opts:
        m = r.choice([5, 10, 15, 30, 60])
        if chance(r):
            method = r.choice(["email", "popup"])
            a["reminder"] = {"minutes_before": m, "method": method}
            rem = f", with {'an email' if method == 'email' else 'a popup'} reminder {m} minutes before"
        else:
            a["reminder"] = {"minutes_before": m}
            rem = f", and remind me {m} minutes before"
    return pick(r, ['Schedule "{title}" on {d} at {tm} for {dur} minutes{loc}{att}{rem}.',
                    'Put a {dur}-minute event called "{title}" on my calendar for {d}, starting at {tm}{loc}{att}{rem}.',
                    'Add "{title}" to my calendar: {d} from {tm}, {dur} minutes{loc}{att}{rem}.'],
                title=title, d=d, tm=tm, dur=dur, loc=loc, att=att, rem=rem), a


@tool("calendar", "list_calendar_events", "List calendar events between two dates (inclusive).",
      {"start_date": s("First day, YYYY-MM-DD."),
       "end_date": s("Last day, YYYY-MM-DD."),
       "calendar_name": s("Name of a secondary calendar; defaults to the primary one."),
       "include_declined": b("Also list events the user declined.")},
      ["start_date", "end_date"])
def _list_events(r):
    d1, d2 = date_range(r, 1, 10)
    a: dict[str, Any] = {"start_date": d1, "end_date": d2}
    cal = dec = ""
    if chance(r, 0.35):
        a["calendar_name"] = r.choice(["Family", "Work", "Soccer club", "Book club"])
        cal = f' in my "{a["calendar_name"]}" calendar'
    if chance(r, 0.3):
        a["include_declined"] = True
        dec = " Include events I declined."
    return pick(r, ["What's on my schedule between {d1} and {d2}{cal}?{dec}",
                    "List my events from {d1} to {d2}{cal}.{dec}",
                    "Show me everything booked {d1} through {d2}{cal}.{dec}"],
                d1=d1, d2=d2, cal=cal, dec=dec), a


@tool("calendar", "reschedule_event", "Move an existing calendar event to a new date and time.",
      {"event_id": s("Identifier of the event, e.g. 'evt_8k2m4q'."),
       "new_date": s("New date, YYYY-MM-DD."),
       "new_start_time": s("New start time, 24-hour HH:MM."),
       "notify_attendees": b("Send an update to the attendees.")},
      ["event_id", "new_date", "new_start_time"])
def _reschedule(r):
    ev, d, tm = f"evt_{token(r, 6)}", date_str(r), clock(r)
    a: dict[str, Any] = {"event_id": ev, "new_date": d, "new_start_time": tm}
    nt = ""
    if chance(r):
        a["notify_attendees"] = chance(r, 0.6)
        nt = r.choice([" Let the attendees know.", " Send everyone an update."]) if a["notify_attendees"] \
            else r.choice([" Don't notify anyone.", " No need to tell the attendees."])
    return pick(r, ["Move event {ev} to {d} at {tm}.{nt}",
                    "Can you reschedule {ev}? New slot: {d}, {tm}.{nt}",
                    "Push meeting {ev} to {tm} on {d}.{nt}"], ev=ev, d=d, tm=tm, nt=nt), a


@tool("calendar", "find_free_slots", "Find time slots when all participants are free on a given day.",
      {"participants": arr("Email addresses of everyone who must attend.", STR_ITEM, minItems=1),
       "date": s("Day to search, YYYY-MM-DD."),
       "duration_minutes": i("Length of the meeting in minutes.", minimum=15),
       "working_hours": obj({"start": s("Earliest start, HH:MM."), "end": s("Latest end, HH:MM.")},
                            ["start", "end"], "Restrict the search to this window.")},
      ["participants", "date", "duration_minutes"])
def _free_slots(r):
    people, d, dur = emails(r, r.randint(2, 3)), date_str(r), r.choice([30, 45, 60, 90])
    a: dict[str, Any] = {"participants": people, "date": d, "duration_minutes": dur}
    wh = ""
    if chance(r):
        a["working_hours"] = {"start": r.choice(["08:00", "09:00", "09:30"]), "end": r.choice(["16:00", "17:00", "18:30"])}
        wh = f", between {a['working_hours']['start']} and {a['working_hours']['end']}"
    return pick(r, ["Find a {dur}-minute slot on {d} when {p} are all free{wh}.",
                    "When can {p} and I meet for {dur} minutes on {d}{wh}?",
                    "I need {dur} minutes with {p} on {d}{wh}. What times work?"],
                dur=dur, d=d, p=join_en(people), wh=wh), a


# --------------------------------------------------------------------------- email


@tool("email", "send_email", "Send an email from the user's account.",
      {"to": arr("Recipient email addresses.", STR_ITEM, minItems=1),
       "subject": s("Subject line."),
       "body": s("Plain-text body."),
       "cc": arr("Addresses to copy.", STR_ITEM),
       "priority": e("Message priority.", ["low", "normal", "high"])},
      ["to", "subject", "body"])
def _send_email(r):
    to = emails(r, r.choice([1, 1, 2]))
    subj, body = r.choice(EMAIL_MSGS)
    a: dict[str, Any] = {"to": to, "subject": subj, "body": body}
    cc = pri = ""
    if chance(r, 0.35):
        a["cc"] = emails(r, 1)
        cc = f" (cc {a['cc'][0]})"
    if chance(r, 0.3):
        a["priority"] = r.choice(["high", "low"])
        pri = " Mark it as high priority." if a["priority"] == "high" else " Low priority is fine."
    return pick(r, ['Email {to}{cc} with the subject "{subj}" and the message "{body}"{pri}',
                    'Send a message to {to}{cc}. Subject: "{subj}". Body: "{body}"{pri}',
                    'Write to {to}{cc} - subject "{subj}", text: "{body}"{pri}'],
                to=join_en(to), cc=cc, subj=subj, body=body, pri=pri), a


@tool("email", "search_emails", "Search the user's mailbox.",
      {"query": s("Words to search for."),
       "folder": e("Folder to search; all folders when omitted.", ["inbox", "sent", "archive", "spam"]),
       "max_results": i("Maximum number of messages to return.", minimum=1, maximum=100),
       "unread_only": b("Only return unread messages.")},
      ["query"])
def _search_emails(r):
    q = r.choice(MAIL_QUERIES)
    a: dict[str, Any] = {"query": q}
    opts = r.sample(["f", "m", "u"], r.choice([0, 1, 1, 2]))
    f = m = u = ""
    if "f" in opts:
        a["folder"] = r.choice(["inbox", "sent", "archive", "spam"])
        f = {"inbox": " in my inbox", "sent": " in the sent folder", "archive": " in the archive",
             "spam": " in spam"}[a["folder"]]
    if "m" in opts:
        a["max_results"] = r.choice([5, 10, 20, 25])
        m = f", top {a['max_results']} results"
    if "u" in opts:
        a["unread_only"] = True
        u = ", unread only"
    return pick(r, ['Search my emails for "{q}"{f}{m}{u}.',
                    'Find messages about "{q}"{f}{u}{m}.',
                    'Can you look for "{q}"{f} in my mail{m}{u}?'], q=q, f=f, m=m, u=u), a


@tool("email", "archive_emails", "Move messages out of the inbox into the archive.",
      {"message_ids": arr("Numeric ids of the messages to archive.", INT_ITEM, minItems=1),
       "mark_as_read": b("Also mark the messages as read.")},
      ["message_ids"])
def _archive_emails(r):
    ids = r.sample(range(1000, 9999), r.randint(1, 4))
    a: dict[str, Any] = {"message_ids": ids}
    mr = ""
    if chance(r):
        a["mark_as_read"] = chance(r, 0.7)
        mr = " and mark them as read" if a["mark_as_read"] else " but leave them unread"
    hashed = join_en([f"#{x}" for x in ids])
    return pick(r, ["Archive messages {ids}{mr}.",
                    "Please move emails {hashed} to the archive{mr}.",
                    "Clean up my inbox: archive message IDs {ids}{mr}."],
                ids=join_en(ids), hashed=hashed, mr=mr), a


@tool("email", "create_email_filter", "Create a rule that acts automatically on incoming mail.",
      {"criteria": obj({"from_address": s("Sender address to match."),
                        "subject_contains": s("Text the subject must contain."),
                        "has_attachment": b("Only match messages with attachments.")},
                       ["from_address"], "Which messages the rule matches."),
       "action": e("What to do with matching messages.", ["archive", "label", "delete", "mark_as_read", "forward"]),
       "label_name": s("Label to apply when action is 'label'."),
       "forward_to": s("Address to forward to when action is 'forward'.")},
      ["criteria", "action"])
def _email_filter(r):
    sender = r.choice([email(r), f"newsletter@{r.choice(MAIL_DOMAINS)}", f"noreply@{r.choice(MAIL_DOMAINS)}"])
    crit: dict[str, Any] = {"from_address": sender}
    a: dict[str, Any] = {"criteria": crit}
    subj = att = ""
    if chance(r, 0.4):
        crit["subject_contains"] = r.choice(["weekly digest", "invoice", "promo", "build failed"])
        subj = f' with "{crit["subject_contains"]}" in the subject'
    if chance(r, 0.25):
        crit["has_attachment"] = True
        att = " that have attachments"
    action = r.choice(["archive", "label", "delete", "mark_as_read", "forward"])
    a["action"] = action
    if action == "label":
        a["label_name"] = r.choice(["Receipts", "Newsletters", "CI", "Finance"])
        act = f'labeled "{a["label_name"]}"'
    elif action == "forward":
        a["forward_to"] = email(r)
        act = f"forwarded to {a['forward_to']}"
    else:
        act = {"archive": "archived", "delete": "deleted", "mark_as_read": "marked as read"}[action]
    return pick(r, ["Create a filter: emails from {sender}{subj}{att} should be {act}.",
                    "Set up a rule so that messages from {sender}{att}{subj} get {act} automatically.",
                    "I want every email from {sender}{subj}{att} {act}. Make a filter for that."],
                sender=sender, subj=subj, att=att, act=act), a


# --------------------------------------------------------------------------- travel

CABINS = {"economy": "economy", "premium_economy": "premium economy", "business": "business class",
          "first": "first class"}


@tool("travel", "search_flights", "Search for flights between two airports.",
      {"origin": s("Departure airport IATA code, e.g. 'LIS'."),
       "destination": s("Arrival airport IATA code."),
       "departure_date": s("Outbound date, YYYY-MM-DD."),
       "return_date": s("Return date for round trips, YYYY-MM-DD."),
       "passengers": obj({"adults": i("Travellers aged 12 or over.", minimum=1, maximum=9),
                          "children": i("Travellers aged 2 to 11.", minimum=0, maximum=8)},
                         ["adults"], "Who is travelling."),
       "cabin_class": e("Cabin class.", list(CABINS)),
       "nonstop_only": b("Only return direct flights.")},
      ["origin", "destination", "departure_date", "passengers"])
def _search_flights(r):
    o, d = r.sample(AIRPORTS, 2)
    dep, ret = date_range(r, 3, 21)
    adults = r.randint(1, 4)
    pax: dict[str, Any] = {"adults": adults}
    pax_txt = f"{adults} adult{'s' if adults > 1 else ''}"
    if chance(r, 0.35):
        pax["children"] = r.randint(1, 3)
        pax_txt += f" and {pax['children']} child{'ren' if pax['children'] > 1 else ''}"
    a: dict[str, Any] = {"origin": o, "destination": d, "departure_date": dep, "passengers": pax}
    rt = cab = ns = ""
    if chance(r):
        a["return_date"] = ret
        rt = f", returning {ret}"
    if chance(r, 0.4):
        a["cabin_class"] = r.choice(list(CABINS))
        cab = f" in {CABINS[a['cabin_class']]}"
    if chance(r, 0.3):
        a["nonstop_only"] = True
        ns = ", nonstop only"
    return pick(r, ["Find flights from {o} to {d} on {dep}{rt} for {pax}{cab}{ns}.",
                    "I need to fly {o} to {d}, leaving {dep}{rt}. We are {pax}{cab}{ns}.",
                    "Search flights {o} -> {d} departing {dep}{rt}: {pax}{cab}{ns}."],
                o=o, d=d, dep=dep, rt=rt, pax=pax_txt, cab=cab, ns=ns), a


@tool("travel", "book_hotel", "Book a hotel room.",
      {"city": s("City to stay in."),
       "check_in": s("Check-in date, YYYY-MM-DD."),
       "check_out": s("Check-out date, YYYY-MM-DD."),
       "guests": i("Number of guests.", minimum=1, maximum=8),
       "room_type": e("Room type.", ["single", "double", "twin", "suite"]),
       "max_price_per_night": n("Upper price limit per night in the local currency.", minimum=0)},
      ["city", "check_in", "check_out", "guests"])
def _book_hotel(r):
    city = r.choice(CITIES)
    ci, co = date_range(r, 1, 7)
    g = r.randint(1, 4)
    a: dict[str, Any] = {"city": city, "check_in": ci, "check_out": co, "guests": g}
    rt = mp = ""
    if chance(r, 0.4):
        a["room_type"] = r.choice(["single", "double", "twin", "suite"])
        rt = f", {a['room_type']} room" if a["room_type"] != "suite" else ", a suite"
    if chance(r, 0.4):
        a["max_price_per_night"] = money(r, 80, 300)
        mp = f", no more than {a['max_price_per_night']} per night"
    gtxt = f"{g} guest{'s' if g > 1 else ''}"
    return pick(r, ["Book a hotel in {city} from {ci} to {co} for {g}{rt}{mp}.",
                    "I need a room in {city}: check in {ci}, check out {co}, {g}{rt}{mp}.",
                    "Reserve a hotel for {g} in {city}, arriving {ci} and leaving {co}{rt}{mp}."],
                city=city, ci=ci, co=co, g=gtxt, rt=rt, mp=mp), a


CAR_CLASSES = {"economy": "an economy car", "compact": "a compact", "midsize": "a midsize car", "suv": "an SUV",
               "van": "a van"}


@tool("travel", "rent_car", "Reserve a rental car.",
      {"pickup_location": s("Where to pick up the car (airport code or address)."),
       "pickup_date": s("Pick-up date, YYYY-MM-DD."),
       "return_date": s("Return date, YYYY-MM-DD."),
       "car_class": e("Vehicle class.", list(CAR_CLASSES)),
       "driver_age": i("Age of the main driver.", minimum=18, maximum=99)},
      ["pickup_location", "pickup_date", "return_date"])
def _rent_car(r):
    loc = r.choice(AIRPORTS + ["Osaka Station", "downtown Montreal", "Porto Campanha station"])
    d1, d2 = date_range(r, 2, 14)
    a: dict[str, Any] = {"pickup_location": loc, "pickup_date": d1, "return_date": d2}
    cls = age = ""
    if chance(r, 0.6):
        a["car_class"] = r.choice(list(CAR_CLASSES))
        cls = CAR_CLASSES[a["car_class"]]
    if chance(r, 0.35):
        a["driver_age"] = r.randint(19, 72)
        age = f" The driver is {a['driver_age']}."
    return pick(r, ["Rent {what} at {loc} from {d1} to {d2}.{age}",
                    "I need {what} - pick up at {loc} on {d1}, drop off {d2}.{age}",
                    "Can you reserve {what} for me? Pickup {loc}, {d1} until {d2}.{age}"],
                what=cls or "a car", loc=loc, d1=d1, d2=d2, age=age), a


@tool("travel", "get_flight_status", "Get the live status (on time, delayed, gate) of a flight.",
      {"flight_number": s("Airline code plus number, e.g. 'TP1342'."),
       "date": s("Departure date, YYYY-MM-DD; today when omitted.")},
      ["flight_number"])
def _flight_status(r):
    fn = f"{r.choice(AIRLINES)}{r.randint(100, 2999)}"
    a: dict[str, Any] = {"flight_number": fn}
    d = ""
    if chance(r, 0.45):
        a["date"] = date_str(r)
        d = f" on {a['date']}"
    return pick(r, ["Is {fn}{d} on time?", "What's the status of flight {fn}{d}?",
                    "My sister is arriving on {fn}{d}. Is it delayed?", "Has {fn}{d} departed yet?"],
                fn=fn, d=d), a


# --------------------------------------------------------------------------- shop

SORTS = {"price_asc": "cheapest first", "price_desc": "most expensive first", "rating": "best rated first",
         "newest": "newest first"}


@tool("shop", "search_products", "Search the store catalogue.",
      {"query": s("Search words."),
       "max_price": n("Maximum price.", minimum=0),
       "categories": arr("Restrict to these categories.", STR_ITEM),
       "in_stock_only": b("Hide items that are out of stock."),
       "sort_by": e("Sort order.", ["relevance"] + list(SORTS))},
      ["query"])
def _search_products(r):
    q = r.choice(list(PRODUCT_QUERIES))
    a: dict[str, Any] = {"query": q}
    opts = r.sample(["p", "c", "s", "o"], r.choice([0, 1, 2, 2]))
    p = c = st = o = ""
    if "p" in opts:
        a["max_price"] = money(r, 30, 400)
        p = f" under {a['max_price']}"
    if "c" in opts:
        a["categories"] = PRODUCT_QUERIES[q][: r.randint(1, 2)]
        c = f" in {join_en(a['categories'], 'or')}"
    if "s" in opts:
        a["in_stock_only"] = True
        st = ", in stock only"
    if "o" in opts:
        a["sort_by"] = r.choice(list(SORTS))
        o = f", {SORTS[a['sort_by']]}"
    return pick(r, ['Search the store for "{q}"{c}{p}{st}{o}.',
                    "Show me {q}{c}{p}{st}{o}.",
                    "I'm shopping for {q}{c}{p}. What do you have{st}{o}?"], q=q, c=c, p=p, st=st, o=o), a


ADDRESS_SCHEMA = obj({"street": s("Street and number."), "city": s("City."), "postal_code": s("Postal code."),
                      "country": s("ISO 3166 two-letter country code.")},
                     ["street", "city", "postal_code", "country"], "Delivery address.", closed=True)


@tool("shop", "place_order", "Place an order for one or more catalogue items.",
      {"items": arr("Products to order.", obj({"product_id": s("Catalogue id, e.g. 'SKU-48213'."),
                                               "quantity": i("How many.", minimum=1)},
                                              ["product_id", "quantity"]), minItems=1),
       "shipping_address": ADDRESS_SCHEMA,
       "express_shipping": b("Use express shipping."),
       "coupon_code": s("Discount code.")},
      ["items", "shipping_address"])
def _place_order(r):
    items = [{"product_id": f"SKU-{digits(r, 5)}", "quantity": r.randint(1, 4)} for _ in range(r.randint(1, 3))]
    street, city, pc, country = r.choice(ADDRESSES)
    a: dict[str, Any] = {"items": items,
                         "shipping_address": {"street": street, "city": city, "postal_code": pc, "country": country}}
    ex = cp = ""
    if chance(r, 0.35):
        a["express_shipping"] = True
        ex = " with express shipping"
    if chance(r, 0.3):
        a["coupon_code"] = r.choice(COUPONS)
        cp = f" Use coupon {a['coupon_code']}."
    itxt = join_en([f"{it['quantity']} x {it['product_id']}" for it in items])
    addr = f"{street}, {city} {pc}, {country}"
    return pick(r, ["Order {items} and ship it to {addr}{ex}.{cp}",
                    "Please buy {items} for me. Deliver to {addr}{ex}.{cp}",
                    "Place an order: {items}, shipping address {addr}{ex}.{cp}"],
                items=itxt, addr=addr, ex=ex, cp=cp), a


@tool("shop", "track_order", "Get the delivery status of an order.",
      {"order_id": s("Order number, e.g. 'ORD-583920'."),
       "include_item_details": b("Also list the items in the order.")},
      ["order_id"])
def _track_order(r):
    oid = ORDER_PREFIX + digits(r, 6)
    a: dict[str, Any] = {"order_id": oid}
    det = ""
    if chance(r, 0.3):
        a["include_item_details"] = True
        det = " and list what's in it"
    return pick(r, ["Where is my order {oid}? Tell me its status{det}.",
                    "Track order {oid} for me{det}.",
                    "Has {oid} shipped yet? Check the status{det}."], oid=oid, det=det), a


CANCEL_REASONS = {"changed_mind": "I changed my mind", "found_cheaper": "I found it cheaper elsewhere",
                  "ordered_by_mistake": "I ordered it by mistake", "delivery_too_slow": "delivery is taking too long"}


@tool("shop", "cancel_order", "Cancel an order that has not shipped yet.",
      {"order_id": s("Order number."),
       "reason": e("Why the order is cancelled.", list(CANCEL_REASONS) + ["other"]),
       "refund_method": e("Where the refund goes.", ["original_payment", "store_credit"])},
      ["order_id", "reason"])
def _cancel_order(r):
    oid = ORDER_PREFIX + digits(r, 6)
    reason = r.choice(list(CANCEL_REASONS))
    a: dict[str, Any] = {"order_id": oid, "reason": reason}
    ref = ""
    if chance(r, 0.4):
        a["refund_method"] = r.choice(["original_payment", "store_credit"])
        ref = " Refund it to my card." if a["refund_method"] == "original_payment" else " Store credit is fine."
    return pick(r, ["Cancel order {oid} - {why}.{ref}",
                    "Please cancel {oid}, {why}.{ref}",
                    "I want to cancel my order {oid} because {why}.{ref}"],
                oid=oid, why=CANCEL_REASONS[reason], ref=ref), a


RETURN_REASONS = {"damaged": "it arrived damaged", "wrong_item": "they sent the wrong item",
                  "not_as_described": "it's not as described", "no_longer_needed": "I no longer need it"}


@tool("shop", "return_item", "Start a return for items from a delivered order.",
      {"order_id": s("Order number."),
       "product_id": s("Catalogue id of the item to return."),
       "quantity": i("How many units to return.", minimum=1),
       "reason": e("Return reason.", list(RETURN_REASONS)),
       "comment": s("Extra details for the returns team.")},
      ["order_id", "product_id", "quantity", "reason"])
def _return_item(r):
    oid, pid, q = ORDER_PREFIX + digits(r, 6), f"SKU-{digits(r, 5)}", r.randint(1, 3)
    reason = r.choice(list(RETURN_REASONS))
    a: dict[str, Any] = {"order_id": oid, "product_id": pid, "quantity": q, "reason": reason}
    cm = ""
    if chance(r, 0.35):
        a["comment"] = r.choice(["The box was crushed on one corner.", "Color is different from the photos.",
                                 "Please send a prepaid label."])
        cm = f' Note for the returns team: "{a["comment"]}"'
    return pick(r, ["I want to return {q} of {pid} from order {oid}; {why}.{cm}",
                    "Start a return for order {oid}: {q} x {pid}, because {why}.{cm}",
                    "Return {q} unit(s) of {pid} (order {oid}) - {why}.{cm}"],
                q=q, pid=pid, oid=oid, why=RETURN_REASONS[reason], cm=cm), a


# --------------------------------------------------------------------------- bank

CURRENCIES = {"USD": ["USD", "dollars"], "EUR": ["EUR", "euros"], "GBP": ["GBP", "pounds"],
              "CHF": ["CHF", "Swiss francs"], "JPY": ["JPY", "yen"]}


def account(r: random.Random) -> str:
    return f"{r.choice(['CHK', 'SAV', 'BUS'])}-{digits(r, 4)}"


@tool("bank", "transfer_funds", "Transfer money between accounts.",
      {"from_account": s("Source account id."),
       "to_account": s("Destination account id."),
       "amount": n("Amount to transfer.", exclusiveMinimum=0),
       "currency": e("ISO currency code.", list(CURRENCIES)),
       "memo": s("Reference shown on both statements."),
       "scheduled_date": s("Execute on this date (YYYY-MM-DD) instead of now.")},
      ["from_account", "to_account", "amount", "currency"], closed=True)
def _transfer(r):
    src, dst = account(r), account(r)
    cur = r.choice(list(CURRENCIES))
    amt = r.randint(5, 300) * 1000 if cur == "JPY" else money(r, 20, 5000)
    a: dict[str, Any] = {"from_account": src, "to_account": dst, "amount": amt, "currency": cur}
    memo = when = ""
    if chance(r, 0.4):
        a["memo"] = r.choice(["Rent March", "Dinner split", "Car repair", "Savings top-up", "Invoice 2291"])
        memo = f' with the memo "{a["memo"]}"'
    if chance(r, 0.3):
        a["scheduled_date"] = date_str(r)
        when = f" on {a['scheduled_date']}"
    return pick(r, ["Transfer {amt} {cur} from {src} to {dst}{memo}{when}.",
                    "Move {amt} {cur} from account {src} into {dst}{when}{memo}.",
                    "Please send {amt} {cur} from my account {src} to account {dst}{memo}{when}."],
                amt=amt, cur=r.choice(CURRENCIES[cur]), src=src, dst=dst, memo=memo, when=when), a


@tool("bank", "get_account_balance", "Get the current balance of a bank account.",
      {"account_id": s("Account id."),
       "include_pending": b("Include pending (not yet booked) transactions.")},
      ["account_id"])
def _balance(r):
    acct = account(r)
    a: dict[str, Any] = {"account_id": acct}
    p = ""
    if chance(r, 0.4):
        a["include_pending"] = chance(r, 0.7)
        p = " Include pending transactions." if a["include_pending"] else " Ignore anything still pending."
    return pick(r, ["What's the balance on {acct}?{p}", "How much money is in account {acct}?{p}",
                    "Check my balance for {acct}, please.{p}"], acct=acct, p=p), a


TX_CATEGORIES = ["groceries", "dining", "travel", "utilities", "entertainment", "shopping"]


@tool("bank", "list_transactions", "List the transactions of an account in a date range.",
      {"account_id": s("Account id."),
       "start_date": s("First day, YYYY-MM-DD."),
       "end_date": s("Last day, YYYY-MM-DD."),
       "min_amount": n("Only transactions of at least this amount.", minimum=0),
       "categories": arr("Only these spending categories.", {"type": "string", "enum": TX_CATEGORIES})},
      ["account_id", "start_date", "end_date"])
def _transactions(r):
    acct = account(r)
    d1, d2 = date_range(r, 7, 40)
    a: dict[str, Any] = {"account_id": acct, "start_date": d1, "end_date": d2}
    mn = cat = ""
    if chance(r, 0.4):
        a["min_amount"] = r.choice([50, 100, 250, 500, 75.5])
        mn = f" over {a['min_amount']}"
    if chance(r, 0.4):
        a["categories"] = r.sample(TX_CATEGORIES, r.randint(1, 2))
        cat = f" ({' and '.join(a['categories'])} only)"
    return pick(r, ["Show transactions{mn} on {acct} from {d1} to {d2}{cat}.",
                    "List what went through account {acct} between {d1} and {d2}{cat}{mn}.",
                    "I need the{mn} payments on {acct}{cat}, {d1} through {d2}."],
                acct=acct, d1=d1, d2=d2, mn=mn, cat=cat), a


@tool("bank", "pay_bill", "Pay a bill to a saved payee.",
      {"payee_name": s("Payee as saved in online banking."),
       "amount": n("Amount to pay.", exclusiveMinimum=0),
       "payment_date": s("When to pay, YYYY-MM-DD."),
       "reference_number": s("Customer or invoice number printed on the bill.")},
      ["payee_name", "amount", "payment_date"])
def _pay_bill(r):
    payee, amt, d = r.choice(PAYEES), money(r, 25, 900), date_str(r)
    a: dict[str, Any] = {"payee_name": payee, "amount": amt, "payment_date": d}
    ref = ""
    if chance(r, 0.4):
        a["reference_number"] = f"{r.choice(['INV', 'CUST', 'ACC'])}-{digits(r, 6)}"
        ref = f" Reference {a['reference_number']}."
    return pick(r, ["Pay {amt} to {payee} on {d}.{ref}",
                    "Schedule a payment of {amt} to {payee} for {d}.{ref}",
                    "The {payee} bill is {amt}; pay it on {d}.{ref}"], amt=amt, payee=payee, d=d, ref=ref), a


@tool("bank", "create_invoice", "Create and send an invoice to a client.",
      {"client_name": s("Client company or person."),
       "client_email": s("Where to send the invoice."),
       "line_items": arr("Billed items.", obj({"description": s("What is billed."),
                                               "quantity": i("Units.", minimum=1),
                                               "unit_price": n("Price per unit.", minimum=0)},
                                              ["description", "quantity", "unit_price"]), minItems=1),
       "currency": e("Invoice currency.", list(CURRENCIES)),
       "due_date": s("Payment due date, YYYY-MM-DD.")},
      ["client_name", "client_email", "line_items"])
def _invoice(r):
    client, mail = r.choice(INVOICE_CLIENTS)
    lines = [{"description": desc, "quantity": r.randint(1, 12), "unit_price": money(r, 20, 400)}
             for desc in r.sample(INVOICE_LINES, r.randint(1, 2))]
    a: dict[str, Any] = {"client_name": client, "client_email": mail, "line_items": lines}
    cur = due = ""
    if chance(r, 0.4):
        a["currency"] = r.choice(["USD", "EUR", "GBP"])
        cur = f" Bill in {a['currency']}."
    if chance(r, 0.4):
        a["due_date"] = date_str(r)
        due = f" Due {a['due_date']}."
    ltxt = join_en([f'{x["quantity"]} x "{x["description"]}" at {x["unit_price"]} each' for x in lines])
    return pick(r, ["Invoice {client} ({mail}) for {lines}.{cur}{due}",
                    "Create an invoice to {client}, sent to {mail}: {lines}.{due}{cur}",
                    "Bill {client} at {mail} for {lines}.{cur}{due}"],
                client=client, mail=mail, lines=ltxt, cur=cur, due=due), a


# --------------------------------------------------------------------------- home

MODES = {"heat": "heating", "cool": "cooling", "auto": "auto mode"}


@tool("home", "set_thermostat", "Set the target temperature of a room's thermostat.",
      {"room": s("Room name as configured in the app."),
       "temperature": n("Target temperature."),
       "unit": e("Unit of the temperature.", UNITS),
       "mode": e("Operating mode.", ["heat", "cool", "auto", "off"])},
      ["room", "temperature"])
def _thermostat(r):
    room = r.choice(ROOMS)
    a: dict[str, Any] = {"room": room}
    deg = " degrees"
    if chance(r, 0.6):
        a["unit"] = r.choice(UNITS)
        a["temperature"] = r.choice([r.randint(62, 76), r.randint(62, 75) + 0.5]) if a["unit"] == "fahrenheit" \
            else r.choice([r.randint(17, 24), r.randint(17, 23) + 0.5])
        deg = " degrees Fahrenheit" if a["unit"] == "fahrenheit" else r.choice(["°C", " degrees Celsius"])
    else:
        a["temperature"] = r.choice([r.randint(17, 24), r.randint(17, 23) + 0.5])
    md = ""
    if chance(r, 0.4):
        a["mode"] = r.choice(list(MODES))
        md = f" on {MODES[a['mode']]}"
    return pick(r, ["Set the {room} thermostat to {t}{deg}{md}.",
                    "Make the {room} {t}{deg}{md}, please.",
                    "It's uncomfortable in the {room}. Change the temperature to {t}{deg}{md}."],
                room=room, t=a["temperature"], deg=deg, md=md), a


@tool("home", "control_lights", "Turn the lights of a room on or off, optionally with brightness and color.",
      {"room": s("Room name."),
       "on": b("True to switch on, false to switch off."),
       "brightness": i("Brightness in percent.", minimum=0, maximum=100),
       "color": s("Color name, e.g. 'warm white'.")},
      ["room", "on"])
def _lights(r):
    room = r.choice(ROOMS)
    if chance(r, 0.3):
        return pick(r, ["Turn off the {room} lights.", "Switch the lights in the {room} off.",
                        "Lights off in the {room}, please."], room=room), {"room": room, "on": False}
    a: dict[str, Any] = {"room": room, "on": True}
    br = col = ""
    if chance(r, 0.55):
        a["brightness"] = r.choice([20, 35, 50, 60, 75, 80, 100])
        br = f" at {a['brightness']}% brightness"
    if chance(r, 0.45):
        a["color"] = r.choice(LIGHT_COLORS)
        col = f", color {a['color']}"
    return pick(r, ["Turn on the {room} lights{br}{col}.", "Switch on the lights in the {room}{br}{col}.",
                    "Lights on in the {room}{br}{col}, please."], room=room, br=br, col=col), a


DOORS = ["front", "back", "garage", "side"]


@tool("home", "set_door_lock", "Lock or unlock a smart door lock.",
      {"door": e("Which door.", DOORS),
       "locked": b("True to lock, false to unlock."),
       "auto_relock_minutes": i("When unlocking, lock again automatically after this many minutes.",
                                minimum=1, maximum=120)},
      ["door", "locked"], closed=True)
def _door(r):
    door = r.choice(DOORS)
    if chance(r, 0.45):
        return pick(r, ["Lock the {door} door.", "Did I forget to lock the {door} door? Lock it now.",
                        "Please make sure the {door} door is locked."], door=door), {"door": door, "locked": True}
    a: dict[str, Any] = {"door": door, "locked": False}
    rl = ""
    if chance(r, 0.5):
        a["auto_relock_minutes"] = r.choice([5, 10, 15, 30])
        rl = f" and lock it again automatically after {a['auto_relock_minutes']} minutes"
    return pick(r, ["Unlock the {door} door{rl}.", "The cleaner is here - unlock the {door} door{rl}.",
                    "Open the {door} door lock{rl}."], door=door, rl=rl), a


@tool("home", "run_home_scene", "Activate a saved smart-home scene.",
      {"scene_name": s("Scene name as saved in the app."),
       "delay_minutes": i("Start the scene after this many minutes.", minimum=0),
       "rooms": arr("Limit the scene to these rooms.", STR_ITEM)},
      ["scene_name"])
def _scene(r):
    sc = r.choice(SCENES)
    a: dict[str, Any] = {"scene_name": sc}
    dl = rm = ""
    if chance(r, 0.35):
        a["delay_minutes"] = r.choice([5, 10, 20, 30, 45])
        dl = f" in {a['delay_minutes']} minutes"
    if chance(r, 0.35):
        a["rooms"] = r.sample(ROOMS, r.randint(1, 2))
        rm = f" (only the {join_en(a['rooms'])})"
    return pick(r, ['Activate the "{sc}" scene{dl}{rm}.', 'Run my {sc} scene{rm}{dl}.',
                    'Start "{sc}"{dl}{rm}, please.'], sc=sc, dl=dl, rm=rm), a


# --------------------------------------------------------------------------- maps

TRAVEL_MODES = {"driving": "by car", "walking": "on foot", "bicycling": "by bike", "transit": "by public transport"}


@tool("maps", "get_directions", "Get turn-by-turn directions between two places.",
      {"origin": s("Start address or place."),
       "destination": s("End address or place."),
       "mode": e("Travel mode.", list(TRAVEL_MODES)),
       "avoid": arr("Route features to avoid.", {"type": "string", "enum": ["tolls", "highways", "ferries"]}),
       "departure_time": s("Departure time, HH:MM; now when omitted.")},
      ["origin", "destination"])
def _directions(r):
    city = r.choice(list(CITY_STOPS))
    o, d = (f"{x}, {city}" for x in r.sample(CITY_STOPS[city], 2))
    a: dict[str, Any] = {"origin": o, "destination": d}
    md = av = dep = ""
    if chance(r, 0.55):
        a["mode"] = r.choice(list(TRAVEL_MODES))
        md = f" {TRAVEL_MODES[a['mode']]}"
    if a.get("mode", "driving") == "driving" and chance(r, 0.35):
        a["avoid"] = r.sample(["tolls", "highways", "ferries"], r.randint(1, 2))
        av = f", avoiding {join_en(a['avoid'])}"
    if chance(r, 0.3):
        a["departure_time"] = clock(r)
        dep = f", leaving at {a['departure_time']}"
    return pick(r, ["How do I get from {o} to {d}{md}{av}{dep}?",
                    "Directions from {o} to {d}{md}{dep}{av}, please.",
                    "Route me{md} to {d}, starting at {o}{av}{dep}."], o=o, d=d, md=md, av=av, dep=dep), a


PLACE_TYPES = {"restaurant": "restaurants", "cafe": "cafes", "pharmacy": "pharmacies",
               "gas_station": "gas stations", "atm": "ATMs", "hospital": "hospitals",
               "supermarket": "supermarkets", "parking": "parking garages"}


@tool("maps", "find_nearby_places", "Find places of a given type near a location.",
      {"location": s("Address or landmark to search around."),
       "place_type": e("Kind of place.", list(PLACE_TYPES)),
       "radius_meters": i("Search radius in meters.", minimum=50, maximum=50000),
       "open_now": b("Only places open right now."),
       "min_rating": n("Minimum average rating (0-5).", minimum=0, maximum=5)},
      ["location", "place_type"])
def _nearby(r):
    loc, pt = r.choice(LANDMARKS), r.choice(list(PLACE_TYPES))
    a: dict[str, Any] = {"location": loc, "place_type": pt}
    opts = r.sample(["r", "o", "m"], r.choice([0, 1, 1, 2]))
    rad = op = mr = ""
    if "r" in opts:
        a["radius_meters"] = r.choice([200, 500, 800, 1000, 1500, 3000])
        rad = f" within {a['radius_meters']} meters"
    if "o" in opts:
        a["open_now"] = True
        op = " that are open now"
    if "m" in opts:
        a["min_rating"] = r.choice([3.5, 4, 4.2, 4.5])
        mr = f", rated {a['min_rating']} or higher"
    return pick(r, ["Find {pt} near {loc}{rad}{op}{mr}.",
                    "Are there any {pt}{op} close to {loc}{rad}{mr}?",
                    "I'm at {loc}. Show me {pt}{rad}{mr}{op}."], pt=PLACE_TYPES[pt], loc=loc, rad=rad, op=op,
                mr=mr), a


@tool("maps", "estimate_travel_time", "Estimate the travel time along a route through ordered waypoints.",
      {"waypoints": arr("Places in visiting order; first is the start, last the end.", STR_ITEM, minItems=2),
       "mode": e("Travel mode.", list(TRAVEL_MODES)),
       "departure_time": s("Departure time, HH:MM.")},
      ["waypoints"])
def _travel_time(r):
    city = r.choice(list(CITY_STOPS))
    stops = r.sample(CITY_STOPS[city], r.randint(2, 4))
    a: dict[str, Any] = {"waypoints": stops}
    md = dep = ""
    if chance(r, 0.6):
        a["mode"] = r.choice(list(TRAVEL_MODES))
        md = f" {TRAVEL_MODES[a['mode']]}"
    if chance(r, 0.3):
        a["departure_time"] = clock(r)
        dep = f" if I leave at {a['departure_time']}"
    via = f" via {join_en(stops[1:-1])}" if len(stops) > 2 else ""
    return pick(r, ["How long does it take to get from {a} to {z}{via}{md}{dep}?",
                    "Estimate the travel time from {a}{via} to {z}{md}{dep}.",
                    "In {city}: {route}. How long will that take{md}{dep}?"],
                a=stops[0], z=stops[-1], md=md, via=via, dep=dep, city=city, route=" -> ".join(stops)), a


# --------------------------------------------------------------------------- recipes

DIETS = {"vegetarian": "vegetarian", "vegan": "vegan", "gluten_free": "gluten-free", "dairy_free": "dairy-free",
         "nut_free": "nut-free"}


@tool("recipes", "search_recipes", "Find recipes that use the given ingredients.",
      {"ingredients": arr("Ingredients to use.", STR_ITEM, minItems=1),
       "cuisine": s("Cuisine, e.g. 'Thai'."),
       "max_prep_minutes": i("Maximum preparation time in minutes.", minimum=5),
       "dietary_restrictions": arr("Diets the recipe must satisfy.", {"type": "string", "enum": list(DIETS)})},
      ["ingredients"])
def _search_recipes(r):
    ing = r.sample(INGREDIENTS, r.randint(1, 3))
    a: dict[str, Any] = {"ingredients": ing}
    opts = r.sample(["c", "t", "d"], r.choice([0, 1, 1, 2]))
    cu = tm = di = ""
    if "c" in opts:
        a["cuisine"] = r.choice(CUISINES)
        cu = f" {a['cuisine']}"
    if "t" in opts:
        a["max_prep_minutes"] = r.choice([15, 20, 30, 45, 60])
        tm = f" that takes at most {a['max_prep_minutes']} minutes"
    if "d" in opts:
        a["dietary_restrictions"] = r.sample(list(DIETS), r.randint(1, 2))
        di = f" ({' and '.join(DIETS[x] for x in a['dietary_restrictions'])})"
    return pick(r, ["Find me a{cu} recipe with {ing}{tm}{di}.",
                    "I have {ing} in the fridge. Any{cu} recipes{di}{tm}?",
                    "What{cu} dish can I cook with {ing}{tm}{di}?"], cu=cu, ing=join_en(ing), tm=tm,
                di=di).replace("a Indian", "an Indian"), a


@tool("recipes", "scale_recipe", "Rescale a saved recipe to a different number of servings.",
      {"recipe_id": s("Recipe id, e.g. 'rcp-4821'."),
       "servings": i("Number of servings wanted.", minimum=1, maximum=50),
       "unit_system": e("Units for the rescaled ingredient list.", ["metric", "imperial"])},
      ["recipe_id", "servings"])
def _scale(r):
    rid, sv = f"rcp-{digits(r, 4)}", r.randint(2, 16)
    a: dict[str, Any] = {"recipe_id": rid, "servings": sv}
    u = ""
    if chance(r, 0.4):
        a["unit_system"] = r.choice(["metric", "imperial"])
        u = f", in {a['unit_system']} units" if chance(r) else (" using grams and millilitres" if
                                                                a["unit_system"] == "metric" else " in cups and ounces")
    return pick(r, ["Scale recipe {rid} to {sv} servings{u}.", "I'm cooking {rid} for {sv} people - adjust the quantities{u}.",
                    "Can you resize {rid} so it serves {sv}{u}?"], rid=rid, sv=sv, u=u), a


@tool("recipes", "add_to_shopping_list", "Add items to a shopping list.",
      {"items": arr("Items to add.", obj({"name": s("Item name."), "quantity": n("Amount.", exclusiveMinimum=0),
                                          "unit": s("Unit, e.g. 'kg'.")}, ["name", "quantity"]), minItems=1),
       "list_name": s("Shopping list; the default list when omitted.")},
      ["items"])
def _shopping(r):
    items = []
    for name, unit in r.sample(GROCERIES, r.randint(1, 3)):
        if unit is None:
            items.append({"name": name, "quantity": r.choice([2, 4, 6, 12])})
        else:
            qty = r.choice([1, 2, 3, 1.5, 0.5, 2.5]) if unit != "grams" else r.choice([200, 250, 500])
            items.append({"name": name, "quantity": qty, "unit": unit})
    a: dict[str, Any] = {"items": items}
    ln = ""
    if chance(r, 0.35):
        a["list_name"] = r.choice(["Weekend BBQ", "Costco run", "Groceries", "Camping trip"])
        ln = f' "{a["list_name"]}"'
    itxt = join_en([f"{x['quantity']} {x['unit']} of {x['name']}" if "unit" in x else f"{x['quantity']} {x['name']}"
                    for x in items])
    return pick(r, ["Add {items} to my{ln} shopping list.", "Put {items} on the{ln} list.",
                    "We're out of stuff - add {items} to my{ln} shopping list."], items=itxt, ln=ln), a


# --------------------------------------------------------------------------- fitness

ACTIVITIES = {"running": ("run", "running"), "cycling": ("bike ride", "cycling"), "swimming": ("swim", "swimming"),
              "rowing": ("rowing session", "rowing"), "yoga": ("yoga session", "yoga"),
              "strength_training": ("strength training session", "weight training"), "hiking": ("hike", "hiking")}
SPEED_KMH = {"running": 10, "cycling": 22, "swimming": 2.5, "rowing": 8, "hiking": 4.5}
DISTANCE_ACTIVITIES = set(SPEED_KMH)


@tool("fitness", "log_workout", "Record a completed workout.",
      {"activity": e("Type of workout.", list(ACTIVITIES)),
       "duration_minutes": i("Duration in minutes.", minimum=1),
       "distance_km": n("Distance covered in kilometres.", minimum=0),
       "date": s("Date of the workout, YYYY-MM-DD; today when omitted."),
       "average_heart_rate": i("Average heart rate in bpm.", minimum=30, maximum=220)},
      ["activity", "duration_minutes"])
def _log_workout(r):
    act = r.choice(list(ACTIVITIES))
    dur = r.choice([20, 25, 30, 40, 45, 50, 60, 75, 90])
    a: dict[str, Any] = {"activity": act, "duration_minutes": dur}
    ds = dt_ = hr = ""
    if act in DISTANCE_ACTIVITIES and chance(r, 0.6):
        km = round(dur / 60 * SPEED_KMH[act] * r.uniform(0.8, 1.2), 1)
        a["distance_km"] = km if km != int(km) else round(km + 0.3, 1)
        ds = f" covering {a['distance_km']} km"
    if chance(r, 0.3):
        a["date"] = date_str(r)
        dt_ = f" on {a['date']}"
    if chance(r, 0.3):
        a["average_heart_rate"] = r.randint(110, 165)
        hr = f", average heart rate {a['average_heart_rate']} bpm"
    noun, gerund = ACTIVITIES[act]
    return pick(r, ["Log a {dur}-minute {noun}{ds}{dt}{hr}.",
                    "I did {dur} minutes of {gerund}{ds}{dt}{hr}. Please record it.",
                    "Add a workout: {gerund}, {dur} minutes{ds}{dt}{hr}."],
                dur=dur, noun=noun, gerund=gerund, ds=ds, dt=dt_, hr=hr), a


METRICS = {"steps": "steps", "calories": "calories burned", "distance": "distance", "active_minutes": "active minutes",
           "sleep": "sleep"}


@tool("fitness", "get_activity_summary", "Summarise tracked activity over a date range.",
      {"start_date": s("First day, YYYY-MM-DD."),
       "end_date": s("Last day, YYYY-MM-DD."),
       "metrics": arr("Metrics to include; all when omitted.", {"type": "string", "enum": list(METRICS)})},
      ["start_date", "end_date"])
def _activity(r):
    d1, d2 = date_range(r, 6, 30)
    a: dict[str, Any] = {"start_date": d1, "end_date": d2}
    if chance(r, 0.55):
        a["metrics"] = r.sample(list(METRICS), r.randint(1, 3))
        what = join_en([METRICS[m] for m in a["metrics"]])
        return pick(r, ["Show my {what} from {d1} to {d2}.", "How did I do on {what} between {d1} and {d2}?",
                        "Give me {what} for {d1} through {d2}."], what=what, d1=d1, d2=d2), a
    return pick(r, ["Give me my activity summary for {d1} through {d2}.",
                    "How active was I between {d1} and {d2}?",
                    "Summarize my fitness data from {d1} to {d2}."], d1=d1, d2=d2), a


GOALS = {"daily_steps": "steps a day", "weekly_distance_km": "km a week", "workouts_per_week": "workouts a week",
         "target_weight_kg": "kg body weight"}


@tool("fitness", "set_fitness_goal", "Set a personal fitness goal.",
      {"goal_type": e("What the goal measures.", list(GOALS)),
       "target": n("Target value in the goal's unit.", exclusiveMinimum=0),
       "deadline": s("Date to reach the goal by, YYYY-MM-DD.")},
      ["goal_type", "target"])
def _goal(r):
    g = r.choice(list(GOALS))
    target = {"daily_steps": r.choice([6000, 8000, 10000, 12000]),
              "weekly_distance_km": r.choice([15, 20, 25.5, 30, 42.2]),
              "workouts_per_week": r.randint(2, 6),
              "target_weight_kg": r.choice([58.5, 64, 72.5, 80, 85.5])}[g]
    a: dict[str, Any] = {"goal_type": g, "target": target}
    dl = ""
    if chance(r, 0.4):
        a["deadline"] = date_str(r)
        dl = f" by {a['deadline']}"
    return pick(r, ["Set a goal of {t} {unit}{dl}.", "My new goal: {t} {unit}{dl}. Save it.",
                    "I want to reach {t} {unit}{dl} - please set that as my goal."],
                t=target, unit=GOALS[g], dl=dl), a


@tool("fitness", "log_meal", "Log a meal in the food diary.",
      {"meal": e("Which meal.", ["breakfast", "lunch", "dinner", "snack"]),
       "foods": arr("What was eaten.", STR_ITEM, minItems=1),
       "calories": i("Total calories, if known.", minimum=0),
       "date": s("Date, YYYY-MM-DD; today when omitted.")},
      ["meal", "foods"])
def _meal(r):
    meal = r.choice(["breakfast", "lunch", "dinner", "snack"])
    foods = r.sample(FOODS, r.randint(1, 3))
    a: dict[str, Any] = {"meal": meal, "foods": foods}
    cal = d = ""
    if chance(r, 0.4):
        a["calories"] = r.randint(15, 90) * 10 + 5
        cal = f", about {a['calories']} calories"
    if chance(r, 0.3):
        a["date"] = date_str(r)
        d = f" for {a['date']}"
    return pick(r, ["For {a_meal} I had {foods}{cal}. Log it{d}.", "Log my {meal}{d}: {foods}{cal}.",
                    "Food diary{d} - {meal} was {foods}{cal}."],
                meal=meal, a_meal=meal if meal != "snack" else "a snack", foods=join_en(foods), cal=cal, d=d), a


# --------------------------------------------------------------------------- music


@tool("music", "play_music", "Play music on a speaker or device.",
      {"query": s("What to play: a song, album, artist or playlist name."),
       "kind": e("What the query names.", ["track", "album", "artist", "playlist"]),
       "shuffle": b("Shuffle playback."),
       "volume": i("Volume in percent.", minimum=0, maximum=100),
       "device": s("Device name; the current device when omitted.")},
      ["query"])
def _play(r):
    kind = r.choice(["track", "album", "artist", "playlist"])
    q = r.choice({"track": SONGS, "album": ALBUMS, "artist": ARTISTS, "playlist": PLAYLISTS}[kind])
    a: dict[str, Any] = {"query": q}
    say_kind = chance(r, 0.75)
    if say_kind:
        a["kind"] = kind
    what = {"track": f'the song "{q}"', "album": f"the album {q}", "artist": f"some {q}",
            "playlist": f"my {q} playlist"}[kind] if say_kind else f'"{q}"'
    opts = r.sample(["s", "v", "d"], r.choice([0, 1, 1, 2]))
    sh = vol = dev = ""
    if "s" in opts:
        a["shuffle"] = True
        sh = " on shuffle"
    if "v" in opts:
        a["volume"] = r.choice([20, 30, 40, 55, 70])
        vol = f" at volume {a['volume']}"
    if "d" in opts:
        a["device"] = r.choice(DEVICES)
        dev = f" on the {a['device']}"
    return pick(r, ["Play {what}{sh}{dev}{vol}.", "Put on {what}{dev}{sh}{vol}, please.",
                    "I'd like to hear {what}{vol}{sh}{dev}."], what=what, sh=sh, vol=vol, dev=dev), a


@tool("music", "create_playlist", "Create a new playlist.",
      {"name": s("Playlist name."),
       "description": s("Short description."),
       "track_ids": arr("Tracks to add right away.", STR_ITEM),
       "public": b("Whether other users can see it.")},
      ["name"])
def _create_playlist(r):
    nm = r.choice(PLAYLIST_NAMES)
    a: dict[str, Any] = {"name": nm}
    opts = r.sample(["d", "t", "p"], r.choice([0, 1, 1, 2]))
    de = tr = pb = ""
    if "d" in opts:
        a["description"] = r.choice(["Songs for long drives", "Low-key music for working", "Saturday cooking"])
        de = f' described as "{a["description"]}"'
    if "t" in opts:
        a["track_ids"] = [f"trk_{token(r, 6)}" for _ in range(r.randint(1, 3))]
        tr = f" and add {join_en(a['track_ids'])}"
    if "p" in opts:
        a["public"] = chance(r)
        pb = " Make it public." if a["public"] else " Keep it private."
    return pick(r, ['Create a playlist called "{nm}"{de}{tr}.{pb}', 'Make a new playlist "{nm}"{de}{tr}.{pb}',
                    'Start a playlist named "{nm}"{tr}{de}.{pb}'], nm=nm, de=de, tr=tr, pb=pb), a


@tool("music", "remove_playlist_tracks", "Remove tracks from a playlist by their 1-based positions.",
      {"playlist_id": s("Playlist id, e.g. 'pl_x7k2m9qa'."),
       "positions": arr("1-based positions of the tracks to remove.", {"type": "integer", "minimum": 1},
                        minItems=1)},
      ["playlist_id", "positions"])
def _remove_tracks(r):
    pid = f"pl_{token(r, 8)}"
    pos = sorted(r.sample(range(1, 40), r.randint(1, 4)))
    a = {"playlist_id": pid, "positions": pos}
    word = "track" if len(pos) == 1 else "tracks"
    return pick(r, ["Remove {word} {pos} from playlist {pid}.",
                    "In playlist {pid}, delete the songs at positions {pos}.",
                    "Take {word} number {pos} out of {pid}."], word=word, pos=join_en(pos), pid=pid), a


# --------------------------------------------------------------------------- files


@tool("files", "upload_file", "Upload a local file to cloud storage.",
      {"local_path": s("Path of the file on this computer."),
       "destination_folder": s("Cloud folder to upload into."),
       "overwrite": b("Replace a file of the same name if it exists."),
       "share_with": arr("Email addresses to share the uploaded file with.", STR_ITEM)},
      ["local_path", "destination_folder"])
def _upload(r):
    lp, df = r.choice(LOCAL_FILES), r.choice(CLOUD_FOLDERS)
    a: dict[str, Any] = {"local_path": lp, "destination_folder": df}
    ow = sw = ""
    if chance(r, 0.4):
        a["overwrite"] = chance(r, 0.6)
        ow = " Replace it if it already exists." if a["overwrite"] else " Don't overwrite anything."
    if chance(r, 0.35):
        a["share_with"] = emails(r, r.randint(1, 2))
        sw = f" and share it with {join_en(a['share_with'])}"
    return pick(r, ["Upload {lp} to {df}{sw}.{ow}", "Put {lp} into the cloud folder {df}{sw}.{ow}",
                    "Back up {lp} to {df} in my cloud drive{sw}.{ow}"], lp=lp, df=df, sw=sw, ow=ow), a


ROLES = {"viewer": "view only", "commenter": "can comment", "editor": "can edit"}


@tool("files", "share_file", "Share a cloud file with specific people.",
      {"file_path": s("Path of the file in cloud storage."),
       "recipients": arr("People to share with.", obj({"email": s("Their email address."),
                                                       "role": e("Access level.", list(ROLES))},
                                                      ["email", "role"]), minItems=1),
       "notify": b("Email the recipients about the share."),
       "expires_in_days": i("Remove access after this many days.", minimum=1, maximum=365)},
      ["file_path", "recipients"])
def _share(r):
    fp = r.choice(CLOUD_FILES)
    rec = [{"email": x, "role": r.choice(list(ROLES))} for x in emails(r, r.randint(1, 3))]
    a: dict[str, Any] = {"file_path": fp, "recipients": rec}
    nt = ex = ""
    if chance(r, 0.35):
        a["notify"] = chance(r)
        nt = " Notify them by email." if a["notify"] else " Don't send a notification."
    if chance(r, 0.35):
        a["expires_in_days"] = r.choice([3, 7, 14, 30, 90])
        ex = f" Access should expire after {a['expires_in_days']} days."
    who = join_en([f"{x['email']} ({ROLES[x['role']]})" for x in rec])
    return pick(r, ["Share {fp} with {who}.{nt}{ex}", "Give {who} access to {fp}.{ex}{nt}",
                    "Please share the file {fp}: {who}.{nt}{ex}"], fp=fp, who=who, nt=nt, ex=ex), a


@tool("files", "move_file", "Move or rename a file in cloud storage.",
      {"source_path": s("Current path."),
       "destination_path": s("New path, including the file name."),
       "keep_copy": b("Leave a copy at the original path.")},
      ["source_path", "destination_path"])
def _move(r):
    src = r.choice(CLOUD_FILES)
    fname = src.rsplit("/", 1)[1]
    dst = r.choice([f"{r.choice(CLOUD_FOLDERS)}/{fname}", f"/Archive/{fname}"])
    if dst == src:
        dst = f"/Archive/{fname}"
    a: dict[str, Any] = {"source_path": src, "destination_path": dst}
    kc = ""
    if chance(r, 0.3):
        a["keep_copy"] = True
        kc = " but keep a copy where it is"
    return pick(r, ["Move {src} to {dst}{kc}.", "Please relocate {src} -> {dst}{kc}.",
                    "Can you file {src} under {dst}{kc}?"], src=src, dst=dst, kc=kc), a


@tool("files", "search_files", "Search cloud storage by name and content.",
      {"query": s("Words to search for."),
       "file_types": arr("File extensions to include, without the dot.", STR_ITEM),
       "modified_after": s("Only files changed after this date, YYYY-MM-DD."),
       "owner": s("Only files owned by this email address.")},
      ["query"])
def _search_files(r):
    q = r.choice(FILE_QUERIES)
    a: dict[str, Any] = {"query": q}
    opts = r.sample(["t", "m", "o"], r.choice([0, 1, 1, 2]))
    ty = mo = ow = ""
    if "t" in opts:
        a["file_types"] = r.sample(FILE_TYPES, r.randint(1, 2))
        ty = f" (only .{' or .'.join(a['file_types'])} files)"
    if "m" in opts:
        a["modified_after"] = date_str(r)
        mo = f" changed after {a['modified_after']}"
    if "o" in opts:
        a["owner"] = email(r)
        ow = f" owned by {a['owner']}"
    return pick(r, ['Search my drive for "{q}"{ty}{mo}{ow}.', 'Find files about "{q}"{ow}{mo}{ty}.',
                    'Where are the "{q}" documents{mo}{ow}{ty}?'], q=q, ty=ty, mo=mo, ow=ow), a


# --------------------------------------------------------------------------- db


@tool("db", "run_sql_query", "Run a SQL query against a database and return the rows.",
      {"database": s("Database name."),
       "query": s("SQL statement."),
       "max_rows": i("Return at most this many rows.", minimum=1, maximum=10000),
       "read_only": b("Run in a read-only transaction.")},
      ["database", "query"])
def _sql(r):
    db, q = r.choice(DATABASES), r.choice(SQL_QUERIES)
    a: dict[str, Any] = {"database": db, "query": q}
    mr = ro = ""
    if chance(r, 0.4):
        a["max_rows"] = r.choice([10, 50, 100, 500])
        mr = f" Limit the output to {a['max_rows']} rows."
    if chance(r, 0.3):
        a["read_only"] = True
        ro = " Use a read-only transaction."
    return pick(r, ['Run "{q}" on the {db} database.{mr}{ro}', 'Query {db}: "{q}".{ro}{mr}',
                    'Against {db}, execute "{q}" and show me the result.{mr}{ro}'], q=q, db=db, mr=mr, ro=ro), a


@tool("db", "create_db_backup", "Create a backup snapshot of a database.",
      {"database": s("Database name."),
       "backup_name": s("Name for the snapshot; generated when omitted."),
       "compress": b("Compress the backup."),
       "retention_days": i("Delete the backup after this many days.", minimum=1, maximum=3650)},
      ["database"])
def _backup(r):
    db = r.choice(DATABASES)
    a: dict[str, Any] = {"database": db}
    opts = r.sample(["n", "c", "r"], r.choice([0, 1, 1, 2]))
    nm = cp = rt = ""
    if "n" in opts:
        a["backup_name"] = r.choice(["pre-migration", "before-v2-release", "nightly-manual", "audit-snapshot"])
        nm = f' named "{a["backup_name"]}"'
    if "c" in opts:
        a["compress"] = True
        cp = ", compressed"
    if "r" in opts:
        a["retention_days"] = r.choice([7, 14, 30, 90, 365])
        rt = f", and keep it for {a['retention_days']} days"
    return pick(r, ["Back up the {db} database{nm}{cp}{rt}.", "Take a snapshot of {db}{nm}{cp}{rt}.",
                    "Before the deploy, create a backup of {db}{nm}{rt}{cp}."], db=db, nm=nm, cp=cp, rt=rt), a


@tool("db", "delete_rows", "Delete rows from a table by primary key.",
      {"database": s("Database name."),
       "table": s("Table name."),
       "row_ids": arr("Primary keys of the rows to delete.", INT_ITEM, minItems=1),
       "dry_run": b("Only report what would be deleted.")},
      ["database", "table", "row_ids"])
def _delete_rows(r):
    db, tb = r.choice(DATABASES), r.choice(TABLES)
    ids = r.sample(range(100, 99999), r.randint(1, 4))
    a: dict[str, Any] = {"database": db, "table": tb, "row_ids": ids}
    dr = ""
    if chance(r, 0.35):
        a["dry_run"] = True
        dr = " Just do a dry run first."
    word = "row" if len(ids) == 1 else "rows"
    return pick(r, ["Delete {word} {ids} from the {tb} table in {db}.{dr}",
                    "In {db}, remove {tb} {word} with {idw} {ids}.{dr}",
                    "Please drop {word} {ids} from {db}.{tb}.{dr}"], word=word, idw="id" if len(ids) == 1 else "ids",
                ids=join_en(ids), tb=tb, db=db, dr=dr), a


# --------------------------------------------------------------------------- issues

PRIORITIES = {"lowest": "lowest", "low": "low", "medium": "medium", "high": "high", "highest": "highest"}


@tool("issues", "create_issue", "Create an issue in the project tracker.",
      {"project_key": s("Project key, e.g. 'WEB'."),
       "title": s("Short summary."),
       "priority": e("Priority.", list(PRIORITIES)),
       "description": s("Longer description."),
       "labels": arr("Labels to attach.", STR_ITEM),
       "assignee": s("Username of the assignee.")},
      ["project_key", "title", "priority"])
def _create_issue(r):
    pk, title, pr = r.choice(PROJECT_KEYS), r.choice(ISSUE_TITLES), r.choice(list(PRIORITIES))
    a: dict[str, Any] = {"project_key": pk, "title": title, "priority": pr}
    opts = r.sample(["d", "l", "a"], r.choice([0, 1, 1, 2]))
    de = lb = asg = ""
    if "d" in opts:
        a["description"] = r.choice(ISSUE_DESCRIPTIONS)
        de = f' Description: "{a["description"]}"'
    if "l" in opts:
        a["labels"] = r.sample(LABELS, r.randint(1, 2))
        lb = f", labels {join_en(a['labels'])}"
    if "a" in opts:
        a["assignee"] = r.choice(USERNAMES)
        asg = f", assigned to {a['assignee']}"
    return pick(r, ['File a {pr}-priority issue in {pk}: "{title}"{lb}{asg}.{de}',
                    'Create a ticket in project {pk} titled "{title}", priority {pr}{asg}{lb}.{de}',
                    'New {pk} issue, {pr} priority: "{title}"{lb}{asg}.{de}'],
                pr=pr, pk=pk, title=title, lb=lb, asg=asg, de=de), a


STATUSES = {"open": "reopen", "in_progress": "in progress", "in_review": "in review", "done": "done",
            "closed": "closed"}


@tool("issues", "update_issue_status", "Change the workflow status of an issue.",
      {"issue_key": s("Issue key, e.g. 'WEB-412'."),
       "status": e("New status.", list(STATUSES)),
       "comment": s("Comment to add with the change.")},
      ["issue_key", "status"])
def _update_issue(r):
    key, st = f"{r.choice(PROJECT_KEYS)}-{r.randint(10, 999)}", r.choice(list(STATUSES))
    a: dict[str, Any] = {"issue_key": key, "status": st}
    cm = ""
    if chance(r, 0.4):
        a["comment"] = r.choice(["Fixed in the latest build.", "Waiting on design feedback.",
                                 "Cannot reproduce anymore.", "Picked this up today."])
        cm = f' Comment: "{a["comment"]}"'
    if st == "open":
        return pick(r, ["Reopen {key}.{cm}", "Please reopen issue {key}.{cm}"], key=key, cm=cm), a
    return pick(r, ["Move {key} to {st}.{cm}", "Set the status of {key} to {st}.{cm}", "Mark {key} as {st}.{cm}"],
                key=key, st=STATUSES[st], cm=cm), a


@tool("issues", "search_issues", "Search issues in a project.",
      {"project_key": s("Project key."),
       "status": e("Only issues in this status.", list(STATUSES)),
       "assignee": s("Only issues assigned to this username."),
       "labels": arr("Only issues with all of these labels.", STR_ITEM),
       "max_results": i("Maximum number of issues.", minimum=1, maximum=200)},
      ["project_key"])
def _search_issues(r):
    pk = r.choice(PROJECT_KEYS)
    a: dict[str, Any] = {"project_key": pk}
    opts = r.sample(["s", "a", "l", "m"], r.choice([0, 1, 2, 2]))
    st = asg = lb = mx = ""
    if "s" in opts:
        a["status"] = r.choice(["open", "in_progress", "in_review", "done"])
        st = {"open": " open", "in_progress": " in-progress", "in_review": " in-review", "done": " done"}[a["status"]]
    if "a" in opts:
        a["assignee"] = r.choice(USERNAMES)
        asg = f" assigned to {a['assignee']}"
    if "l" in opts:
        a["labels"] = r.sample(LABELS, 1)
        lb = f" labeled {a['labels'][0]}"
    if "m" in opts:
        a["max_results"] = r.choice([10, 20, 50])
        mx = f" (max {a['max_results']})"
    return pick(r, ["List{st} {pk} issues{asg}{lb}{mx}.", "Show me the{st} issues in {pk}{lb}{asg}{mx}.",
                    "Give me a list of{st} tickets in project {pk}{asg}{lb}{mx}."],
                st=st, pk=pk, asg=asg, lb=lb, mx=mx), a


@tool("issues", "add_labels_to_issues", "Add labels to several issues of a repository at once.",
      {"repository": s("Repository as owner/name."),
       "issue_numbers": arr("Issue numbers.", INT_ITEM, minItems=1),
       "labels": arr("Labels to add.", STR_ITEM, minItems=1)},
      ["repository", "issue_numbers", "labels"])
def _add_labels(r):
    repo = r.choice(REPOS)
    nums = r.sample(range(1, 2000), r.randint(1, 4))
    lbls = r.sample(LABELS, r.randint(1, 2))
    a = {"repository": repo, "issue_numbers": nums, "labels": lbls}
    return pick(r, ["Add the {lbls} label{pl} to {iss} {nums} in {repo}.",
                    "In {repo}, label {nums} with {lbls}.",
                    "Tag {repo} {iss} {nums} as {lbls}."],
                lbls=join_en(lbls), pl="s" if len(lbls) > 1 else "", repo=repo, iss="issues" if len(nums) > 1 else "issue",
                nums=join_en([f"#{x}" for x in nums])), a


# --------------------------------------------------------------------------- hr

LEAVE = {"vacation": "vacation", "sick": "sick leave", "parental": "parental leave", "unpaid": "unpaid leave",
         "bereavement": "bereavement leave"}


def employee_id(r: random.Random) -> str:
    return f"E{digits(r, 5)}"


@tool("hr", "request_time_off", "Submit a leave request for approval.",
      {"employee_id": s("Employee id, e.g. 'E40211'."),
       "start_date": s("First day off, YYYY-MM-DD."),
       "end_date": s("Last day off, YYYY-MM-DD."),
       "leave_type": e("Type of leave.", list(LEAVE)),
       "half_day": b("Whether the (single) day is a half day."),
       "note": s("Note for the approver.")},
      ["employee_id", "start_date", "end_date", "leave_type"])
def _time_off(r):
    eid, lt = employee_id(r), r.choice(list(LEAVE))
    if chance(r, 0.2):
        d = date_str(r)
        a: dict[str, Any] = {"employee_id": eid, "start_date": d, "end_date": d, "leave_type": lt, "half_day": True}
        return pick(r, ["Request a half day of {lt} on {d} for employee {eid}.",
                        "I'm {eid}; I need half a day off ({lt}) on {d}."], lt=LEAVE[lt], d=d, eid=eid), a
    d1, d2 = date_range(r, 1, 14)
    a = {"employee_id": eid, "start_date": d1, "end_date": d2, "leave_type": lt}
    nt = ""
    if lt in ("vacation", "unpaid") and chance(r, 0.6):
        a["note"] = r.choice(LEAVE_NOTES)
        nt = f' Note: "{a["note"]}"'
    return pick(r, ["Book {lt} for employee {eid} from {d1} to {d2}.{nt}",
                    "I'm {eid} and I'd like to request {lt}, {d1} through {d2}.{nt}",
                    "Submit a time-off request: {eid}, {lt}, {d1} to {d2}.{nt}"],
                lt=LEAVE[lt], eid=eid, d1=d1, d2=d2, nt=nt), a


EXPENSE_CATEGORIES = {"travel": "travel", "meals": "meals", "lodging": "lodging", "supplies": "supplies"}


@tool("hr", "submit_expense_report", "Submit an expense report for reimbursement.",
      {"employee_id": s("Employee id."),
       "currency": e("Currency of all amounts.", ["USD", "EUR", "GBP"]),
       "expenses": arr("The individual expenses.",
                       obj({"date": s("Date of the expense, YYYY-MM-DD."),
                            "amount": n("Amount spent.", exclusiveMinimum=0),
                            "category": e("Expense category.", list(EXPENSE_CATEGORIES) + ["other"]),
                            "description": s("What it was.")},
                           ["date", "amount", "category"]), minItems=1)},
      ["employee_id", "currency", "expenses"])
def _expenses(r):
    eid, cur = employee_id(r), r.choice(["USD", "EUR", "GBP"])
    with_desc = chance(r, 0.45)
    exps = []
    for _ in range(r.randint(1, 3)):
        cat = r.choice(list(EXPENSE_CATEGORIES))
        x: dict[str, Any] = {"date": date_str(r), "amount": money(r, 8, 450), "category": cat}
        if with_desc:
            x["description"] = r.choice(EXPENSE_DESCRIPTIONS[cat])
        exps.append(x)
    a = {"employee_id": eid, "currency": cur, "expenses": exps}
    etxt = "; ".join(f"{x['date']}, {x['category']}, {x['amount']}" + (f" ({x['description']})" if with_desc else "")
                     for x in exps)
    cur_txt = r.choice({"USD": ["USD", "dollars"], "EUR": ["EUR", "euros"], "GBP": ["GBP", "pounds"]}[cur])
    return pick(r, ["File an expense report for {eid} in {cur}: {e}.",
                    "Expenses for employee {eid}, amounts in {cur} - {e}.",
                    "Please submit my expenses (I'm {eid}, all in {cur}): {e}."], eid=eid, cur=cur_txt, e=etxt), a


@tool("hr", "get_payslips", "Fetch an employee's payslips for given months of a year.",
      {"employee_id": s("Employee id."),
       "year": i("Calendar year.", minimum=2000, maximum=2100),
       "months": arr("Month numbers, 1 = January.", {"type": "integer", "minimum": 1, "maximum": 12}, minItems=1)},
      ["employee_id", "year", "months"])
def _payslips(r):
    eid, year = employee_id(r), r.choice([2024, 2025, 2026])
    months = sorted(r.sample(range(1, 13), r.randint(1, 3)))
    a = {"employee_id": eid, "year": year, "months": months}
    word = "month" if len(months) == 1 else "months"
    return pick(r, ["Get the payslips for {word} {m} of {y} for employee {eid}.",
                    "I need my payslips from {y}, {word} {m}. My employee ID is {eid}.",
                    "Download payslips: {eid}, year {y}, {word} {m}."],
                word=word, m=join_en(months), y=year, eid=eid), a


INTERVIEW_FORMATS = {"onsite": "on site", "video": "over video", "phone": "by phone"}


@tool("hr", "schedule_interview", "Schedule a job interview with a candidate.",
      {"candidate_name": s("Candidate's full name."),
       "position": s("Job title."),
       "interviewers": arr("Interviewer email addresses.", STR_ITEM, minItems=1),
       "date": s("YYYY-MM-DD."),
       "start_time": s("24-hour HH:MM."),
       "format": e("Interview format.", list(INTERVIEW_FORMATS)),
       "duration_minutes": i("Length in minutes.", minimum=15, maximum=480)},
      ["candidate_name", "position", "interviewers", "date", "start_time"])
def _interview(r):
    cand, pos, d, tm = person(r), r.choice(POSITIONS), date_str(r), clock(r, 8, 17)
    ivs = emails(r, r.randint(1, 2))
    a: dict[str, Any] = {"candidate_name": cand, "position": pos, "interviewers": ivs, "date": d, "start_time": tm}
    fm = du = ""
    if chance(r, 0.45):
        a["format"] = r.choice(list(INTERVIEW_FORMATS))
        fm = f" {INTERVIEW_FORMATS[a['format']]}"
    if chance(r, 0.35):
        a["duration_minutes"] = r.choice([30, 45, 60, 90])
        du = f" for {a['duration_minutes']} minutes"
    return pick(r, ["Schedule an interview with {cand} for the {pos} role on {d} at {tm}{fm}{du}, with {ivs}.",
                    "Set up {cand}'s {pos} interview{fm}: {d}, {tm}{du}. Interviewers: {ivs}.",
                    "Book {ivs} to interview {cand} ({pos}) on {d} at {tm}{du}{fm}."],
                cand=cand, pos=pos, d=d, tm=tm, fm=fm, du=du, ivs=join_en(ivs)), a


# --------------------------------------------------------------------------- shipping

SERVICE = {"standard": "standard shipping", "express": "express shipping", "overnight": "overnight delivery"}


@tool("shipping", "create_shipment", "Create a shipping label for a parcel.",
      {"recipient": obj({"name": s("Recipient name."), "street": s("Street and number."), "city": s("City."),
                         "postal_code": s("Postal code."), "country": s("ISO two-letter country code.")},
                        ["name", "street", "city", "postal_code", "country"], "Who receives the parcel."),
       "package": obj({"weight_kg": n("Weight in kilograms.", exclusiveMinimum=0),
                       "length_cm": i("Length in cm.", minimum=1), "width_cm": i("Width in cm.", minimum=1),
                       "height_cm": i("Height in cm.", minimum=1)},
                      ["weight_kg"], "Parcel measurements.", closed=True),
       "service_level": e("Delivery speed.", list(SERVICE)),
       "signature_required": b("Require a signature on delivery.")},
      ["recipient", "package", "service_level"])
def _shipment(r):
    name = person(r)
    street, city, pc, country = r.choice(ADDRESSES)
    pkg: dict[str, Any] = {"weight_kg": tenths(r, 0, 20)}
    dims = ""
    if chance(r, 0.5):
        pkg.update(length_cm=r.randint(15, 80), width_cm=r.randint(10, 50), height_cm=r.randint(5, 40))
        dims = f" ({pkg['length_cm']}x{pkg['width_cm']}x{pkg['height_cm']} cm)"
    svc = r.choice(list(SERVICE))
    a: dict[str, Any] = {"recipient": {"name": name, "street": street, "city": city, "postal_code": pc,
                                       "country": country}, "package": pkg, "service_level": svc}
    sg = ""
    if chance(r, 0.35):
        a["signature_required"] = True
        sg = " Signature required on delivery."
    return pick(r, ["Ship a {w} kg parcel{dims} to {name}, {street}, {city} {pc}, {country} via {svc}.{sg}",
                    "Create a label: {svc}, {w} kg{dims}, for {name} at {street}, {city} {pc}, {country}.{sg}",
                    "I'm sending {name} a package ({w} kg){dims2}. Address: {street}, {city} {pc}, {country}. "
                    "Use {svc}.{sg}"],
                w=pkg["weight_kg"], dims=dims, dims2=dims.replace(" (", ", ").rstrip(")") if dims else "",
                name=name, street=street, city=city, pc=pc, country=country, svc=SERVICE[svc], sg=sg), a


@tool("shipping", "get_shipping_rates", "Compare carrier prices for a parcel between two postal codes.",
      {"origin_postal_code": s("Postal code the parcel leaves from."),
       "destination_postal_code": s("Postal code it goes to."),
       "weight_kg": n("Weight in kilograms.", exclusiveMinimum=0),
       "carriers": arr("Only quote these carriers.", STR_ITEM)},
      ["origin_postal_code", "destination_postal_code", "weight_kg"])
def _rates(r):
    (_, _, p1, _), (_, _, p2, _) = r.sample(ADDRESSES, 2)
    w = tenths(r, 0, 25)
    a: dict[str, Any] = {"origin_postal_code": p1, "destination_postal_code": p2, "weight_kg": w}
    cr = ""
    if chance(r, 0.4):
        a["carriers"] = r.sample(CARRIERS, r.randint(1, 3))
        cr = f" Only {join_en(a['carriers'], 'and')}."
    return pick(r, ["How much to ship {w} kg from {p1} to {p2}?{cr}",
                    "Compare shipping rates for a {w} kg box, {p1} to {p2}.{cr}",
                    "Get me quotes to send a parcel ({w} kg) from postal code {p1} to {p2}.{cr}"],
                w=w, p1=p1, p2=p2, cr=cr), a


CARRIER_ENUM = {"ups": "UPS", "fedex": "FedEx", "dhl": "DHL", "usps": "USPS"}


@tool("shipping", "track_shipment", "Track a parcel by its carrier tracking number.",
      {"tracking_number": s("Tracking number."),
       "carrier": e("Carrier; detected from the number when omitted.", list(CARRIER_ENUM))},
      ["tracking_number"])
def _track_shipment(r):
    tn = "1Z" + token(r, 16, "ABCDEFGHJKLMNPRSTUVWXY0123456789")
    a: dict[str, Any] = {"tracking_number": tn}
    cr = ""
    if chance(r, 0.5):
        a["carrier"] = r.choice(list(CARRIER_ENUM))
        cr = f" {CARRIER_ENUM[a['carrier']]}"
    return pick(r, ["Where is my{cr} parcel {tn}?", "Track{cr} shipment {tn}.",
                    "Any update on{cr} tracking number {tn}?"], cr=cr, tn=tn), a


@tool("shipping", "schedule_pickup", "Ask a courier to collect parcels from an address.",
      {"address": s("Pickup address."),
       "date": s("Pickup date, YYYY-MM-DD."),
       "time_window": obj({"start": s("Earliest pickup, HH:MM."), "end": s("Latest pickup, HH:MM.")},
                          ["start", "end"], "When the courier may come."),
       "package_count": i("Number of parcels.", minimum=1)},
      ["address", "date", "time_window"])
def _pickup(r):
    street, city, pc, _ = r.choice(ADDRESSES)
    addr, d = f"{street}, {city} {pc}", date_str(r)
    h = r.randint(8, 14)
    win = {"start": f"{h:02d}:00", "end": f"{h + r.choice([2, 3, 4]):02d}:00"}
    a: dict[str, Any] = {"address": addr, "date": d, "time_window": win}
    pc_txt = ""
    if chance(r, 0.5):
        a["package_count"] = r.randint(1, 6)
        pc_txt = f" {a['package_count']} parcel{'s' if a['package_count'] > 1 else ''}"
    return pick(r, ["Schedule a courier pickup of{pcs} at {addr} on {d} between {s} and {e}.",
                    "Can someone collect{pcs_or} from {addr} on {d}? Any time from {s} to {e}.",
                    "Book a pickup{pcs_for}: {addr}, {d}, {s}-{e}."],
                pcs=pc_txt or " my parcels", pcs_or=pc_txt or " my parcels", pcs_for=f" for{pc_txt}" if pc_txt else "",
                addr=addr, d=d, s=win["start"], e=win["end"]), a


# --------------------------------------------------------------------------- tasks


@tool("tasks", "create_task", "Add a task to the to-do list.",
      {"title": s("Task title."),
       "due_date": s("Due date, YYYY-MM-DD."),
       "priority": i("1 (urgent) to 4 (low).", minimum=1, maximum=4),
       "tags": arr("Tags.", STR_ITEM),
       "subtasks": arr("Checklist items.", STR_ITEM)},
      ["title"])
def _task(r):
    title = r.choice(TASK_TITLES)
    a: dict[str, Any] = {"title": title}
    opts = r.sample(["d", "p", "t", "s"], r.choice([0, 1, 2, 2]))
    du = pr = tg = sb = ""
    if "d" in opts:
        a["due_date"] = date_str(r)
        du = f" due {a['due_date']}"
    if "p" in opts:
        a["priority"] = r.randint(1, 4)
        pr = f", priority {a['priority']}"
    if "t" in opts:
        a["tags"] = r.sample(["home", "errands", "work", "family", "admin"], r.randint(1, 2))
        tg = f", tagged {join_en(a['tags'])}"
    if "s" in opts:
        a["subtasks"] = r.sample(SUBTASKS, 2)
        sb = f' Subtasks: "{a["subtasks"][0]}" and "{a["subtasks"][1]}".'
    return pick(r, ['Add a task "{title}"{du}{pr}{tg}.{sb}', 'Remind me to do this: "{title}"{du}{tg}{pr}.{sb}',
                    'New to-do: "{title}"{pr}{du}{tg}.{sb}'], title=title, du=du, pr=pr, tg=tg, sb=sb), a


@tool("tasks", "create_note", "Save a text note.",
      {"title": s("Note title."),
       "content": s("Note text."),
       "folder": s("Folder; the default folder when omitted."),
       "pinned": b("Pin the note to the top.")},
      ["title", "content"])
def _note(r):
    title, content = r.choice(NOTE_ITEMS)
    a: dict[str, Any] = {"title": title, "content": content}
    fd = pn = ""
    if chance(r, 0.4):
        a["folder"] = r.choice(NOTE_FOLDERS)
        fd = f" in my {a['folder']} folder"
    if chance(r, 0.35):
        a["pinned"] = True
        pn = " Pin it."
    return pick(r, ['Save a note titled "{title}"{fd}: "{content}"{pn}',
                    'Make a note{fd} called "{title}" that says "{content}"{pn}',
                    'Write down "{content}" as a note named "{title}"{fd}.{pn}'],
                title=title, content=content, fd=fd, pn=pn), a


# --------------------------------------------------------------------------- dining

SEATING = {"indoor": "inside", "outdoor": "on the terrace", "bar": "at the bar", "private_room": "in a private room"}


@tool("dining", "reserve_table", "Reserve a table at a restaurant.",
      {"restaurant": s("Restaurant name."),
       "date": s("YYYY-MM-DD."),
       "time": s("24-hour HH:MM."),
       "party_size": i("Number of people.", minimum=1, maximum=20),
       "seating": e("Seating preference.", list(SEATING)),
       "special_requests": s("Anything the restaurant should know.")},
      ["restaurant", "date", "time", "party_size"])
def _reserve(r):
    rest, d, tm, ps = r.choice(RESTAURANTS), date_str(r), clock(r, 12, 21), r.randint(2, 8)
    a: dict[str, Any] = {"restaurant": rest, "date": d, "time": tm, "party_size": ps}
    se = sr = ""
    if chance(r, 0.4):
        a["seating"] = r.choice(list(SEATING))
        se = f", {SEATING[a['seating']]}"
    if chance(r, 0.3):
        a["special_requests"] = r.choice(SPECIAL_REQUESTS)
        sr = f' Please add: "{a["special_requests"]}"'
    return pick(r, ["Book a table for {ps} at {rest} on {d} at {tm}{se}.{sr}",
                    "Reserve {rest} for {ps} people, {d}, {tm}{se}.{sr}",
                    "Can you get us a table at {rest}? {ps} of us, {d} at {tm}{se}.{sr}"],
                ps=ps, rest=rest, d=d, tm=tm, se=se, sr=sr), a


@tool("dining", "order_food_delivery", "Order food for delivery from a restaurant.",
      {"restaurant": s("Restaurant name."),
       "items": arr("Dishes to order.", STR_ITEM, minItems=1),
       "delivery_address": s("Where to deliver."),
       "tip_amount": n("Tip for the courier.", minimum=0),
       "contactless": b("Leave the order at the door.")},
      ["restaurant", "items", "delivery_address"])
def _delivery(r):
    rest, items = r.choice(RESTAURANTS), r.sample(DISHES, r.randint(1, 3))
    street, city, _, _ = r.choice(ADDRESSES)
    addr = f"{street}, {city}"
    a: dict[str, Any] = {"restaurant": rest, "items": items, "delivery_address": addr}
    tp = ct = ""
    if chance(r, 0.4):
        a["tip_amount"] = r.choice([2, 3, 5, 4.5, 2.5, 7])
        tp = f" Tip {a['tip_amount']}."
    if chance(r, 0.35):
        a["contactless"] = True
        ct = " Leave it at the door."
    return pick(r, ["Order {items} from {rest} to {addr}.{tp}{ct}",
                    "Delivery from {rest}, please: {items}, to {addr}.{ct}{tp}",
                    "I'd like delivery from {rest}: {items}. Address: {addr}.{tp}{ct}"],
                items=join_en(items), rest=rest, addr=addr, tp=tp, ct=ct), a


# --------------------------------------------------------------------------- cinema

TICKETS = {"adult": "adult", "child": "child", "senior": "senior", "student": "student"}


@tool("cinema", "book_movie_tickets", "Book cinema seats for a showing.",
      {"cinema": s("Cinema name."),
       "movie_title": s("Film title."),
       "date": s("YYYY-MM-DD."),
       "showtime": s("Start time, HH:MM."),
       "seat_numbers": arr("Seat numbers.", {"type": "integer", "minimum": 1}, minItems=1),
       "ticket_type": e("Ticket type for all seats.", list(TICKETS))},
      ["cinema", "movie_title", "date", "showtime", "seat_numbers"])
def _tickets(r):
    cin, mv, d, tm = r.choice(CINEMAS), r.choice(MOVIES), date_str(r), clock(r, 13, 22)
    start = r.randint(1, 180)
    seats = list(range(start, start + r.randint(1, 4)))
    a: dict[str, Any] = {"cinema": cin, "movie_title": mv, "date": d, "showtime": tm, "seat_numbers": seats}
    tt = ""
    if chance(r, 0.4):
        a["ticket_type"] = r.choice(list(TICKETS))
        tt = f" ({TICKETS[a['ticket_type']]} tickets)"
    word = "seat" if len(seats) == 1 else "seats"
    return pick(r, ['Book {word} {seats} for "{mv}" at {cin} on {d}, {tm} showing{tt}.',
                    'I want to see "{mv}" at {cin} on {d} at {tm}. Reserve {word} {seats}{tt}.',
                    'Get me {word} {seats}{tt} for the {tm} screening of "{mv}" at {cin}, {d}.'],
                word=word, seats=join_en(seats), mv=mv, cin=cin, d=d, tm=tm, tt=tt), a


FORMATS = {"2d": "2D", "3d": "3D", "imax": "IMAX"}


@tool("cinema", "find_showtimes", "Find showtimes for a film in a city.",
      {"movie_title": s("Film title."),
       "city": s("City."),
       "date": s("YYYY-MM-DD; today when omitted."),
       "format": e("Screening format.", list(FORMATS))},
      ["movie_title", "city"])
def _showtimes(r):
    mv, city = r.choice(MOVIES), r.choice(CITIES)
    a: dict[str, Any] = {"movie_title": mv, "city": city}
    d = fm = ""
    if chance(r, 0.5):
        a["date"] = date_str(r)
        d = f" on {a['date']}"
    if chance(r, 0.35):
        a["format"] = r.choice(list(FORMATS))
        fm = f" in {FORMATS[a['format']]}"
    return pick(r, ['When is "{mv}" playing in {city}{d}{fm}?', 'Showtimes for "{mv}"{fm} in {city}{d}, please.',
                    'Is "{mv}" showing anywhere in {city}{fm}{d}?'], mv=mv, city=city, d=d, fm=fm), a


# =========================================================================== building

_NUM_RE_CACHE: dict[str, re.Pattern[str]] = {}


def number_in_text(value: int | float, text: str) -> bool:
    """``value`` occurs in ``text`` exactly as JSON writes it, not as part of a longer number."""
    lit = json.dumps(value)
    pat = _NUM_RE_CACHE.setdefault(lit, re.compile(r"(?<![\d.])" + re.escape(lit) + r"(?!\d|\.\d)"))
    return pat.search(text) is not None


def unrecoverable(value: Any, schema: dict[str, Any], prompt: str, path: str = "") -> list[str]:
    """Leaves of ``value`` that cannot be read off the prompt (enum-constrained leaves exempt)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return [p for k, v in value.items() for p in unrecoverable(v, props.get(k, {}), prompt, f"{path}/{k}")]
    if isinstance(value, list):
        items = schema.get("items", {})
        return [p for idx, v in enumerate(value) for p in unrecoverable(v, items, prompt, f"{path}/{idx}")]
    if "enum" in schema or isinstance(value, bool) or value is None:
        return []
    if isinstance(value, str):
        return [] if value in prompt else [f"{path}={value!r}"]
    if isinstance(value, (int, float)):
        return [] if number_in_text(value, prompt) else [f"{path}={value!r}"]
    return [f"{path}: unexpected {type(value).__name__}"]


FEATURES = ["enum", "nested object", "array of strings", "array of integers", "array of objects", "integer",
            "number", "boolean", "optional fields", "required list", "minimum/maximum",
            "additionalProperties: false"]


def schema_features(params: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    root_props = params.get("properties", {})
    root_req = params.get("required", [])
    if root_req:
        found.add("required list")
    if set(root_props) - set(root_req):
        found.add("optional fields")

    def walk(node: dict[str, Any], depth: int) -> None:
        t = node.get("type")
        if "enum" in node:
            found.add("enum")
        if t in ("integer", "number", "boolean"):
            found.add(t)
        if "minimum" in node or "maximum" in node:
            found.add("minimum/maximum")
        if t == "object":
            if depth > 0 and node.get("properties"):
                found.add("nested object")
            if node.get("additionalProperties") is False:
                found.add("additionalProperties: false")
            for sub in node.get("properties", {}).values():
                walk(sub, depth + 1)
        if t == "array":
            items = node.get("items", {})
            kind = {"string": "array of strings", "integer": "array of integers", "object": "array of objects"}
            if items.get("type") in kind:
                found.add(kind[items["type"]])
            walk(items, depth + 1)

    walk(params, 0)
    return found


def pick_distractors(r: random.Random, gold: Tool, k: int) -> list[Tool]:
    same = [t for t in TOOLS if t.domain == gold.domain and t.name != gold.name]
    near = [t for t in TOOLS if t.domain in NEIGHBOURS[gold.domain]]
    r.shuffle(same)
    r.shuffle(near)
    return (same + near)[:k]


def build_cases(r: random.Random) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    seen_prompts: set[str] = set()
    per_domain: Counter[str] = Counter()
    sizes, weights = list(TOOLS_OFFERED_WEIGHTS), list(TOOLS_OFFERED_WEIGHTS.values())
    for t in TOOLS:
        for _ in range(CASES_PER_TOOL):
            for _attempt in range(100):
                prompt, args = t.gen(r)
                if prompt not in seen_prompts and len(prompt) <= MAX_PROMPT_CHARS:
                    break
            else:  # pragma: no cover - would mean a generator has too little variety
                raise SystemExit(f"{t.name}: could not draw a fresh prompt under {MAX_PROMPT_CHARS} chars")
            seen_prompts.add(prompt)
            offered = [t]
            if r.random() < MULTI_TOOL_SHARE:
                offered += pick_distractors(r, t, r.choices(sizes, weights)[0] - 1)
                r.shuffle(offered)
            per_domain[t.domain] += 1
            cases.append({
                "id": f"{t.domain}-{per_domain[t.domain]:04d}",
                "prompt": prompt,
                "tools": [x.spec() for x in offered],
                "gold_tool_name": t.name,
                "allowed_tools": [x.name for x in offered],
                "gold_arguments": args,
            })
    r.shuffle(cases)
    return cases


def check(cases: list[dict[str, Any]]) -> None:
    problems: list[str] = []
    for c in cases:
        case = Case.model_validate(c)
        gold = case.gold_tool
        if check_tool_schema(gold.parameters):
            problems.append(f"{case.id}: bad schema")
        violation = validate_arguments(c["gold_arguments"], gold.parameters)
        if violation is not None:
            problems.append(f"{case.id}: {violation.keyword} at {violation.path}: {violation.message}")
        for leaf in unrecoverable(c["gold_arguments"], gold.parameters, c["prompt"]):
            problems.append(f"{case.id}: not in prompt: {leaf}")
    names = [t.name for t in TOOLS]
    if len(names) != len(set(names)):
        problems.append("duplicate tool names")
    if RESERVED_NAMES & set(names):
        problems.append(f"reserved tool names used: {sorted(RESERVED_NAMES & set(names))}")
    if problems:
        raise SystemExit("generated cases failed their checks:\n  " + "\n  ".join(problems))


def stats_markdown(cases: list[dict[str, Any]]) -> str:
    by_name = {t.name: t for t in TOOLS}
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
    tools_per_domain = Counter(t.domain for t in TOOLS)
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


def main() -> None:
    r = random.Random(SEED)
    cases = build_cases(r)
    check(cases)
    OUT_PATH.parent.mkdir(parents=True, exist_ok=True)
    with OUT_PATH.open("w", encoding="utf-8") as fh:
        for c in cases:
            fh.write(json.dumps(c, ensure_ascii=False) + "\n")
    stats = stats_markdown(cases)
    STATS_PATH.write_text(stats, encoding="utf-8")
    print(stats, end="")


if __name__ == "__main__":
    main()
