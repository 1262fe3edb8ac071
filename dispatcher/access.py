"""Redis refusing fairpost's credentials or a command: a configuration error, never an outage.

redis-py raises a wrong password (``WRONGPASS``) and a missing one (``NOAUTH``)
as an ``AuthenticationError``, which is a ``ConnectionError``: to a retry loop
it looks like Redis being away. It is not: the settings are wrong, and trying
again for ``FAIRPOST_REDIS_RETRY_SECONDS`` (or a daemon's
``FAIRPOST_MAX_OUTAGE_SECONDS``) only hides the cause. A command the Redis
user may not run (``NOPERM``, its ACL) is the same kind of fault. Every retry
loop asks :func:`refusal` first, and the SDK and the command line raise
:func:`access_denied`'s error, which names the setting to fix and never the
secret (redis-py's own text carries no password; it is masked all the same).
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError

from fairpost.config import Settings
from fairpost.dispatcher.errors import RedisAccessDenied

__all__ = ["ACL_DOCS", "access_denied", "refusal"]

ACL_DOCS = 'docs/operations.md, "Redis in production"'
"""Where the ACL fairpost's Redis user needs is written down."""


def refusal(exc: BaseException) -> str | None:
    """Redis's code for a refused credential or command (``WRONGPASS``, ``NOAUTH``,
    ``NOPERM``); None for any other error."""
    if isinstance(exc, NoPermissionError):
        return "NOPERM"
    if isinstance(exc, AuthenticationError | AuthorizationError):
        text = str(exc).lower()
        # The parser strips the code; what is left says which it was.
        needed = "authentication required" in text or "already authenticated" in text
        return "NOAUTH" if needed else "WRONGPASS"
    return None


def access_denied(exc: BaseException, settings: Settings) -> RedisAccessDenied | None:
    """The configuration error ``exc`` stands for, or None if it is no refusal."""
    code = refusal(exc)
    if code is None:
        return None
    detail = _masked(str(exc), settings)
    setting = credential_setting(settings)
    if code == "NOPERM":
        rule = (
            f"the Redis user it names may not run a command fairpost needs (NOPERM: {detail}): "
            f"grant the ACL of {ACL_DOCS} (`fairpost doctor` lists what is missing)"
        )
    elif settings.redis_iam is not None:
        rule = (
            f"Redis refused the IAM token of user {settings.redis_iam.user} ({code}: {detail}): check that "
            "the user is IAM-enabled, FAIRPOST_REDIS_IAM__CACHE_NAME, __SERVICE and __REGION name the "
            "cache, and the role may elasticache:Connect (memorydb:Connect) on both"
        )
    elif code == "NOAUTH":
        rule = (
            "Redis asks for a password and none was given (NOAUTH): "
            "set the user and password there (redis://USER:PASSWORD@HOST:PORT/0)"
        )
    else:
        rule = (
            f"Redis refused its user and password (WRONGPASS: {detail}): "
            "set the right ones there, or enable the user (ACL SETUSER ... on)"
        )
    if settings.redis_sentinel_password is not None and code != "NOPERM":
        rule += "; or the sentinels refused FAIRPOST_REDIS_SENTINEL_PASSWORD"
    return RedisAccessDenied(code, setting, rule)


def credential_setting(settings: Settings) -> str:
    """The variable that holds the credentials Redis checks."""
    return "FAIRPOST_REDIS_URL" if settings.redis_iam is None else "FAIRPOST_REDIS_IAM__USER"


def _masked(text: str, settings: Settings) -> str:
    for secret in (urlsplit(settings.redis_url).password, _sentinel_password(settings)):
        if secret:
            text = text.replace(secret, "***").replace(unquote(secret), "***")
    return text


def _sentinel_password(settings: Settings) -> str | None:
    password = settings.redis_sentinel_password
    return None if password is None else password.get_secret_value()
