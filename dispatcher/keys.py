"""Every Redis key fairpost writes, built in one place.

All keys share one hash tag, ``{prefix}``, because the Lua scripts touch
keys of many tenants at once (the fair pick, the global and tenant quota in
one call): on Redis Cluster they must live in one slot.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIORITIES = ("high", "normal", "low")

BULK = "bulk."
"""What a bulk lane's name puts before its priority. A job of a bulk lane (for mail:
the ``notification`` stream) is claimed only when its tenant has nothing waiting in
the other lanes, and never takes the last quarter of its tenant's in-flight slots
(``ring.lua``), so a tenant's bulk backlog never delays its urgent jobs."""
BULK_LANES = tuple(BULK + p for p in PRIORITIES)
LANES = PRIORITIES + BULK_LANES
"""Every queue of a tenant, in the order the claim takes them (``ring.lua``)."""


def lane(priority: str, *, bulk: bool) -> str:
    """The queue a job of ``priority`` waits in: its bulk lane for bulk work."""
    return BULK + priority if bulk else priority


TOTAL_WAITING = "~waiting"
"""The field of :meth:`Keys.counts` with the jobs waiting over every tenant (``~``
is not allowed in tenant ids)."""
WAKE_WORK = "1"
"""A wake token (:meth:`Keys.wake`): a tenant may have become claimable."""
WAKE_SCHEDULED = "s"
"""A wake token: a scheduled job is due before any other was; look for due ones."""
WAKE_TOKENS_MOST = 64
"""Wake tokens the list keeps (ring.lua trims it to as many): a dispatcher takes them all at once."""
TOTAL_INFLIGHT = "~inflight"
"""The field of :meth:`Keys.counts` with the in-flight slots over every tenant."""


@dataclass(frozen=True)
class Keys:
    prefix: str = "fairpost"

    @property
    def root(self) -> str:
        return "{" + self.prefix + "}"

    # -- the layout (dispatcher/layout.py, dispatcher/migrate.py) -------------
    def layout(self) -> str:
        """String: the key layout's version, kept once; none on a store written before
        versions (0.1.0 reads it as layout 0)."""
        return f"{self.root}:layout"

    def migrate_lock(self) -> str:
        """String with a TTL: the ``fairpost migrate`` that runs now (a redis-py lock)."""
        return f"{self.root}:migrate:lock"

    def migrate_cursor(self) -> str:
        """String: where a migration's scan stands (a SCAN cursor), so that a rerun after
        a kill resumes there; gone once the layout is stamped."""
        return f"{self.root}:migrate:cursor"

    # -- jobs ----------------------------------------------------------------
    def job(self, job_id: str) -> str:
        """Hash: the job record (state, tenant, kind, timestamps: short values, so
        that Redis keeps it as a listpack; dispatcher/record.py)."""
        return f"{self.root}:job:{job_id}"

    def payload(self, job_id: str) -> str:
        """String: the job's payload (a mail's JSON), beside its record (dispatcher/record.py)."""
        return f"{self.root}:payload:{job_id}"

    def payload_prefix(self) -> str:
        return f"{self.root}:payload:"

    def job_prefix(self) -> str:
        """What :meth:`job` puts before the id, for Lua scripts that build keys."""
        return f"{self.root}:job:"

    def queue(self, tenant: str, priority: str) -> str:
        """List: ids of the tenant's waiting jobs of one lane (:data:`LANES`), head first."""
        return f"{self.root}:q:{tenant}:{priority}"

    def queue_prefix(self) -> str:
        return f"{self.root}:q:"

    # -- the fair pick -------------------------------------------------------
    def ring(self) -> str:
        """List: tenants with waiting jobs and a free in-flight slot, in turn order."""
        return f"{self.root}:ring"

    def ring_members(self) -> str:
        """Set: the tenants in :meth:`ring`, to keep each there once."""
        return f"{self.root}:ring:members"

    def blocked(self) -> str:
        """Set: tenants with waiting jobs but no free in-flight slot."""
        return f"{self.root}:blocked"

    def expiring(self) -> str:
        """Sorted set: tenants holding in-flight slots, scored at or before their
        earliest handed-off slot's expiry (ms): the reaper visits only those due."""
        return f"{self.root}:expiring"

    def counts(self) -> str:
        """Hash: tenant → jobs waiting in its queues, and the totals over every
        tenant (:data:`TOTAL_WAITING`, :data:`TOTAL_INFLIGHT`): counted by the
        scripts as work happens, so that no view reads every tenant."""
        return f"{self.root}:counts"

    def backlog_top(self) -> str:
        """Sorted set: tenants whose backlog reached 2 or more, scored by the largest
        power of two it reached since (readers put stale scores right): the
        largest backlogs, to within a factor of two, without a sorted-set write
        per job."""
        return f"{self.root}:backlog-top"

    def deficit(self) -> str:
        """Hash: tenant → deficit-round-robin credit."""
        return f"{self.root}:deficit"

    def weights(self) -> str:
        """Hash: tenant → weight, for tenants that differ from the default."""
        return f"{self.root}:weights"

    def caps(self) -> str:
        """Hash: tenant → in-flight cap, for tenants that differ from the default."""
        return f"{self.root}:caps"

    def paused(self) -> str:
        """Set: tenants an operator paused; they keep their queue but leave the ring."""
        return f"{self.root}:paused"

    def inflight(self, tenant: str) -> str:
        """Sorted set: the tenant's claimed or handed-off jobs, scored by expiry (ms)."""
        return f"{self.root}:inflight:{tenant}"

    def inflight_prefix(self) -> str:
        return f"{self.root}:inflight:"

    def leases(self) -> str:
        """Sorted set: claimed jobs not yet handed off, scored by lease deadline (ms)."""
        return f"{self.root}:leases"

    def claim(self, token: str) -> str:
        """The jobs one claim leased (claim.lua): a string, the claim's time, then its
        job ids, each after :data:`~fairpost.dispatcher.record.ENTRY_SEP`, kept for a
        lease, so that the claim asked again under its token answers them."""
        return f"{self.root}:claim:{token}"

    def wake(self) -> str:
        """List: tokens that wake an idle dispatcher blocked on BLPOP: :data:`WAKE_WORK`
        (a tenant may be claimable) or :data:`WAKE_SCHEDULED` (dispatcher/ring.lua)."""
        return f"{self.root}:wake"

    def dispatched(self) -> str:
        """Sorted set: dispatched jobs, scored by when they count as stranded unless
        they show progress first (ms; dispatcher/reconcile.lua)."""
        return f"{self.root}:dispatched"

    def reconciled(self) -> str:
        """Hash: what the reconciler did, outcome → count, for stats."""
        return f"{self.root}:reconciled"

    def history_days(self) -> str:
        """Hash: day (days since the epoch, UTC) -> the number of the day's history
        buckets (dispatcher/history.lua); a field a day kept."""
        return f"{self.root}:hist-days"

    def history_prefix(self) -> str:
        """What the history's buckets' names start with: ``<prefix><day>:<n>``, each a
        hash with a TTL, job id -> its line (dispatcher/history.lua)."""
        return f"{self.root}:hist:"

    def sending(self, job_id: str) -> str:
        """String with a TTL: a sender is sending this job now (mailer/daemon/send_claim.lua)."""
        return f"{self.root}:sending:{job_id}"

    def sending_prefix(self) -> str:
        return f"{self.root}:sending:"

    def tenants(self) -> str:
        """Set: every tenant that ever enqueued, for stats."""
        return f"{self.root}:tenants"

    def dead(self) -> str:
        """Sorted set: dead-lettered job ids, scored by when they died (ms)."""
        return f"{self.root}:dead"

    # -- job lifecycle (scheduled send, idempotency, claim checks) -------------
    def scheduled(self) -> str:
        """Sorted set: ids of jobs waiting for their send time, scored by it (ms)."""
        return f"{self.root}:scheduled"

    def idempotency(self, tenant: str, key: str) -> str:
        """String with a TTL: the id of the job first sent with this idempotency key."""
        return f"{self.root}:idem:{tenant}:{key}"

    def content(self, job_id: str) -> str:
        """String: a job's content kept beside its record (a mail too big for SQS: a claim check)."""
        return f"{self.root}:content:{job_id}"

    def content_prefix(self) -> str:
        return f"{self.root}:content:"

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
        (quota.lua), so that the acquire asked again under its token counts them once."""
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

    # -- the outcome feed and its webhooks (docs/outcomes.md) -----------------------
    def outcomes(self) -> str:
        """Stream: the journal of jobs' outcomes (dispatcher/journal.py), read as the outcome
        feed (mailer/sdk/outcomes); trimmed by age and length."""
        return f"{self.root}:outcomes"

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

    def pool_moves(self) -> str:
        """Hash: tenant → its move between pools in progress (JSON: from, to, step)."""
        return f"{self.root}:pools:moves"

    def pool_failing(self) -> str:
        """Hash: pool → since when (ms) its SES fails, while it does (opt-in failover)."""
        return f"{self.root}:pools:failing"
