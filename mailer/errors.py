"""Errors the SDK and the sender raise. All derive from :class:`FairpostError`."""

from __future__ import annotations

from config.errors import ConfigError, FairpostError
from dispatcher.errors import UnknownJob


class InvalidMail(FairpostError):
    """The mail breaks a rule; nothing was written."""

    caller_fault = True

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")


__all__ = ["ConfigError", "FairpostError", "InvalidMail", "UnknownJob"]
