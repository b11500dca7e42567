"""Served runs against real deployments: API keys, gateway headers, proxies, 401/403, rate limits (``Retry-After``,
a token bucket). The real ``toolfid`` CLI against an in-process endpoint (tests/fake_server.py) on loopback."""

from __future__ import annotations

import email.utils
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .fake_server import Fake, TokenBucket, serve
from .lm_eval_helpers import FIXTURE_TASK
from .test_served_faults import _main, _toolfid

# in-process `toolfid lm-eval` calls: lm-eval's own task folder indexed once per process (tests/lm_eval_helpers.py)

KEY = "sk-toolfid-RECOGNISABLE-7f3a9c"
GATEWAY = "gw-toolfid-SECRET-51d2e8"
BIN = Path(sys.executable).parent


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TOOLFID_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("OPENAI_API_KEY", "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                 "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


def _run(url: str, out: Path, *extra: str, limit: int = 4) -> list[str]:
    return ["run", "--server", url, "--base", "fake-base", "--adapter", "ad=fake-ad", "--task", FIXTURE_TASK,
            "--output", str(out), "--json", "--limit", str(limit), *extra]


def _samples(out: Path, label: str) -> list[dict]:
    return [json.loads(x) for x in (out / label / "samples.jsonl").read_text().splitlines() if x.strip()]


def _files_holding(root: Path, *secrets: str) -> list[str]:
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found += [f"{path.relative_to(root)}: {s[:6]}…" for s in secrets if s.encode() in data]
    return found


def test_a_key_and_a_gateway_header_reach_every_request_and_no_file_or_output(
        tmp_path: Path, capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    """The whole served run as a user runs it (OPENAI_API_KEY; a gateway header): stopped by the server mid-view
    (the journal, the resume hint), then resumed to the end with --html and --junit through the console script.
    Every request carried both; no file under the output folder or the reference store, and nothing printed, holds
    either — not even a server error that quotes them back.

    The stopped run goes through the CLI's entry point in this process (one console start less, ~5 s): what it
    prints is read from its stdout and stderr, from this process's file descriptors (capfd) and from every log
    record that reached the root logger (caplog), so a line a stray handler would have written is seen too. The
    resume, with --verbose (lm-eval's own log lines too), is the console script."""
    from .lm_eval_helpers import toolfid_here

    fake = Fake(keys={KEY}, plan=lambda n, body: {1: "leak500"}.get(n, "down" if n == 3 and not resumed else None))
    resumed = False
    url, stop = serve(fake)
    out, home = tmp_path / "out", tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper()}
    env.update(OPENAI_API_KEY=KEY, TOOLFID_HOME=str(home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    args = _run(url, out, "--header", f"X-Gateway-Token: {GATEWAY}", "--concurrency", "1", "--max-retries", "0")
    try:
        with pytest.MonkeyPatch.context() as mp:
            for name in [k for k in os.environ if "PROXY" in k.upper()]:
                mp.delenv(name)
            caplog.set_level(logging.DEBUG, logger="lm_eval")
            first = toolfid_here(args, home, env={"OPENAI_API_KEY": KEY})
        printed = capfd.readouterr()
        first_logs = caplog.text
        assert first.returncode == 6, first.stderr[-2000:]
        assert "--resume" in first.stderr and (out / ".served" / "base.jsonl").is_file()
        assert "X-Gateway-Token: <value not shown>" in first.stderr  # the resume hint names the header, not its value
        leaks = _files_holding(out, KEY, GATEWAY)
        fake.down, resumed = False, True
        second = subprocess.run([str(BIN / "toolfid"), *args, "--resume", "--html", str(out / "report.html"),
                                 "--junit", str(out / "junit.xml"), "--verbose"], capture_output=True, text=True,
                                env=env, timeout=300)
    finally:
        stop()
    assert second.returncode == 0, second.stderr[-2000:]
    served = _toolfid(out, "base")["served"]
    assert served.get("server_errors", 0) == 0  # the failed request was asked again by the resume
    assert "1 other requests failed (e.g. HTTP 500" in first.stderr and "***" in first.stderr  # quoted back, blanked
    assert (out / "report.html").is_file() and (out / "junit.xml").is_file()
    leaks += _files_holding(out, KEY, GATEWAY) + _files_holding(home, KEY, GATEWAY)
    for name, text in (("first stdout", first.stdout), ("first stderr", first.stderr),
                       ("first, this process's stdout", printed.out), ("first, this process's stderr", printed.err),
                       ("first, log records", first_logs),
                       ("second stdout", second.stdout), ("second stderr", second.stderr)):
        leaks += [f"{name}: {s[:6]}…" for s in (KEY, GATEWAY) if s in text]
    assert leaks == []
    assert fake.seen and all(h.get("authorization") == f"Bearer {KEY}" and h.get("x-gateway-token") == GATEWAY
                             for _, _, _, h in fake.seen)
    assert {m for _, m, _, _ in fake.seen} == {"GET", "POST"}  # /v1/models asked with the key too


def test_a_refused_key_is_one_line_with_its_own_exit_code(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake(keys={KEY}))
    try:
        code, _, err = _main(_run(url, tmp_path / "out"))
    finally:
        stop()
    assert code == 7, err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "the server refused the request: HTTP 401; set OPENAI_API_KEY or --api-key-env NAME" \
        in lines[0], err
    assert "Traceback" not in err


def test_a_key_withdrawn_mid_run_keeps_the_finished_views(home: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--api-key-env names the variable; the key is withdrawn at the adapter view's first request: exit 7, one
    line, the base view kept; with a good key again --resume runs only the adapter view."""
    monkeypatch.setenv("MY_GATEWAY_KEY", KEY)
    fake = Fake(keys={KEY}, plan=lambda n, body: "revoke" if n == 4 else None)
    url, stop = serve(fake)
    out = tmp_path / "out"
    try:
        code, _, err = _main(_run(url, out, "--api-key-env", "MY_GATEWAY_KEY", "--concurrency", "1"))
        assert code == 7, err[-2000:]
        errors = [line for line in err.splitlines() if line.startswith("toolfid: error")]
        assert len(errors) == 1 and "Traceback" not in err, err
        assert "HTTP 403" in errors[0] and "the key from MY_GATEWAY_KEY was sent" in errors[0] and "finished views kept" in errors[0]
        assert (out / "base" / "manifest.json").is_file() and not (out / "ad").exists()
        assert KEY not in err
        fake.keys, fake.plan = {KEY}, (lambda n, body: None)
        fake.requests.clear()
        code, _, err = _main(_run(url, out, "--api-key-env", "MY_GATEWAY_KEY", "--resume"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert {r["model"] for r in fake.requests} == {"fake-ad"}  # the base view was reused


def test_an_unset_key_variable_is_one_line(home: Path, tmp_path: Path) -> None:
    url, stop = serve(Fake())
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--api-key-env", "TOOLFID_NO_SUCH_VARIABLE"))
    finally:
        stop()
    assert code == 4 and "TOOLFID_NO_SUCH_VARIABLE, which is not set" in err and len(err.strip().splitlines()) == 1


def test_retry_after_in_seconds_and_as_a_date_is_waited_up_to_the_cap(home: Path, tmp_path: Path) -> None:
    """One request refused three times: 429 Retry-After 1 s, 503 Retry-After an HTTP date ~2 s ahead, 429
    Retry-After 30 s with --retry-after-max 1; then answered. None counts against --max-retries 0."""
    plans: dict[int, str] = {}
    fake = Fake(plan=lambda n, body: plans.get(n))
    url, stop = serve(fake)

    def plan(n: int, body: dict) -> str | None:
        if n == 1:  # made when asked, so the date is ahead of now
            return "status:503:" + email.utils.formatdate(time.time() + 2.0, usegmt=True)
        return {0: "status:429:1", 2: "status:429:30"}.get(n)

    fake.plan = plan
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--concurrency", "1", "--max-retries", "0",
                                  "--retry-after-max", "1.5", "--limit", "2"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    posts = [t for t, method, _, _ in fake.seen if method == "POST"]
    gaps = [b - a for a, b in zip(posts, posts[1:4])]
    assert 0.95 <= gaps[0] < 1.4, gaps  # Retry-After: 1
    assert 0.95 <= gaps[1] < 2.4, gaps  # an HTTP date 2 s ahead (whole seconds): 1 to 2 s from when it was sent
    assert 1.45 <= gaps[2] < 2.4, gaps  # Retry-After: 30, capped at 1.5
    served = _toolfid(tmp_path / "out", "base")["served"]
    assert served["rate_limited"] == 1 and served.get("server_errors", 0) == 0
    assert [s for s, _ in fake.answered_with] == [429, 503, 429]


def test_a_token_bucket_endpoint_answers_every_case_with_concurrency_16(home: Path, tmp_path: Path) -> None:
    """5 requests a second (5 at once), --concurrency 16, 24 cases per view: every case answered, none a server
    error, the default --max-retries; concurrency steps down, so the server refuses far fewer requests than it
    would at 16 in flight, and the views finish within a bound from the bucket's rate.

    Played FAST times faster: the bucket refills FAST times as fast and its Retry-After counts in 1/FAST s instead
    of whole seconds (the client reads a fractional Retry-After as it reads a whole one), so every wait, the
    schedule and the number of refusals are those of the 5-a-second server, and every time bound is divided by FAST
    (the whole-second waits: test_retry_after_in_seconds_and_as_a_date_is_waited_up_to_the_cap)."""
    fast = 2.5  # 4 left a third of the span bound unused on a loaded 2-core machine; 2.5 leaves half (10 s -> 4 s)
    rate, burst, cases = 5.0 * fast, 5, 24
    fake = Fake(bucket=TokenBucket(rate, burst, unit=1 / fast))
    url, stop = serve(fake)
    try:
        code, _, err = _main(_run(url, tmp_path / "out", "--concurrency", "16", "--limit", str(cases)))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert len(fake.answered_at) == 2 * cases, (len(fake.answered_at), fake.refused)
    for label in ("base", "ad"):
        served = _toolfid(tmp_path / "out", label)["served"]
        assert served["answers"] == cases and served["shapes"] == {"text": cases}
        assert served["server_errors"] == 0
        assert len(_samples(tmp_path / "out", label)) == cases
    # per view: the burst at once, the rest at the bucket's rate (3.8 s / FAST), plus what the waits (whole units) add
    ideal = (cases - burst) / rate
    for model in ("fake-base", "fake-ad"):
        times = [t for t, m in fake.answered_at if m == model]
        span = times[-1] - times[0]
        assert len(times) == cases and span < 2 * ideal + 3.0 / fast, (model, span, ideal)
    # 16 in flight throughout would be refused ~11 times a second (~90 in the two views); stepping down keeps it near
    # one refusal per answer at worst (measured 30-53 on a loaded 2-core machine)
    assert fake.refused < 3 * cases, fake.refused


def test_proxies_come_from_the_environment(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY points at the endpoint, --server at a port nothing listens on: every request goes through the
    proxy (absolute URLs), as it would through a corporate proxy."""
    from .served_helpers import free_port

    fake = Fake()
    proxy, stop = serve(fake)
    nowhere = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("http_proxy", proxy)
    try:
        code, _, err = _main(_run(nowhere, tmp_path / "out", "--limit", "2"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert fake.seen and all(path.startswith(nowhere + "/v1/") for _, _, path, _ in fake.seen)


def _self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 signed by itself (openssl, as on any Debian machine), and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


def test_https_checks_the_servers_certificate_against_the_trusted_ones(home: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An https endpoint with a certificate nobody trusts is refused in one line (nothing sent in the clear, no
    traceback); trusted through SSL_CERT_FILE (how a private CA is added), the run completes."""
    tls = _self_signed(tmp_path)
    fake = Fake()
    url, stop = serve(fake, tls=tls)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    try:
        assert url.startswith("https://")
        code, out, err = _main(_run(url, tmp_path / "untrusted", "--limit", "2"))
        assert code == 4 and "its certificate is not trusted" in err and "SSL_CERT_FILE" in err, (code, err[-2000:])
        assert "Traceback" not in err and len([line for line in err.splitlines() if "certificate" in line.lower()]) == 1
        assert not any(method == "POST" for _, method, _, _ in fake.seen)
        monkeypatch.setenv("SSL_CERT_FILE", tls[0])
        code, out, err = _main(_run(url, tmp_path / "trusted", "--limit", "2"))
    finally:
        stop()
    assert code == 0, err[-2000:]
    assert len(_samples(tmp_path / "trusted", "ad")) == 2


def test_model_args_name_the_key_and_runs_with_other_keys_pair(home: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """lm_eval --model toolfid-server: the base run's key from api_key_env=, the adapter run's from api_key= (a
    second key the server accepts): both pair, and neither key reaches a file or the output."""
    other = "sk-toolfid-OTHER-KEY-0c41"
    monkeypatch.setenv("BASE_RUN_KEY", KEY)
    fake = Fake(keys={KEY, other})
    url, stop = serve(fake)
    common = ["lm-eval", "--tasks", FIXTURE_TASK, "--model", "toolfid-server", "--limit", "3", "--log_samples"]
    try:
        code, out1, err1 = _main([*common, "--model_args", f"model=fake-base,base_url={url},api_key_env=BASE_RUN_KEY",
                                  "--output_path", str(tmp_path / "base")])
        assert code == 0, err1[-2000:]
        code, out2, err2 = _main([*common, "--model_args", f"model=fake-ad,base_url={url},api_key={other}",
                                  "--metadata", json.dumps({"base_model": "fake-base"}),
                                  "--output_path", str(tmp_path / "ad")])
        assert code == 0, err2[-2000:]
        monkeypatch.delenv("BASE_RUN_KEY")
        code, _, err3 = _main([*common, "--model_args", f"model=fake-base,base_url={url}",
                               "--output_path", str(tmp_path / "nokey")])
    finally:
        stop()
    assert code == 7 and "api_key_env=NAME in --model_args" in err3, err3[-2000:]
    results = json.loads(sorted((tmp_path / "ad").rglob("results_*.json"))[-1].read_text())
    assert results["configs"][FIXTURE_TASK]["metadata"]["toolfid"]["pairing"].startswith("reference store: ")
    auth = {h.get("authorization") for _, _, _, h in fake.seen}
    assert {f"Bearer {KEY}", f"Bearer {other}"} <= auth
    assert _files_holding(tmp_path, KEY, other) == []
    assert not [s for s in (KEY, other) if s in out1 + err1 + out2 + err2 + err3]


def test_a_connection_never_shows_its_secrets() -> None:
    import dataclasses

    from lm_eval_toolfid.cli.served_options import redact_argv
    from lm_eval_toolfid.serving.connection import Connection, Secret, parse_header

    conn = Connection(api_key=Secret(KEY), key_source="OPENAI_API_KEY", headers=(parse_header(f"X-G: {GATEWAY}"),))
    shown = [repr(conn), str(conn), json.dumps(dataclasses.asdict(conn), default=str), json.dumps(conn.describe())]
    assert not [s for s in shown if KEY in s or GATEWAY in s]
    assert conn.request_headers()["Authorization"] == f"Bearer {KEY}" and conn.request_headers()["X-G"] == GATEWAY
    assert conn.redact(f"bad key {KEY} via {GATEWAY}") == "bad key *** via ***"
    assert conn.http_client().trust_env  # proxies and SSL_CERT_FILE from the environment
    assert redact_argv(["--header", f"X-G: {GATEWAY}", f"--header=X-H: {GATEWAY}", "--hea", "X-I: v"]) == \
        ["--header", "X-G: <value not shown>", "--header=X-H: <value not shown>", "--hea", "X-I: <value not shown>"]
