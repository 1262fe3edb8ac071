"""What a :class:`~fairpost.mailer.testing.ses_server.SesServer` recorded, and waiting for it.

:class:`SesRecorder` is the server's record of every call: the mails SES
accepted, the calls it refused, the exceptions its handlers raised, and how
many SendEmail and GetAccount calls came. The server writes it while holding
``_cond`` and notifies it after each call; a test reads copies and waits on
it (:meth:`SesRecorder.wait_for`, :meth:`SesRecorder.wait_until`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Self

from fairpost.mailer.testing.ses_mail import Rejection, SentMail, max_in_window, max_in_window_by

__all__ = ["SesRecorder"]


class SesRecorder:
    """What came in and what was answered; the base of :class:`SesServer`."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._sent: list[SentMail] = []
        self._rejections: list[Rejection] = []
        self._requests = 0
        self._account_requests = 0
        self._errors: list[BaseException] = []

    @property
    def sent(self) -> list[SentMail]:
        with self._cond:
            return list(self._sent)

    @property
    def sent_count(self) -> int:
        with self._cond:
            return len(self._sent)

    @property
    def recipients_sent(self) -> int:
        with self._cond:
            return sum(m.recipient_count for m in self._sent)

    @property
    def requests(self) -> int:
        """SendEmail calls received, accepted or not."""
        with self._cond:
            return self._requests

    @property
    def account_requests(self) -> int:
        """GetAccount calls received."""
        with self._cond:
            return self._account_requests

    @property
    def rejections(self) -> list[Rejection]:
        with self._cond:
            return list(self._rejections)

    @property
    def rejected_count(self) -> int:
        with self._cond:
            return len(self._rejections)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[SentMail]:
        """Wait until at least ``count`` mails are recorded; AssertionError after ``timeout`` s."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._sent) >= count, timeout):
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {count} sent mails: {len(self._sent)} sent, "
                    f"{len(self._rejections)} rejected, {self._requests} SendEmail requests"
                )
            return list(self._sent)

    def wait_for_requests(self, count: int, timeout: float = 10.0) -> None:
        """Wait until at least ``count`` SendEmail calls were answered (accepted or rejected)."""
        self.wait_until(lambda s: len(s._sent) + len(s._rejections) >= count, timeout, f"{count} requests")

    def wait_until(self, predicate: Callable[[Self], bool], timeout: float, what: str = "") -> None:
        """Wait until ``predicate(self)`` holds, re-checked after every request."""
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self), timeout):
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what or predicate!r}: {len(self._sent)} sent, "
                    f"{len(self._rejections)} rejected, {self._requests} SendEmail requests"
                )

    def max_in_window(self, seconds: float, key: Callable[[SentMail], Hashable] | None = None) -> int:
        """Most recipients recorded in any window ``[t, t + seconds)``; see :func:`max_in_window`."""
        return max_in_window(self.sent, seconds, key)

    def max_in_window_by(self, seconds: float, key: Callable[[SentMail], Hashable]) -> dict[Hashable, int]:
        """Per key value, most recipients recorded in any window ``[t, t + seconds)``."""
        return max_in_window_by(self.sent, seconds, key)

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised while handling requests (answered as 500 InternalFailure)."""
        with self._cond:
            return list(self._errors)

    def _record_error(self, exc: BaseException) -> None:
        with self._cond:
            self._errors.append(exc)
            self._cond.notify_all()
