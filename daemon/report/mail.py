"""The report as a MIME mail, and SMTP delivery (STARTTLS, auth from a password file).

The mail is ``multipart/alternative``: a plain-text part, then a
``multipart/related`` part holding the HTML and its charts as ``cid:`` images
(mail clients block ``data:`` images more often than attachments).
"""

from __future__ import annotations

import smtplib
import ssl
from collections.abc import Sequence
from email.message import EmailMessage
from email.utils import formatdate, make_msgid
from pathlib import Path

from ..config.ops import SmtpConfig
from ..errors import B300Error, ConfigError
from ..safety.permissions import check_secret_file
from .compute import WeeklyReport
from .render import charts, render_html, render_text, title

SMTP_TIMEOUT_S = 60.0


class MailError(B300Error):
    """The SMTP server could not be reached or refused the mail.

    ``maybe_delivered`` is true when the connection broke while the message
    itself was being sent: the server may have taken it, so sending it again
    could deliver it twice. Any other failure (no connection, a refused login,
    sender or recipient, a rejected message) is safe to retry.
    """

    def __init__(self, message: str, *, maybe_delivered: bool = False) -> None:
        super().__init__(message)
        self.maybe_delivered = maybe_delivered


def report_message(report: WeeklyReport, sender: str, to: Sequence[str], *, week: str = "") -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = title(report) + (f" ({week})" if week else "")
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or "b300")
    if week:
        msg["X-B300-Week"] = week
    msg.set_content(render_text(report))
    pngs = charts(report)
    cids = {name: make_msgid(domain="b300.report") for name in pngs}
    html = render_html(report, pngs, lambda name, _png: "cid:" + cids[name][1:-1])
    msg.add_alternative(html, subtype="html")
    html_part = msg.get_body(preferencelist=("html",))
    assert html_part is not None
    for name, png in pngs.items():
        html_part.add_related(png, maintype="image", subtype="png", cid=cids[name],
                              filename=f"{name}.png")
    return msg


def alert_message(subject: str, body: str, sender: str, to: Sequence[str]) -> EmailMessage:
    msg = EmailMessage()
    msg["Subject"] = subject
    msg["From"] = sender
    msg["To"] = ", ".join(to)
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or "b300")
    msg.set_content(body)
    return msg


def _password(smtp: SmtpConfig) -> str:
    check_secret_file(smtp.password_file, "the SMTP password file")
    try:
        return Path(smtp.password_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        # The path, never the content.
        raise ConfigError(f"cannot read the SMTP password file {smtp.password_file}: "
                          f"{exc.strerror or exc}") from None


def send_mail(smtp: SmtpConfig, msg: EmailMessage, timeout: float = SMTP_TIMEOUT_S) -> None:
    """Deliver ``msg``; STARTTLS (verified against ``ca_file`` or the system CAs) before any login."""
    sending = False
    try:
        with smtplib.SMTP(smtp.host, smtp.port, timeout=timeout) as client:
            client.ehlo()
            if smtp.starttls:
                context = ssl.create_default_context(cafile=smtp.ca_file or None)
                client.starttls(context=context)
                client.ehlo()
            if smtp.user:
                client.login(smtp.user, _password(smtp))
            sending = True
            client.send_message(msg)
    except (smtplib.SMTPException, OSError) as exc:
        refused = isinstance(exc, smtplib.SMTPResponseException | smtplib.SMTPRecipientsRefused)
        raise MailError(f"mail to {smtp.host}:{smtp.port} failed: {type(exc).__name__}: "
                        f"{str(exc)[:200]}", maybe_delivered=sending and not refused) from None
