"""Mail's Redis keys: the dispatcher's (:class:`~fairpost.dispatcher.keys.Keys`) and
every key only mail writes, under the same prefix and hash tag.

Mail's keys sit in the SDK, the lowest of mailer's rooms, so that every room
builds them from here. The key strings are the ones earlier releases wrote:
changing one is a change of layout (dispatcher/layout.py).

Mail tells the dispatcher of its send marker (:meth:`MailKeys.sending`) through
:meth:`~fairpost.dispatcher.keys.Keys.busy_markers`: a job a sender holds is not
cancelled, deferred or taken for stranded, and its marker goes when it finishes.
What a sent mail's line in the dispatcher's history keeps (:data:`MAIL_HISTORY`)
it tells through :meth:`~fairpost.dispatcher.keys.Keys.history_fields`.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairpost.dispatcher.keys import BusyMarker, HistoryField, Keys

__all__ = ["MAIL_HISTORY", "SENDING", "MailKeys", "mail_keys"]

SENDING = "sending"
"""The state a cancel reports for a mail a sender is sending now."""

MAIL_HISTORY = (
    HistoryField("priority", "normal"),
    HistoryField("recipients"),
    HistoryField("created_ms"),
    HistoryField("dispatched_ms", after_created=True),
    HistoryField("finished_ms", after_created=True),
    HistoryField("attempts", "0"),
    HistoryField("throttled", "0"),
    HistoryField("send_seq"),
    HistoryField("delivery"),
    HistoryField("bounce_type"),
    HistoryField("suppressed", "0"),
    HistoryField("replays", "0"),
    HistoryField("suppressed_reason"),
)
"""What a sent mail's line in the history keeps, in its order (about 45 characters):
what status() shows of a mail past its detail TTL, and SES's verdict on it
(``delivery``, ``bounce_type``: mailer/daemon/events.py). No SES message id,
diagnostic or error."""


@dataclass(frozen=True)
class MailKeys(Keys):
    # -- what mail adds to the dispatcher (fairpost.dispatcher.keys) -------------------
    def busy_markers(self) -> tuple[BusyMarker, ...]:
        """The send marker: a sender is sending the mail now."""
        return (BusyMarker(SENDING, self.sending_prefix()),)

    def data_keys(self) -> list[str]:
        return [*super().data_keys(), self.webhook_endpoints()]

    def history_fields(self) -> tuple[HistoryField, ...]:
        return MAIL_HISTORY

    # -- the sender ------------------------------------------------------------------
    def sending(self, job_id: str) -> str:
        """String with a TTL: a sender is sending this job now (mailer/daemon/send_claim.lua)."""
        return f"{self.root}:sending:{job_id}"

    def sending_prefix(self) -> str:
        return f"{self.root}:sending:"

    # -- quotas --------------------------------------------------------------
    def quota(self, scope: str, seconds: int) -> str:
        """Hash: the buckets of one sliding window; scope is "global" or "t:<tenant>"."""
        return f"{self.root}:quota:{scope}:{seconds}"

    def quota_share(self, part: str) -> str:
        """The global quota's weighted-share state (tags, seen, weights, waiting)."""
        return f"{self.root}:quota:share:{part}"

    def quota_prefix(self) -> str:
        return f"{self.root}:quota:"

    def quota_grant(self, token: str) -> str:
        """String with a TTL: the answer of one quota acquire that counted units
        (acquire.lua), so that the acquire asked again under its token counts them once."""
        return f"{self.root}:grant:{token}"

    # -- operations (live overrides, health) -----------------------------------
    def tenant_hold(self, tenant: str) -> str:
        """Hash with a TTL: SES refused this tenant's mail for a fault of its own (reason,
        until_ms, backoff_ms); its mail waits until then (mailer/quota/holds.py)."""
        return f"{self.root}:hold:{tenant}"

    def limit_overrides(self) -> str:
        """Hash: live quota overrides, "global" or "t:<tenant>" → limits text ("100/minute")."""
        return f"{self.root}:overrides:limits"

    def auto_limits(self) -> str:
        """String: the global limits a daemon derived from SES GetAccount, for the CLI to show."""
        return f"{self.root}:overrides:auto"

    def warmup(self) -> str:
        """Hash: tenant → its place in its warm-up plan (JSON: plan, step, since; mailer/quota/warmup.py)."""
        return f"{self.root}:warmup"

    def warmup_known(self) -> str:
        """Set: tenants a default warm-up plan no longer starts for (seen before), and ``~``
        once it holds every tenant that had enqueued when the first default plan ran."""
        return f"{self.root}:warmup:known"

    def heartbeat(self, replica: str) -> str:
        """String with a TTL: a replica's last heartbeat (JSON); gone when it stops beating."""
        return f"{self.root}:heartbeat:{replica}"

    def replicas(self) -> str:
        """Sorted set: replica ids scored by when their heartbeat expires (ms)."""
        return f"{self.root}:replicas"

    def console_ended(self, session_digest: str) -> str:
        """String with a TTL: a console session ended by logout, by a digest of its id,
        until its cookie would have expired anyway (mailer/console/sessions.py)."""
        return f"{self.root}:console:ended:{session_digest}"

    # -- reputation (SES events, suppression, the guard, SES tenants) ---------------
    def ses_message(self, message_id: str) -> str:
        """String with a TTL: the job id of the mail SES accepted under this SES message id."""
        return f"{self.root}:sesmsg:{message_id}"

    def unsubscribed(self, tenant: str) -> str:
        """Hash: the tenant's unsubscribed addresses (lower case) → "<topics> <source> <ms>"
        (mailer/sdk/unsubscribes.py)."""
        return f"{self.root}:unsub:{tenant}"

    def suppressed(self, tenant: str) -> str:
        """Hash: the tenant's suppressed addresses (lower case) → "reason ms" (mailer/sdk/suppression.py)."""
        return f"{self.root}:suppressed:{tenant}"

    def reputation(self, tenant: str, seconds: int) -> str:
        """Hash: one sliding window of a tenant's sends, bounces and complaints, in buckets
        (mailer/quota/reputation.lua)."""
        return f"{self.root}:rep:{tenant}:{seconds}"

    def reputation_base(self, tenant: str, seconds: int) -> str:
        """Hash: :meth:`reputation` as it was when an operator lifted the guard; the guard
        judges only what came after."""
        return f"{self.root}:rep:{tenant}:{seconds}:base"

    def send_seq(self, tenant: str) -> str:
        """String: the tenant's accepted recipients so far, numbering its sends (send_seq.lua)."""
        return f"{self.root}:rep:{tenant}:seq"

    def recent_bounces(self, tenant: str) -> str:
        """Sorted set: the tenant's permanent bounces among its last sends, scored by the
        bounced mail's send number (recent_bounces.lua)."""
        return f"{self.root}:rep:{tenant}:recent"

    def guard(self) -> str:
        """Hash: tenant → the reputation guard's action on it (JSON: level, reason, rates, time)."""
        return f"{self.root}:rep:guard"

    def provider_guard(self) -> str:
        """Hash: tenant → the providers the per-provider guard holds it for (JSON: provider →
        reason, rates, time; mailer/quota/provider_guard.py)."""
        return f"{self.root}:rep:provider-guard"

    def provider_guard_base(self, tenant: str) -> str:
        """String with a TTL: the tenant's per-provider counts when an operator lifted its
        provider holds (JSON); the guard judges only what came after."""
        return f"{self.root}:rep:{tenant}:provider-base"

    def ses_tenant_status(self) -> str:
        """Hash: tenant → its SES tenant's sending status (JSON), for tenants SES disabled."""
        return f"{self.root}:ses:tenant-status"

    def ses_event(self, event_id: str) -> str:
        """String with a TTL: this SES event was handled (SQS may deliver it twice)."""
        return f"{self.root}:ses:event:{event_id}"

    def events_seen(self) -> str:
        """Hash: SES event outcome ("bounce", "unmatched", ...) → count, for stats."""
        return f"{self.root}:ses:events"

    # -- deliverability rollups and the send history (mailer/sdk/rollups.py) -------
    def rollup_prefix(self, tenant: str) -> str:
        """What a tenant's day of deliverability counts is named after: the hash
        ``<prefix><day>`` (days since 1970, Redis time), field ``<provider>:<counter>``
        → count, with a retention TTL (rollups.lua builds the day's name)."""
        return f"{self.root}:dlv:{tenant}:"

    def send_history(self, scope: str) -> str:
        """Hash with a TTL: recipients sent per minute over the last hour, ``global`` or
        ``t:<tenant>``; field = minute mod 60 → ``<minute>:<count>`` (rollups.lua)."""
        return f"{self.root}:spm:{scope}"

    def webhook_endpoints(self) -> str:
        """Set: every webhook endpoint id."""
        return f"{self.root}:wh:endpoints"

    def webhook_tenant(self, tenant: str) -> str:
        """Set: the ids of the tenant's webhook endpoints."""
        return f"{self.root}:wh:tenant:{tenant}"

    def webhook_endpoint_prefix(self) -> str:
        """What :meth:`webhook_endpoint` puts before the id, for the scripts that build
        an endpoint's keys: the endpoint's hash is ``<prefix><id>``, its other keys
        ``<prefix><id>:<part>`` (the parts below)."""
        return f"{self.root}:wh:ep:"

    def webhook_endpoint(self, endpoint: str) -> str:
        """Hash: a webhook endpoint (tenant, url, event types, enabled, secrets, failing since)."""
        return f"{self.webhook_endpoint_prefix()}{endpoint}"

    def webhook_part(self, endpoint: str, part: str) -> str:
        """One of an endpoint's delivery keys (mailer/sdk/outcomes/deliveries.py), by ``part``:
        ``body`` (hash: event id → the body to deliver), ``pending`` (zset: event id → the
        event's time, ms), ``due`` (zset: the event ids whose turn it is → when, ms),
        ``tail`` (hash: job id → its last event queued here), ``next`` (hash: event id →
        the next event of its job), ``tries`` (hash: event id → attempts made),
        ``attempts`` (list: the latest attempts, JSON, newest first)."""
        return f"{self.webhook_endpoint_prefix()}{endpoint}:{part}"

    def webhook_ready(self) -> str:
        """Sorted set: enabled endpoints with deliveries waiting, scored by when the next is due (ms)."""
        return f"{self.root}:wh:ready"

    def webhook_inflight(self) -> str:
        """Sorted set: ``<endpoint> <event id>`` being delivered now, scored by its lease's end (ms)."""
        return f"{self.root}:wh:inflight"

    def webhook_busy(self) -> str:
        """Hash: endpoint → deliveries in flight to it, over every replica."""
        return f"{self.root}:wh:busy"

    def webhook_cursor(self) -> str:
        """String: the id of the last outcome the webhooks fanned out to their endpoints."""
        return f"{self.root}:wh:cursor"

    def webhook_wake(self) -> str:
        """List: a token that wakes an idle delivery loop (a delivery became due)."""
        return f"{self.root}:wh:wake"

    # -- sending pools (mailer/sdk/directory.py): the default pool's keys only --------
    def pool_directory(self) -> str:
        """Hash: tenant → the pool it is on, for the tenants not on the default pool."""
        return f"{self.root}:pools:tenant"

    def pool_fallback(self) -> str:
        """Hash: tenant → the pool its mail may go through while its own pool's SES fails."""
        return f"{self.root}:pools:fallback"

    def pool_fallback_checks(self) -> str:
        """Hash: tenant → whether its identities were found in its fallback pool's SES, and
        when (JSON: pool, verified, at_ms; mailer/sdk/directory.py's ``FallbackCheck``)."""
        return f"{self.root}:pools:fallback:checks"

    def pool_moves(self) -> str:
        """Hash: tenant → its move between pools in progress (JSON: from, to, step)."""
        return f"{self.root}:pools:moves"

    def pool_failing(self) -> str:
        """Hash: pool → since when (ms) its SES fails, while it does (opt-in failover)."""
        return f"{self.root}:pools:failing"


def mail_keys(keys: Keys) -> MailKeys:
    """``keys`` as mail's, for code handed a dispatcher store (whose ``keys`` are typed
    as the dispatcher's): a store mail uses must be built with :class:`MailKeys`, or
    the dispatcher's scripts would not see the send marker."""
    if not isinstance(keys, MailKeys):
        raise TypeError(f"mail's stores are built with MailKeys, not {type(keys).__name__}")
    return keys
