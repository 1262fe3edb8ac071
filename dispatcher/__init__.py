"""A generic fair dispatcher: per-tenant queues in Redis, deficit round robin, leases.

The package exports the store and its records; the dispatch loop
(:mod:`fairpost.dispatcher.runner`) and the worker protocol (:mod:`fairpost.dispatcher.worker`)
are imported from their modules by the daemon, so that an application
enqueueing jobs loads none of them.

A job kind brings its own keys, a subclass of :class:`Keys`, and tells the
dispatcher what it needs through their hooks (:mod:`fairpost.dispatcher.keys`;
docs/design.md, "Job kinds"): the dispatcher names no job kind.
"""

from fairpost.dispatcher.errors import DispatchError, TooLateToCancel, UnknownJob
from fairpost.dispatcher.jobs import Job, JobState, NewJob
from fairpost.dispatcher.keys import Keys
from fairpost.dispatcher.store import JobStore

__all__ = [
    "DispatchError",
    "Job",
    "JobState",
    "JobStore",
    "Keys",
    "NewJob",
    "TooLateToCancel",
    "UnknownJob",
]
