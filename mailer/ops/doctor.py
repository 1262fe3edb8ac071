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
from typing import Any

from fairpost.config import Settings
from fairpost.config.pools import pool_names
from fairpost.mailer.ops.console import print_json
from fairpost.mailer.ops.doctor_aws import aws_checks
from fairpost.mailer.ops.doctor_check import Check, exit_code, render_text
from fairpost.mailer.ops.doctor_redis import redis_checks

__all__ = ["add_parser", "run_checks"]


def run_checks(settings: Settings, *, aws: bool = True) -> list[Check]:
    """Every check, Redis first; ``aws=False``: Redis alone."""
    checks = redis_checks(settings)
    if aws:
        for pool in pool_names(settings):
            checks += aws_checks(settings, pool)
    return checks


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
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
