"""``fairpost doctor``: one command that checks the Redis, SQS and SES fairpost is set to use.

An operator runs it against the production settings (the same ``FAIRPOST_*`` and
``AWS_*`` variables the daemon reads). Each :class:`Check` passes, warns or fails,
says what it found and, when it is not a pass, what to do. The exit status is 1
when any check fails (a warning alone: 0), so a deployment can run it first.
The checks: :mod:`fairpost.mailer.ops.doctor_redis` (version, memory and eviction
policy, persistence, topology, the ACL of fairpost's user) and
:mod:`fairpost.mailer.ops.doctor_aws` (the SQS queue, the SES account).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Literal

from fairpost.config import Settings

__all__ = ["Check", "Verdict", "add_parser", "exit_code", "render_text", "run_checks"]

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


def run_checks(settings: Settings, *, aws: bool = True) -> list[Check]:
    """Every check, Redis first; ``aws=False``: Redis alone."""
    from fairpost.mailer.ops.doctor_redis import redis_checks

    checks = redis_checks(settings)
    if aws:
        from fairpost.mailer.ops.doctor_aws import aws_checks

        checks += aws_checks(settings)
    return checks


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


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from fairpost.mailer.ops.console import print_json

    checks = run_checks(settings, aws=not args.redis_only)
    if args.json:
        print_json({"ok": exit_code(checks) == 0, "checks": [check.to_json() for check in checks]})
    else:
        print(render_text(checks))
    return exit_code(checks)


def add_parser(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="check Redis, SQS and SES as the settings name them; exit 1 if a check fails",
        description="Check what fairpost runs on: Redis (version, eviction policy and memory, persistence, "
        "topology, the ACL of its user), the SQS queue and the SES account. Each check passes, warns "
        'or fails, with the fix (docs/operations.md, "fairpost doctor").',
    )
    doctor.add_argument("--json", action="store_true")
    doctor.add_argument("--redis-only", action="store_true", help="check Redis alone (no AWS)")
    doctor.set_defaults(handler=cmd_doctor)
