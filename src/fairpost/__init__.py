"""fairpost: fair, quota-safe multi-tenant e-mail through Amazon SES.

What an application needs to enqueue mail is importable from here
(``from fairpost import MailClient``); the same names live in
:mod:`fairpost.mailer`. The package's parts are :mod:`fairpost.config` (the
settings), :mod:`fairpost.dispatcher` (fair claiming from per-tenant queues)
and :mod:`fairpost.mailer` (the SDK, the daemon and the operator's tools);
only the SDK is imported here, so an application needs none of the daemon's
dependencies.
"""

# The SDK's own list, so the two can never drift (tests/sdk/test_public_api.py
# checks both against the documented names).
from fairpost.mailer import *  # noqa: F403
from fairpost.mailer import __all__ as __all__

__version__ = "0.1.0"
"""This release (CHANGELOG.md; the README's "Versions and upgrades"). The one place
it is written: pyproject.toml reads it from here ([tool.hatch.version])."""
