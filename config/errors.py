"""The root of fairpost's exceptions, and the configuration error.

Every error fairpost raises on purpose derives from :class:`FairpostError`;
each package keeps its own in one ``errors`` module (this one,
:mod:`fairpost.dispatcher.errors`, :mod:`fairpost.mailer.errors`). A class's docstring is its
default message. Wrong arguments to a function (a bug in the calling code,
not bad data) raise ``ValueError`` or ``TypeError``, as Python does.

This package's part of the tree::

    FairpostError
    └── ConfigError
"""

from __future__ import annotations

__all__ = ["ConfigError", "FairpostError"]


class FairpostError(Exception):
    """fairpost failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(FairpostError):
    """The settings are invalid: ``problems`` lists each variable and its rule."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        lines = [f"{name}: {rule}" for name, rule in problems]
        super().__init__("invalid settings:\n  " + "\n  ".join(lines))
