"""The mailbox providers fairpost names in its deliverability rollups, and how a
recipient's domain is told to be theirs: by the domain itself (``gmail.com``), or
by the hosts its MX records name (``aspmx.l.google.com`` for a Google Workspace
domain, ``*.mail.protection.outlook.com`` for Microsoft 365).

Static data, beside the settings that choose among it
(``FAIRPOST_DELIVERABILITY__PROVIDERS``); the lookups live in
``mailer/daemon/mx.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OTHER", "PROVIDERS", "Provider", "by_domain", "by_mx", "known"]

OTHER = "other"
"""Every recipient whose provider is not named."""


@dataclass(frozen=True)
class Provider:
    name: str
    domains: frozenset[str]
    """The provider's own mail domains (the recipient's domain, lower case)."""
    mx_suffixes: tuple[str, ...]
    """An MX host ending in one of these is the provider's (a hosted custom domain)."""
    complaint_reports: bool = True
    """Whether it sends per-message complaint reports (a feedback loop SES relays).
    Gmail does not: its complaint rate is "no data", never 0 %."""


PROVIDERS: tuple[Provider, ...] = (
    Provider(
        "gmail",
        frozenset({"gmail.com", "googlemail.com"}),
        (".google.com", ".googlemail.com"),
        complaint_reports=False,
    ),
    Provider(
        "outlook",
        frozenset({"outlook.com", "hotmail.com", "live.com", "msn.com", "hotmail.co.uk", "outlook.fr"}),
        (".outlook.com", ".hotmail.com"),
    ),
    Provider(
        "yahoo",
        frozenset({"yahoo.com", "ymail.com", "rocketmail.com", "aol.com", "yahoo.co.uk", "yahoo.fr"}),
        (".yahoodns.net", ".yahoo.com", ".aol.com"),
    ),
    Provider("icloud", frozenset({"icloud.com", "me.com", "mac.com"}), (".icloud.com", ".apple.com")),
    Provider("proton", frozenset({"proton.me", "protonmail.com", "pm.me"}), (".protonmail.ch",)),
    Provider(
        "gmx", frozenset({"gmx.de", "gmx.net", "gmx.com", "web.de", "mail.com"}), (".gmx.net", ".web.de")
    ),
    Provider("yandex", frozenset({"yandex.ru", "yandex.com", "ya.ru"}), (".yandex.net", ".yandex.ru")),
    Provider("zoho", frozenset({"zoho.com", "zohomail.com"}), (".zoho.com", ".zoho.eu")),
)
"""The big providers, the largest first."""

_BY_NAME = {p.name: p for p in PROVIDERS}


def known(name: str) -> Provider | None:
    return _BY_NAME.get(name)


def by_domain(domain: str, named: frozenset[str]) -> str | None:
    """The provider whose own domain this is, if it is among ``named``; None otherwise."""
    domain = domain.lower().rstrip(".")
    for p in PROVIDERS:
        if p.name in named and domain in p.domains:
            return p.name
    return None


def by_mx(hosts: list[str], named: frozenset[str]) -> str | None:
    """The provider the MX hosts belong to (the first host that is one's), if named."""
    for host in hosts:
        host = "." + host.lower().rstrip(".")
        for p in PROVIDERS:
            if p.name in named and host.endswith(p.mx_suffixes):
                return p.name
    return None
