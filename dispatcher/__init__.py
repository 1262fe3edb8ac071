"""A generic fair dispatcher: per-tenant queues in Redis, deficit round robin, leases."""

from dispatcher.errors import DispatchError, TooLateToCancel, UnknownJob
from dispatcher.jobs import Job, JobState
from dispatcher.keys import Keys
from dispatcher.runner import Dispatcher
from dispatcher.store import JobStore, NewJob
from dispatcher.worker import Dead, Done, HandedOff, Outcome, Retry, Worker

__all__ = [
    "Dead",
    "DispatchError",
    "Dispatcher",
    "Done",
    "HandedOff",
    "Job",
    "JobState",
    "JobStore",
    "Keys",
    "NewJob",
    "Outcome",
    "Retry",
    "TooLateToCancel",
    "UnknownJob",
    "Worker",
]
