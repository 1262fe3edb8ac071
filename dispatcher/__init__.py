"""A generic fair dispatcher: per-tenant queues in Redis, deficit round robin, leases.

The package exports the store and its records; the dispatch loop
(:mod:`dispatcher.runner`) and the worker protocol (:mod:`dispatcher.worker`)
are imported from their modules by the daemon, so that an application
enqueueing mail loads none of them.
"""

from dispatcher.errors import DispatchError, TooLateToCancel, UnknownJob
from dispatcher.jobs import Job, JobState, NewJob
from dispatcher.keys import Keys
from dispatcher.store import JobStore

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
