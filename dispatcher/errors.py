"""The dispatcher's errors."""

from __future__ import annotations

from config.errors import FairpostError


class DispatchError(FairpostError):
    """The dispatcher failed."""


class UnknownJob(DispatchError):
    """No job has this id (it never existed, or its record expired)."""

    caller_fault = True

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id!r}")
