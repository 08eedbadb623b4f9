"""The ``[report]``, ``[metrics]`` and ``[alerts]`` tables (records: :mod:`b300.config.ops`)."""

from __future__ import annotations

import re
from typing import Annotated
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from ...grammar.duration import short_repr
from ...grammar.types import (
    HOST,
    AbsPathOrEmpty,
    Duration,
    MailAddress,
    MailAddresses,
    Port,
    Table,
    Text,
    blank_means,
    expected,
    limited,
    matches,
    problem,
)
from ..ops import AlertsConfig, MetricsConfig, ReportConfig, SmtpConfig

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HOST = re.compile(HOST)


def _day(value: object) -> str:
    """``mon`` .. ``sun``; a longer name or capitals are fine (``Monday``), ``""`` is ``mon``."""
    if not isinstance(value, str):
        raise expected("a string")
    day = value.lower()[:3] or "mon"
    if day not in _DAYS:
        raise problem(f"must be one of {', '.join(_DAYS)}, got {short_repr(value)}")
    return day


def _timezone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a folder such as "Europe"
        raise problem(f"{short_repr(value)} is not a known IANA time zone") from None
    return value


class ReportTable(Table):
    #: Recipients of the weekly report (one address or a list); empty: no mail.
    to: MailAddresses = Field(default_factory=list)
    #: The From address.
    sender: MailAddress = Field(default="b300d@localhost", alias="from")
    #: SMTP server; required when to or [alerts] mail_to is set.
    smtp_host: Annotated[str, matches(HOST, "a host name", empty=True)] = ""
    #: SMTP port.
    smtp_port: Port = 587
    #: Login name; needs password_file.
    smtp_user: Text = ""
    #: File holding the SMTP password (read at send time; mode 640 root:b300); the password is never
    #: in the config.
    password_file: AbsPathOrEmpty = ""
    #: CA bundle for STARTTLS (default: the system's).
    ca_file: AbsPathOrEmpty = ""
    #: STARTTLS before the login.
    starttls: bool = True
    #: Weekday the report is sent (mon .. sun).
    day: Annotated[str, PlainValidator(_day)] = "mon"
    #: Hour of day the report is sent, in timezone.
    hour: Annotated[int, Field(ge=0, le=23)] = 8
    #: The cluster's IANA time zone, for the report's schedule.
    timezone: Annotated[Text, blank_means("UTC"), AfterValidator(_timezone)] = "UTC"

    @model_validator(mode="after")
    def _smtp_complete(self) -> ReportTable:
        if self.to and not self.smtp_host:
            raise problem("smtp_host is required when 'to' is set")
        if self.smtp_user and not self.password_file:
            raise problem("smtp_user needs password_file (the password is never in the config)")
        return self


def _listen(value: object) -> tuple[str, int] | None:
    if not isinstance(value, str):
        raise expected("a string")
    if not value:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or not _HOST.fullmatch(host):
        raise problem(f"must be HOST:PORT (e.g. 127.0.0.1:9300), got {short_repr(value)}")
    return host.strip("[]"), int(port)


class MetricsTable(Table):
    #: HOST:PORT of the Prometheus endpoint GET /metrics (e.g. 127.0.0.1:9300 or [::1]:9300); "" or
    #: absent: no endpoint.
    listen: Annotated[tuple[str, int] | None, PlainValidator(_listen)] = None  # "": no endpoint


def _webhook(url: str) -> str:
    if not url:
        return url
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # e.g. a bad IPv6 literal
        ok = False
    if not ok or any(c in url for c in " \n\r"):
        raise problem(f"must be an http(s) URL, got {short_repr(url, 80)}")
    return url


class AlertsTable(Table):
    #: Alert recipients, sent with [report]'s SMTP settings.
    mail_to: MailAddresses = Field(default_factory=list)
    #: An http(s) URL that gets each alert as a JSON POST.
    webhook_url: Annotated[Text, AfterValidator(_webhook)] = ""
    #: Alert when this many nodes are drained within 10 minutes.
    drained_burst: Annotated[int, Field(ge=1, le=100000)] = 3
    #: How often the event log is scanned for alerts (at most 60 s).
    scan_interval: Annotated[Duration, limited(lambda s: s <= 60, "at most 60 s (alerts within a minute)")] = (
        20.0)


def report_config(t: ReportTable) -> ReportConfig:
    smtp = None
    if t.smtp_host:
        smtp = SmtpConfig(host=t.smtp_host, port=t.smtp_port, user=t.smtp_user, password_file=t.password_file,
                          starttls=t.starttls, sender=t.sender, ca_file=t.ca_file)
    return ReportConfig(to=tuple(t.to), smtp=smtp, day=t.day, hour=t.hour, timezone=t.timezone)


def metrics_config(t: MetricsTable) -> MetricsConfig:
    return MetricsConfig() if t.listen is None else MetricsConfig(host=t.listen[0], port=t.listen[1])


def alerts_config(t: AlertsTable) -> AlertsConfig:
    return AlertsConfig(mail_to=tuple(t.mail_to), webhook_url=t.webhook_url, drained_burst=t.drained_burst,
                        scan_interval_s=t.scan_interval)
