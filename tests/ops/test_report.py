"""The weekly report: figures from a synthetic history, mailed to a real SMTP server
(aiosmtpd with STARTTLS and AUTH), parsed back as MIME; the HTML rendered by Chromium."""

from __future__ import annotations

import base64
import datetime as dt
import email
import email.policy
import json
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from report_history import W0, W1, Expected, build_history

from b300.config.ops import ReportConfig, SmtpConfig
from b300.report.collect import collect_report
from b300.report.compute import Window
from b300.report.weekly import (
    catch_up_weekly_report,
    report_jobs,
    report_window,
    send_weekly_report,
)
from b300.scheduling import table as timed
from b300.store import SqlStore, open_store
from helpers import REPO

ARTIFACTS = REPO / "artifacts"


class _Inbox:
    def __init__(self) -> None:
        self.messages: list[bytes] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(envelope.original_content or envelope.content)
        return "250 OK"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "smtp.crt", tmp / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def smtp_server(tmp_path: Path) -> Iterator[tuple[_Inbox, SmtpConfig]]:
    """A real SMTP server on 127.0.0.1 that requires STARTTLS before AUTH (user b300)."""
    cert, key = _self_signed(tmp_path)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    inbox = _Inbox()

    def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
        ok = (isinstance(auth_data, LoginPassword)
              and (auth_data.login, auth_data.password) == (b"b300", b"s3cret"))
        return AuthResult(success=ok)

    port = _free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port, tls_context=tls, require_starttls=True,
                            authenticator=authenticator, auth_required=True, auth_require_tls=True)
    controller.start()
    password = tmp_path / "smtp.pass"
    password.write_text("s3cret\n")
    password.chmod(0o600)  # b300d refuses a password file others can read
    try:
        yield inbox, SmtpConfig(host="127.0.0.1", port=port, user="b300", password_file=str(password),
                                starttls=True, sender="b300d@login01.test", ca_file=str(cert))
    finally:
        controller.stop()


@pytest.fixture
def history(tmp_path: Path) -> Iterator[tuple[SqlStore, Expected, str]]:
    url = f"sqlite:///{tmp_path / 'state' / 'state.db'}"
    with open_store(url) as store:
        yield store, build_history(store), url


def _table_rows(text: str, header: str) -> list[list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def _check_figures(text: str, expected: Expected) -> None:
    """The plain-text part's figures against the ones stated by hand in report_history."""
    rows = {r[0]: r for r in _table_rows(text, "run ")}
    assert set(rows) == {"run-a", "run-b", "run-c"}
    for run, r in rows.items():
        _, _name, _state, _att, wall, train, ettr, detect, queue, restart, recompute, _other = r
        assert wall == f"{expected.wall_h[run]:.1f}"
        assert train == f"{expected.training_h[run]:.1f}"
        assert ettr == f"{100 * expected.training_h[run] / expected.wall_h[run]:.1f}%"
        assert detect == f"{expected.detect_h[run]:.1f}"
        assert queue == f"{expected.queue_h[run]:.1f}"
        assert restart == f"{expected.restart_h[run]:.1f}"
        want = expected.recompute_h[run]
        assert recompute == ("unknown" if want is None else f"{want:.1f}")
    causes = {r[0]: int(r[1]) for r in _table_rows(text, "cause ") if r[0] != "total"}
    assert causes == expected.causes
    assert f"Jobs: {expected.jobs}, GPU-hours: {expected.gpu_hours:.1f}" in text
    assert f"Nodes drained: {expected.drained}, returned: {expected.returned}" in text
    assert "Drift findings opened: 1" in text and "nccl: 1" in text
    assert "recompute time unknown" in text  # run-b and run-c resumed without progress events


def test_figures_equal_the_timeline(history: tuple[SqlStore, Expected, str]) -> None:
    store, expected, _ = history
    report = collect_report(store, Window(W0, W1), W1)
    runs = {r.run_id: r for r in report.runs}
    for run, r in runs.items():
        assert r.wall_s / 3600 == pytest.approx(expected.wall_h[run])
        assert r.training_s / 3600 == pytest.approx(expected.training_h[run])
        assert r.detect_s / 3600 == pytest.approx(expected.detect_h[run])
        assert r.queue_s / 3600 == pytest.approx(expected.queue_h[run])
        assert r.restart_s / 3600 == pytest.approx(expected.restart_h[run])
        want = expected.recompute_h[run]
        assert (r.recompute_s is None) if want is None else r.recompute_s / 3600 == pytest.approx(want)
    assert report.by_cause == expected.causes
    assert report.jobs == expected.jobs
    assert report.gpu_hours == pytest.approx(expected.gpu_hours)
    assert report.checkpoints is not None
    (ckpt,) = report.checkpoints  # only run-a checkpoints, and it still runs
    assert (ckpt.run_id, ckpt.newest_step, ckpt.count, ckpt.stored_bytes) == (
        "run-a", expected.ckpt_newest_step, 3, expected.ckpt_bytes)
    assert ckpt.newest_age_s == pytest.approx(expected.ckpt_age_h_at_w1 * 3600)
    assert ckpt.overdue  # 1.5 h against a 1 h interval
    assert ckpt.replication_lag_s == pytest.approx(expected.ckpt_lag_h_at_w1 * 3600)


def _png_ok(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100
    return width, height


def test_weekly_report_mailed_once_over_starttls(history: tuple[SqlStore, Expected, str],
                                                 smtp_server: tuple[_Inbox, SmtpConfig]) -> None:
    store, expected, _ = history
    inbox, smtp = smtp_server
    cfg = ReportConfig(to=("platform@example.test",), smtp=smtp, day="mon", hour=0, timezone="UTC")
    monday = W1 + dt.timedelta(hours=1)
    assert report_window(monday, cfg) == Window(W0, W1)
    assert send_weekly_report(store, cfg, monday) == "sent"
    # A restart (or a second trigger) the same week sends nothing more.
    assert send_weekly_report(store, cfg, monday + dt.timedelta(minutes=5)) == "already-sent"
    assert len(inbox.messages) == 1

    msg = email.message_from_bytes(inbox.messages[0], policy=email.policy.default)
    assert isinstance(msg, EmailMessage)
    assert msg.get_content_type() == "multipart/alternative"
    assert msg["X-B300-Week"] == "2026-W47"
    text = msg.get_body(preferencelist=("plain",))
    html = msg.get_body(preferencelist=("html",))
    assert text is not None and html is not None
    _check_figures(text.get_content(), expected)
    # Checkpoints an hour after the window: newest 2.5 h old, 120 GB, 2.5 h not replicated;
    # no Young/Daly ("-": no save time was measured for these), and the line saying why.
    assert re.search(r"^run-a\s+1100\s+2\.5\s+1\.0\s+-\s+yes\s+120\.0\s+3\s+2\.5\s*$", text.get_content(), re.M)
    assert "run-a: Young/Daly: no advice yet (no checkpoint save time measured)" in text.get_content()
    related = [p for p in msg.walk() if p.get_content_type() == "multipart/related"]
    assert len(related) == 1
    images = {p["Content-ID"].strip("<>"): p.get_content() for p in related[0].walk()
              if p.get_content_type() == "image/png"}
    cids = re.findall(r'src="cid:([^"]+)"', html.get_content())
    assert len(cids) == 2 and set(cids) == set(images)
    for png in images.values():
        _png_ok(png)

    sent = [e.kind for e in store.events(kinds=["report.sending", "report.sent"])]
    assert sent == ["report.sending", "report.sent"]


def test_an_unconfirmed_send_is_not_repeated(history: tuple[SqlStore, Expected, str],
                                             smtp_server: tuple[_Inbox, SmtpConfig]) -> None:
    from b300.interfaces import NewEvent

    store, _, _ = history
    inbox, smtp = smtp_server
    cfg = ReportConfig(to=("platform@example.test",), smtp=smtp, day="mon", hour=0, timezone="UTC")
    # The daemon died after recording its intent for this week, before report.sent.
    store.append_events([NewEvent("report.sending", data={"week": "2026-W47"})], W1)
    assert send_weekly_report(store, cfg, W1 + dt.timedelta(hours=1)) == "unconfirmed"
    assert inbox.messages == []


class _Refusing:
    """An SMTP server that refuses every recipient (a policy block, a full mailbox)."""

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str,
                          rcpt_options: Any) -> str:
        return "550 5.7.1 relaying denied"


def test_smtp_down_then_refusing_then_back_is_retried_and_sent_once(
        history: tuple[SqlStore, Expected, str]) -> None:
    """Real SMTP outages: nothing listening, then a server refusing the recipient, then a
    working server. Each failure is recorded as safe to retry; the catch-up job sends the
    week's report when the server works, exactly once."""
    store, _, _ = history
    port = _free_port()
    smtp = SmtpConfig(host="127.0.0.1", port=port, starttls=False, sender="b300d@login01.test")
    cfg = ReportConfig(to=("platform@example.test",), smtp=smtp, day="mon", hour=0, timezone="UTC")
    monday = W1 + dt.timedelta(hours=1)

    assert send_weekly_report(store, cfg, monday) == "failed"  # connection refused
    refusing = Controller(_Refusing(), hostname="127.0.0.1", port=port)
    refusing.start()
    try:
        assert catch_up_weekly_report(store, cfg, monday + dt.timedelta(minutes=10)) == "failed"
    finally:
        refusing.stop()
    inbox = _Inbox()
    working = Controller(inbox, hostname="127.0.0.1", port=port)
    working.start()
    try:
        assert catch_up_weekly_report(store, cfg, monday + dt.timedelta(minutes=20)) == "sent"
        assert catch_up_weekly_report(store, cfg, monday + dt.timedelta(minutes=30)) == "nothing-to-do"
        assert send_weekly_report(store, cfg, monday + dt.timedelta(minutes=40)) == "already-sent"
    finally:
        working.stop()
    assert len(inbox.messages) == 1
    failed = [e.data for e in store.events(kinds=["report.failed"])]
    assert [f["retry"] for f in failed] == [True, True]
    assert "ConnectionRefusedError" in str(failed[0]["error"]) and "550" in str(failed[1]["error"])


def test_a_missed_week_is_caught_up_within_a_day_only(history: tuple[SqlStore, Expected, str]) -> None:
    store, _, _ = history
    smtp = SmtpConfig(host="127.0.0.1", port=_free_port(), starttls=False)
    cfg = ReportConfig(to=("platform@example.test",), smtp=smtp, day="mon", hour=0, timezone="UTC")
    # The daemon was down at Monday 00:00 and starts again on Wednesday: too late to mail.
    assert catch_up_weekly_report(store, cfg, W1 + dt.timedelta(days=2)) == "nothing-to-do"
    assert store.events(kinds=["report.sending"]) == []
    # Started again on Monday at 05:00: the week is caught up (here: the server is down).
    assert catch_up_weekly_report(store, cfg, W1 + dt.timedelta(hours=5)) == "failed"


def test_the_report_job_fires_in_the_cluster_time_zone(history: tuple[SqlStore, Expected, str]) -> None:
    from apscheduler.schedulers.background import BackgroundScheduler

    store, _, _ = history
    cfg = ReportConfig(to=("a@example.test",), smtp=SmtpConfig(host="127.0.0.1"), day="mon", hour=8,
                       timezone="Asia/Tokyo")
    scheduler = BackgroundScheduler(timezone=dt.UTC)
    timed.place(scheduler, report_jobs(store, lambda: cfg, lambda: dt.datetime.now(dt.UTC)))
    job = scheduler.get_job("weekly-report")
    fire = job.trigger.get_next_fire_time(None, dt.datetime(2026, 11, 22, 12, tzinfo=dt.UTC))
    # Monday 08:00 in Tokyo is Sunday 23:00 UTC.
    assert fire.astimezone(dt.UTC) == dt.datetime(2026, 11, 22, 23, tzinfo=dt.UTC)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _png_pixels_vary(data: bytes) -> bool:
    """Decode enough of a PNG (8-bit RGB/RGBA, non-interlaced) to see that its pixels differ."""
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, _height, depth, color, _c, _f, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0
    raw = zlib.decompress(idat)
    stride = width * (3 if color == 2 else 4) + 1
    # Filter bytes aside, a uniform image compresses rows to identical bytes.
    rows = {raw[i + 1:i + stride] for i in range(0, len(raw), stride)}
    return len(rows) > 10


def test_html_report_renders_in_chromium(history: tuple[SqlStore, Expected, str], tmp_path: Path) -> None:
    _, _, url = history
    cfg = tmp_path / "b300.toml"
    cfg.write_text(f'[daemon]\nstate_dir = "{tmp_path / "state"}"\ndatabase_url = "{url}"\n')
    out = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "b300.ctl", "--config", str(cfg), "report", "--since",
                           W0.isoformat(), "--until", W1.isoformat(), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(images) == 2
    for b64 in images:
        _png_ok(base64.b64decode(b64))
    as_json = subprocess.run([sys.executable, "-m", "b300.ctl", "--config", str(cfg), "report", "--since",
                              W0.isoformat(), "--until", W1.isoformat(), "--format", "json"],
                             capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(as_json.stdout)["jobs"] == 8

    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (deploy/install-deps.sh installs it): screenshot not checked")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    shot.unlink(missing_ok=True)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--no-first-run",
                    "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium'}",
                    f"--screenshot={shot}", "--window-size=1200,2000", "--hide-scrollbars",
                    out.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists(), "chromium wrote no screenshot"
    data = shot.read_bytes()
    assert _png_ok(data) == (1200, 2000)
    assert len(data) > 20_000  # text, tables and two charts, not a blank page
    assert _png_pixels_vary(data)
