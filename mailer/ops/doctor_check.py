"""What ``fairpost doctor`` found: one :class:`Check` per finding, and how they are told."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Check", "Verdict", "exit_code", "render_text"]

Verdict = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One finding: ``area`` (redis, sqs, ses), ``name``, the ``verdict``, what was found
    (``detail``) and, unless it passed, the ``fix``."""

    area: str
    name: str
    verdict: Verdict
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"area": self.area, "check": self.name, "verdict": self.verdict,
                "detail": self.detail, "fix": self.fix}  # fmt: skip


def exit_code(checks: list[Check]) -> int:
    return 1 if any(check.verdict == "fail" for check in checks) else 0


_MARK = {"pass": "ok  ", "warn": "WARN", "fail": "FAIL"}


def render_text(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{_MARK[check.verdict]} {check.area} {check.name}: {check.detail}")
        if check.fix and check.verdict != "pass":
            lines.append(f"     fix: {check.fix}")
    failed = sum(check.verdict == "fail" for check in checks)
    warned = sum(check.verdict == "warn" for check in checks)
    lines.append(f"{len(checks)} checks: {failed} failed, {warned} warnings")
    return "\n".join(lines)
