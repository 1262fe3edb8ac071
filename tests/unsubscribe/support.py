"""What the unsubscribe tests share: settings with token keys, and the tokens a mail carries."""

from __future__ import annotations

import time
from typing import Any

from fairpost.config import Settings
from fairpost.mailer.sdk.unsub_token import Token, verify
from fairpost.mailer.testing.ses_mail import SentMail
from tests.support.pipeline import quick_settings

KEY = "k" * 40
BASE = "https://unsub.example.com"
MAILTO_DOMAIN = "unsub.example.com"


def unsubscribe_settings(redis_url: str, **overrides: Any) -> Settings:
    section = {"keys": [KEY], "base_url": BASE, "mailto_domain": MAILTO_DOMAIN, "rate_per_minute": 1000}
    return quick_settings(redis_url, unsubscribe=section, **overrides)


def link_token(mail: SentMail) -> str:
    """The token of the https link in the mail's List-Unsubscribe, as SES received it."""
    value = mail.header("List-Unsubscribe")
    assert value is not None, mail.headers
    https = value.split(",")[0].strip()
    assert https.startswith(f"<{BASE}/u/") and https.endswith(">"), value
    return https[len(BASE) + 4 : -1]


def token_of(mail: SentMail) -> Token:
    return verify(link_token(mail), [KEY.encode()], time.time())
