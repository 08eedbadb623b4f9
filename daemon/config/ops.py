"""Records of the sections for operating the daemon: ``[report]``, ``[metrics]``, ``[alerts]``.

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

The tables' grammar is :mod:`b300.config.tables.ops`.
"""

from __future__ import annotations

from dataclasses import dataclass


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
