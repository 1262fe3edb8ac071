"""The faults a test injects into :class:`~fairpost.mailer.testing.ses_server.SesServer`.

An outage (:meth:`SesFaults.go_down`), queued faults (:meth:`SesFaults.fail_next`),
rules on the parsed mail (:meth:`SesFaults.fail_when`) and a paused account
(:meth:`SesFaults.pause`): the state they set, under the recorder's lock, and
the rule that matches a mail. The server decides in which order they answer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fairpost.mailer.testing.ses_mail import Faults, SentMail, SesError
from fairpost.mailer.testing.ses_record import SesRecorder

__all__ = ["FaultRule", "SesFaults"]


@dataclass
class _Rule:
    predicate: Callable[[SentMail], bool]
    error: SesError
    remaining: int | None


class FaultRule:
    """Handle returned by :meth:`SesFaults.fail_when`; ``cancel()`` removes the rule."""

    def __init__(self, server: SesFaults, rule: _Rule) -> None:
        self._server = server
        self._rule = rule

    def cancel(self) -> None:
        self._server._remove_rule(self._rule)

    @property
    def remaining(self) -> int | None:
        return self._rule.remaining


class SesFaults(SesRecorder):
    """The injected faults of an SES server, and the controls that set them."""

    def __init__(self) -> None:
        super().__init__()
        self._queued: deque[SesError] = deque()
        self._rules: list[_Rule] = []
        self._paused: SesError | None = None
        self._down: SesError | None = None

    def fail_next(self, n: int, error: SesError) -> None:
        """Answer the next ``n`` SendEmail calls (after any already queued) with ``error``."""
        if n < 0:
            raise ValueError("n must be >= 0")
        with self._cond:
            self._queued.extend([error] * n)

    def fail_when(
        self, predicate: Callable[[SentMail], bool], error: SesError, *, times: int | None = None
    ) -> FaultRule:
        """Answer ``error`` to every SendEmail whose parsed mail matches ``predicate``.

        The predicate gets the mail as it would be recorded (its ``message_id`` is
        not used if rejected). ``times`` limits how often the rule fires; rules
        are tried in the order they were added. Returns a handle to cancel it.
        """
        rule = _Rule(predicate, error, times)
        with self._cond:
            self._rules.append(rule)
        return FaultRule(self, rule)

    def _remove_rule(self, rule: _Rule) -> None:
        with self._cond:
            if rule in self._rules:
                self._rules.remove(rule)

    def go_down(self, error: SesError = Faults.SERVICE_UNAVAILABLE) -> None:
        """Answer every operation (SendEmail, GetAccount, ...) with ``error`` until
        :meth:`clear_faults`: the region's endpoint down, not one call's fault. A rule of
        :meth:`fail_when` fails SendEmail only, and GetAccount would still say SES answers."""
        with self._cond:
            self._down = error

    def clear_faults(self) -> None:
        """Forget queued faults and rules, and resume (and come back up)."""
        with self._cond:
            self._queued.clear()
            self._rules.clear()
            self._paused = None
            self._down = None

    def pause(self, error: SesError = Faults.SENDING_PAUSED) -> None:
        """Answer every SendEmail with ``error`` until :meth:`resume`; GetAccount says sending is off."""
        with self._cond:
            self._paused = error

    def resume(self) -> None:
        with self._cond:
            self._paused = None

    @property
    def paused(self) -> bool:
        with self._cond:
            return self._paused is not None

    def _ruled(self, mail: SentMail) -> SesError | None:
        """The error of the first rule ``mail`` matches (counting the rule's use), if any."""
        for rule in list(self._rules):
            if rule.predicate(mail):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                return rule.error
        return None
