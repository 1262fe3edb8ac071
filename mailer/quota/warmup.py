"""Warm-up: a new tenant's limits grow by its plan's steps, and only while its mail is clean.

A tenant's *place* in its plan (:class:`Place`: the plan, the step it is on
and since when, and why it is held, if it is) is one field of the hash
:meth:`fairpost.mailer.sdk.keys.MailKeys.warmup`, written at the Redis server's
time by ``warmup.lua`` beside this module, so it survives restarts and every
replica reads the same one. Plans start three ways: a tenant fairpost has not
seen before starts ``FAIRPOST_WARMUP__PLAN`` when the sender first meets its
mail; an operator sets one (:mod:`fairpost.mailer.quota.warmup_admin`,
``fairpost tenant warmup``), or starts a plan over.

The schedule runs from each step's start: step ``k + 1`` is due the
difference of the two offsets after step ``k`` began. A step advances at its
due time only if the tenant's bounce and complaint rates (the reputation
guard's measure: :mod:`fairpost.mailer.quota.reputation`) are under the
warm-up's thresholds; otherwise the tenant is *held* on its step, keeps
sending at that step's limits, and moves on once its rates are back under
(the later steps keep their lengths from then). A last step of ``none``
ends the warm-up: the tenant's place is deleted.

:class:`Warmups` is the sender's side, run inside the
:class:`fairpost.mailer.quota.overrides.OverrideCache`: it reads every place
on each refresh, judges the tenants with a step due soon or held, writes
their moves (compare-and-set: replicas and operators never undo each
other), and folds the step in force into the limits the sender passes to the
quota engine. The step's change takes effect at its due time, reckoned from
the Redis clock, not at the next refresh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import redis.asyncio

from fairpost.config import Settings
from fairpost.config.limits import Limits, Window, format_limits
from fairpost.config.warmup import WarmupPlan, WarmupStep, parse_plan, stricter
from fairpost.dispatcher.replies import text
from fairpost.dispatcher.scripts import lua_source
from fairpost.mailer.quota.reputation import Reputation, ReputationBook
from fairpost.mailer.sdk.keys import MailKeys

__all__ = [
    "HOLD_KINDS",
    "PENDING",
    "Place",
    "StepHold",
    "WarmupView",
    "Warmups",
    "advance",
    "hold_for",
    "plan_of",
    "read_places",
]

log = logging.getLogger("fairpost.warmup")

Source = Literal["default", "operator"]

HOLD_KINDS = ("bounce_rate", "complaint_rate")
"""Why a step is held: ``Place.held`` (and the metrics' ``reason`` label)."""

PENDING = "pending"
"""A tenant the sender met before this replica knew whether it warms up."""


@lru_cache(maxsize=256)
def plan_of(text: str) -> WarmupPlan:
    """The stored plan text, parsed (once per text)."""
    return parse_plan(text)


@dataclass(frozen=True)
class StepHold:
    """Why a tenant's warm-up plan stays at its step (its reputation), not a hold on
    its mail: the tenant sends at the step's limit meanwhile."""

    kind: str
    """One of :data:`HOLD_KINDS`."""
    why: str
    """E.g. ``bounce rate 2.50% over 24h (5 of 10 sends, counted as 200) >= 2.00%``."""


@dataclass(frozen=True)
class Place:
    """Where a tenant stands in its warm-up plan (times are the Redis server's, ms)."""

    plan: str
    source: Source
    """``default`` (``FAIRPOST_WARMUP__PLAN``, for a new tenant) or ``operator``."""
    started_ms: int
    step: int
    """The step in force, 0-based."""
    entered_ms: int
    """When that step began (on schedule; when its hold ended, if it was held)."""
    held: str | None = None
    """Why the next step is held (:data:`HOLD_KINDS`); ``None``: on schedule."""
    why: str | None = None
    held_ms: int | None = None

    @classmethod
    def from_json(cls, raw: Any) -> Place | None:
        """A stored place, or ``None`` if it is unreadable (written by hand)."""
        try:
            data = json.loads(text(raw))
            place = cls(**data)
            plan_of(place.plan)
        except (ValueError, TypeError):
            return None
        if not 0 <= place.step < len(plan_of(place.plan).steps):
            return None
        return place

    def to_json_text(self) -> str:
        data = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return json.dumps(data, sort_keys=True)

    @property
    def steps(self) -> tuple[WarmupStep, ...]:
        return plan_of(self.plan).steps

    @property
    def limits(self) -> Limits:
        """The step's limits (a place never stands on a ``none`` step)."""
        return self.steps[self.step].limits or ()

    def due_ms(self) -> int | None:
        """When the next step is due; ``None`` on the last step."""
        if self.step + 1 >= len(self.steps):
            return None
        return self.entered_ms + (self.steps[self.step + 1].offset - self.steps[self.step].offset) * 1000


def advance(place: Place, now_ms: int, hold: StepHold | None) -> Place | None:
    """Where ``place`` stands at ``now_ms``, given the tenant's rates (``hold``: not clean).

    Due steps are taken in turn while clean, each from its due time; a due step
    is held while not clean, and a held step moves on, from now, once clean.
    ``None``: a ``none`` step was reached, the warm-up is over.
    """
    while place.step + 1 < len(place.steps):
        if place.held is not None:
            if hold is not None:
                return place  # still held, for the reason first given
            place = dataclasses.replace(
                place, step=place.step + 1, entered_ms=now_ms, held=None, why=None, held_ms=None
            )
        else:
            due = place.due_ms()
            assert due is not None
            if due > now_ms:
                return place
            if hold is not None:
                return dataclasses.replace(place, held=hold.kind, why=hold.why, held_ms=now_ms)
            place = dataclasses.replace(place, step=place.step + 1, entered_ms=due)
        if place.steps[place.step].limits is None:
            return None
    return place


def hold_for(rep: Reputation, settings: Settings) -> StepHold | None:
    """Why a step may not advance now, if the tenant's rates are not under the warm-up's
    thresholds: counted as the guard counts them (since an operator last lifted it, over
    at least ``FAIRPOST_REPUTATION__MIN_SENDS`` sends), over 24 hours and 7 days."""
    min_sends = settings.reputation.min_sends
    for w in rep.windows:
        denominator = max(w.judged_sends, min_sends)
        for kind, count, threshold in (
            ("bounce_rate", w.judged_bounces, settings.warmup.bounce_threshold),
            ("complaint_rate", w.judged_complaints, settings.warmup.complaint_threshold),
        ):
            rate = count / denominator
            if rate >= threshold:
                counted = f", counted as {min_sends}" if w.judged_sends < min_sends else ""
                what = kind.replace("_", " ")
                return StepHold(
                    kind,
                    f"{what} {rate:.2%} over {w.name} ({count} of {max(w.judged_sends, count)} sends"
                    f"{counted}) >= {threshold:.2%}",
                )
    return None


def read_places(raw: Mapping[Any, Any]) -> dict[str, tuple[str, Place]]:
    """The places hash as read (``HGETALL``): tenant → (its stored text, its place)."""
    places = {}
    for tenant, value in raw.items():
        place = Place.from_json(value)
        if place is None:
            log.warning("ignoring an unreadable warm-up place", extra={"tenant": text(tenant)})
            continue
        places[text(tenant)] = (text(value), place)
    return places


@dataclass(frozen=True)
class WarmupView:
    """A warming tenant as ``fairpost stats`` and ``fairpost tenant warmup`` show it."""

    tenant: str
    place: Place

    def to_json(self) -> dict[str, Any]:
        p = self.place
        steps = p.steps
        nxt = None
        if p.step + 1 < len(steps):
            step = steps[p.step + 1]
            nxt = {
                "step": p.step + 2,
                "limits": None if step.limits is None else format_limits(step.limits),
                "due_ms": p.due_ms() if p.held is None else None,
            }
        return {
            "plan": p.plan,
            "source": p.source,
            "started_ms": p.started_ms,
            "step": p.step + 1,
            "steps": len(steps),
            "limits": format_limits(p.limits),
            "since_ms": p.entered_ms,
            "next": nxt,
            "held": p.held,
            "held_why": p.why,
            "held_since_ms": p.held_ms,
        }

    def describe(self, now_ms: int) -> str:
        """One line: the step, its limits, and what comes next and when (or why it waits)."""
        p = self.place
        steps = p.steps
        line = f"warm-up step {p.step + 1} of {len(steps)} ({format_limits(p.limits)})"
        if p.step + 1 >= len(steps):
            return line + ", the last: it holds until the warm-up is skipped"
        step = steps[p.step + 1]
        nxt = "the end of the warm-up" if step.limits is None else format_limits(step.limits)
        if p.held is not None:
            return f"{line}; held before step {p.step + 2} ({nxt}): {p.why}"
        due = p.due_ms()
        assert due is not None
        when = f"in {_wait(due - now_ms)}" if due > now_ms else "due now"
        return f"{line}; next: {nxt} {when}"


def _wait(ms: int) -> str:
    """``2d 3h``, ``5h 0m``, ``4m 10s``, ``12s``: a wait, to its two largest units (rounded up)."""
    seconds = -(-ms // 1000)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"


class Warmups:
    """The warm-up part of the limits a sender applies (see the module's docstring).

    :meth:`read` queues the read of every place on the cache's refresh pipeline;
    :meth:`refresh` then starts plans for tenants met since, judges the tenants
    with a step due within ``horizon_seconds`` or held, and writes their moves.
    :meth:`fold` answers from memory.
    """

    def __init__(
        self, client: redis.asyncio.Redis, keys: MailKeys, settings: Settings, *, horizon_seconds: float
    ) -> None:
        self._redis = client
        self._keys = keys
        self._settings = settings
        self._default = settings.warmup.plan
        self._horizon_ms = int(horizon_seconds * 1000)
        self._script = client.register_script(lua_source("fairpost.mailer.quota", "warmup"))
        self._book = ReputationBook(client, keys, settings)
        self._places: dict[str, tuple[str, Place]] = {}
        self._clean: set[str] = set()
        """Tenants judged clean at the last refresh (their due step may be taken locally)."""
        self._known: set[str] | None = None
        """With a default plan: tenants it no longer starts for (loaded once)."""
        self._pending: set[str] = set()
        self._offset_ms = 0.0
        """Redis time minus this process's monotonic clock, in ms."""
        self.wake = asyncio.Event()
        """Set when the sender meets a tenant not known yet: the cache refreshes at once."""

    # -- what the sender asks, from memory ------------------------------------------
    def now_ms(self) -> int:
        return int(time.monotonic() * 1000 + self._offset_ms)

    def place(self, tenant: str) -> Place | None:
        """The tenant's place now, its due steps taken if it was judged clean; None: not warming."""
        entry = self._places.get(tenant)
        if entry is None:
            return None
        place = entry[1]
        if tenant in self._clean and place.held is None:
            return advance(place, self.now_ms(), None)
        return place

    def fold(self, tenant: str, own: Limits) -> Limits:
        """``own`` with the tenant's step in force, window by window the stricter."""
        if tenant in self._places:
            place = self.place(tenant)
            return own if place is None else stricter(own, place.limits)
        if self._default is not None and (self._known is None or tenant not in self._known):
            # Not known to be old: the plan's first step until a refresh (woken now) says.
            if tenant not in self._pending:
                self._pending.add(tenant)
                self.wake.set()
            return stricter(own, self._default.steps[0].limits or ())
        return own

    def reason(self, tenant: str, window: Window | None, own: Limits) -> str | None:
        """``warmup`` (or ``warmup_held``) when ``window``, which refused the tenant's mail,
        is its warm-up step's, stricter than its ``own``; else None."""
        place = self.place(tenant) if window is not None else None
        if place is None or window is None or window not in place.limits:
            return None
        if any(w.seconds == window.seconds and w.limit <= window.limit for w in own):
            return None
        return "warmup_held" if place.held is not None else "warmup"

    def fingerprints(self) -> dict[str, str]:
        """Tenant → its stored place, for the cache to see which changed."""
        return {tenant: raw for tenant, (raw, _) in self._places.items()}

    # -- refresh -----------------------------------------------------------------------
    def read(self, pipe: Any) -> None:
        pipe.hgetall(self._keys.warmup())

    async def refresh(self, raw: Mapping[Any, Any], redis_ms: int, local_ms: float) -> set[str]:
        """Act on the places as read with the cache's pipeline; returns the tenants met
        before they were known (their limits may have been too strict meanwhile)."""
        self._offset_ms = redis_ms - local_ms
        places = read_places(raw)
        if self._known is not None:
            # A tenant whose warm-up ended or was skipped is known, on every replica.
            self._known |= set(self._places) - set(places)
        met: set[str] = set()
        if self._default is not None:
            if self._known is None:
                await self._script(keys=self._script_keys(), args=["seed"])
                members = await self._redis.smembers(self._keys.warmup_known())
                self._known = {text(m) for m in members}
            met = set(self._pending)
            await self._start(met, places, redis_ms)
        self._pending -= met
        await self._judge(places, redis_ms)
        self._places = places
        return met

    def _script_keys(self) -> list[str]:
        return [self._keys.warmup(), self._keys.warmup_known(), self._keys.tenants()]

    async def _start(self, tenants: set[str], places: dict[str, tuple[str, Place]], now_ms: int) -> None:
        assert self._default is not None and self._known is not None
        ordered = sorted(tenants - set(places))
        if not ordered:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant in ordered:
                await self._script(
                    keys=self._script_keys(), args=["start", tenant, str(self._default)], client=pipe
                )
            replies = await pipe.execute()
        for tenant, reply in zip(ordered, replies, strict=True):
            place = Place.from_json(reply) if reply else None
            if place is None:
                self._known.add(tenant)
                continue
            places[tenant] = (text(reply), place)
            if place.started_ms >= now_ms:
                log.info("warm-up started: %s", place.plan, extra={"tenant": tenant})

    async def _judge(self, places: dict[str, tuple[str, Place]], now_ms: int) -> None:
        """Judge the tenants whose next step is due soon or held; write what moved."""
        soon = now_ms + self._horizon_ms
        judged = []
        for tenant, (_, place) in places.items():
            due = place.due_ms()
            if place.held is not None or (due is not None and due <= soon):
                judged.append(tenant)
        reps = await self._book.read_many(judged)
        holds = {t: hold_for(rep, self._settings) for t, rep in zip(judged, reps, strict=True)}
        self._clean = {t for t, hold in holds.items() if hold is None}
        moves = []
        for tenant in judged:
            raw, place = places[tenant]
            moved = advance(place, now_ms, holds[tenant])
            if moved != place:
                moves.append((tenant, raw, moved))
        if not moves:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant, raw, moved in moves:
                new = "" if moved is None else moved.to_json_text()
                await self._script(keys=self._script_keys(), args=["cas", tenant, raw, new], client=pipe)
            done = await pipe.execute()
        for (tenant, _, moved), ok in zip(moves, done, strict=True):
            if not int(ok):
                continue  # changed meanwhile: read again at the next refresh
            if moved is None:
                del places[tenant]
                log.info("warm-up over: the tenant's own limits apply", extra={"tenant": tenant})
                continue
            places[tenant] = (moved.to_json_text(), moved)
            if moved.held is not None:
                log.warning(
                    "warm-up held at step %d: %s", moved.step + 1, moved.why, extra={"tenant": tenant}
                )
            else:
                log.info(
                    "warm-up step %d of %d: %s",
                    moved.step + 1,
                    len(moved.steps),
                    format_limits(moved.limits),
                    extra={"tenant": tenant},
                )
