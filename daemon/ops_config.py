"""Config sections for operating the daemon: ``[report]``, ``[metrics]``, ``[alerts]``.

::

    [report]                             # the weekly report mail; leave out to disable
    to = ["hpc-platform@example.com"]
    from = "b300d@login01.example.com"
    smtp_host = "smtp.example.com"
    smtp_port = 587
    smtp_user = "b300"                   # optional; with password_file
    password_file = "/etc/b300/smtp.pass"  # read at send time; never in the config or logs
    ca_file = ""                         # CA bundle for STARTTLS (default: the system's)
    starttls = true
    day = "mon"                          # mon..sun
    hour = 8                             # 0..23, in `timezone`
    timezone = "Europe/Paris"            # the cluster's time zone (IANA name)

    [metrics]
    listen = "127.0.0.1:9300"            # Prometheus text endpoint; "" disables it

    [alerts]
    mail_to = ["oncall@example.com"]     # uses [report]'s SMTP settings
    webhook_url = "https://hooks.example.com/b300"
    drained_burst = 3                    # alert when this many nodes drain within 10 min
    scan_interval = "20s"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import ConfigError
from .validate import get_bool, get_int, get_str, parse_duration, reject_unknown

_MAIL = re.compile(r"[^@\s<>,;\"']+@[A-Za-z0-9.-]+")
_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}|\[[0-9A-Fa-f:.]+\]")
_ABS = re.compile(r"/[^\x00\n]*")
_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@dataclass(frozen=True, slots=True)
class SmtpConfig:
    host: str
    port: int = 587
    user: str = ""
    password_file: str = ""
    starttls: bool = True
    sender: str = "b300d@localhost"
    ca_file: str = ""                    # CA bundle for STARTTLS (default: the system's)


@dataclass(frozen=True, slots=True)
class ReportConfig:
    """[report]: the weekly report mail (``enabled`` False without a ``to``)."""

    to: tuple[str, ...] = ()
    smtp: SmtpConfig | None = None
    day: str = "mon"
    hour: int = 8
    timezone: str = "UTC"

    @property
    def enabled(self) -> bool:
        return bool(self.to) and self.smtp is not None


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    host: str = ""
    port: int = 0

    @property
    def enabled(self) -> bool:
        return bool(self.host)


@dataclass(frozen=True, slots=True)
class AlertsConfig:
    mail_to: tuple[str, ...] = ()
    webhook_url: str = ""
    drained_burst: int = 3
    scan_interval_s: float = 20.0

    @property
    def enabled(self) -> bool:
        return bool(self.mail_to or self.webhook_url)


def _addresses(table: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and _MAIL.fullmatch(v) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of mail addresses, got {value!r:.60}")
    return tuple(value)


def parse_report_config(table: Mapping[str, Any], where: str) -> ReportConfig:
    reject_unknown(table, {"to", "from", "smtp_host", "smtp_port", "smtp_user", "password_file",
                           "ca_file", "starttls", "day", "hour", "timezone"}, where, ConfigError)
    to = _addresses(table, "to", where)
    host = get_str(table, "smtp_host", where, ConfigError, default="", pattern=re.compile(
        f"|{_HOST.pattern}"), what="a host name") or ""
    if to and not host:
        raise ConfigError(f"{where}: smtp_host is required when 'to' is set")
    smtp = None
    if host:
        smtp = parse_smtp(table, host, where)
    day = (get_str(table, "day", where, ConfigError, default="mon") or "mon").lower()[:3]
    if day not in _DAYS:
        raise ConfigError(f"{where}: day must be one of {', '.join(_DAYS)}, got {table.get('day')!r}")
    tz = get_str(table, "timezone", where, ConfigError, default="UTC") or "UTC"
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{where}: timezone {tz!r} is not a known IANA time zone") from None
    return ReportConfig(to=to, smtp=smtp, day=day,
                        hour=get_int(table, "hour", where, ConfigError, default=8, lo=0, hi=23) or 0,
                        timezone=tz)


def parse_smtp(table: Mapping[str, Any], host: str, where: str) -> SmtpConfig:
    sender = get_str(table, "from", where, ConfigError, default="b300d@localhost",
                     pattern=_MAIL, what="a mail address") or "b300d@localhost"
    user = get_str(table, "smtp_user", where, ConfigError, default="") or ""
    password_file = get_str(table, "password_file", where, ConfigError, default="", pattern=re.compile(
        f"|{_ABS.pattern}"), what="an absolute path") or ""
    if user and not password_file:
        raise ConfigError(f"{where}: smtp_user needs password_file (the password is never in the config)")
    return SmtpConfig(
        host=host,
        port=get_int(table, "smtp_port", where, ConfigError, default=587, lo=1, hi=65535) or 587,
        user=user, password_file=password_file,
        starttls=get_bool(table, "starttls", where, ConfigError, default=True), sender=sender,
        ca_file=get_str(table, "ca_file", where, ConfigError, default="", pattern=re.compile(
            f"|{_ABS.pattern}"), what="an absolute path") or "")


def parse_metrics_config(table: Mapping[str, Any], where: str) -> MetricsConfig:
    reject_unknown(table, {"listen"}, where, ConfigError)
    listen = get_str(table, "listen", where, ConfigError, default="") or ""
    if not listen:
        return MetricsConfig()
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536 or not _HOST.fullmatch(host):
        raise ConfigError(f"{where}: listen must be HOST:PORT (e.g. 127.0.0.1:9300), got {listen!r}")
    return MetricsConfig(host=host.strip("[]"), port=int(port))


def parse_alerts_config(table: Mapping[str, Any], where: str) -> AlertsConfig:
    reject_unknown(table, {"mail_to", "webhook_url", "drained_burst", "scan_interval"}, where,
                   ConfigError)
    url = get_str(table, "webhook_url", where, ConfigError, default="") or ""
    if url:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c in url for c in " \n\r"):
            raise ConfigError(f"{where}: webhook_url must be an http(s) URL, got {url!r:.80}")
    scan = parse_duration(table.get("scan_interval", 20), "scan_interval", where, ConfigError)
    if scan > 60:
        raise ConfigError(f"{where}: scan_interval must be at most 60 s (alerts within a minute)")
    return AlertsConfig(
        mail_to=_addresses(table, "mail_to", where), webhook_url=url,
        drained_burst=get_int(table, "drained_burst", where, ConfigError, default=3, lo=1,
                              hi=100000) or 3,
        scan_interval_s=scan)
