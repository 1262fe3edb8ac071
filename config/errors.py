"""The root of fairpost's exceptions, and the configuration error.

Every error fairpost raises on purpose derives from :class:`FairpostError`.
Each class carries facts a caller can act on: ``retriable`` says whether the
same call may succeed later, ``caller_fault`` whether the input was wrong.
The class docstring is the default message.
"""

from __future__ import annotations


class FairpostError(Exception):
    """fairpost failed."""

    retriable: bool = False
    caller_fault: bool = False

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConfigError(FairpostError):
    """The settings are invalid."""

    caller_fault = True

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        lines = [f"{name}: {rule}" for name, rule in problems]
        super().__init__("invalid settings:\n  " + "\n  ".join(lines))
