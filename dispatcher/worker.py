"""What a worker is: the dispatcher hands it claimed jobs of one kind, in batches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from fairpost.dispatcher.jobs import Job


@dataclass(frozen=True)
class HandedOff:
    """The job reached the worker's downstream: it keeps its
    tenant's in-flight slot until something downstream finishes it."""


@dataclass(frozen=True)
class Done:
    """The job is finished; its slot is free."""


@dataclass(frozen=True)
class Requeue:
    """The worker could not take the job now; it goes back to the head of its queue."""

    reason: str


@dataclass(frozen=True)
class Dead:
    """The job can never succeed; it is kept as a dead letter with the reason."""

    reason: str


@dataclass(frozen=True)
class Later:
    """The job may not go now (something it goes to is held for its tenant): it is
    scheduled again ``seconds`` from now, its status saying ``reason``
    (:meth:`JobStore.defer`); ``entry``: its journal entry when it starts to wait so."""

    seconds: float
    reason: str
    entry: Mapping[str, str] | None = None


Outcome = HandedOff | Done | Requeue | Dead | Later


class Worker(Protocol):
    """Handles jobs of one kind. Register one per kind with the dispatcher."""

    @property
    def kind(self) -> str: ...

    @property
    def max_batch(self) -> int:
        """The most jobs :meth:`handle` takes at once."""
        ...

    async def handle(self, jobs: Sequence[Job]) -> Sequence[Outcome]:
        """Return one outcome per job, in order. Raising is treated as Requeue for all."""
        ...


def __getattr__(name: str) -> Any:
    # The outcome was called Retry until 0.2; a worker written for 0.1 keeps working,
    # with a warning, for a release.
    if name == "Retry":
        import warnings

        warnings.warn("fairpost.dispatcher.worker.Retry is now Requeue", DeprecationWarning, stacklevel=2)
        return Requeue
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
