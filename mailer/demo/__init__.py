"""``fairpost demo``: the whole system on one machine, a live per-tenant view, and a chart.

The demo starts a private ``redis-server`` (temporary directory, free port)
unless ``FAIRPOST_REDIS_URL`` is set, and fairpost's own emulators (the
SQS server, which keeps AWS's FIFO rules, in its own process, and the
recording SES server) unless an AWS endpoint (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_SQS``, ``AWS_ENDPOINT_URL_SESV2``) is set. It creates the
FIFO queue (and, on an endpoint of the user's, verifies the sender domain in
SES), writes a fairpost config file for the scenario, and
runs ``--replicas`` daemon replicas as real processes (``fairpost run``).
The scenario's tenants then enqueue mail through the SDK while a live table
shows each tenant's backlog, in-flight jobs, mail sent, current quota use
against its limit, and how long it is paused. After the load phase, the
demo waits for the mail still queued (at most the scenario's ``drain``),
stops the replicas with SIGTERM (SIGKILL after a deadline), and writes into
``--output``:

- ``summary.json``: per tenant, mail planned, sent and still waiting, the
  highest number of recipients sent in any sliding window of each of its
  limits (and globally), and p50/p99 latency from enqueue to SES;
- ``rates.png``: each tenant's send rate over time with the quota lines,
  everyone stacked against the global quota, and each mail's latency;
- ``jobs.csv``: every job's tenant, recipients, final state, and enqueue and
  send times (seconds since the load started), the data behind the chart;
- ``logs/``: the replicas' logs (JSON lines).

It checks its own data and exits 1 naming the invariant that failed:
*never over quota* (no sliding window over its limit, globally or per
tenant, counted from the times SES accepted each mail), *nothing lost* (every
job sent or still held in Redis or SQS; none dead, none vanished) and *sent
at most once* (SES's count of accepted mail, from the recording SES server or
moto's ``/moto-api/data.json``, equals the number of sent jobs); and, in a
scenario where one tenant's burst outlasts the load while others trickle
under a global quota with room for all (``default``), *a burst is its own*:
the burst tenant sends at 95 % of its quota or more while backlogged, and
every trickling tenant's p99 enqueue-to-SES stays within 0.5 s and within
1.5 times its p99 before the burst. Ctrl-C or SIGTERM stop everything it
started and remove its temporary files (exit 130).

Scenarios
---------
``--scenario`` takes a built-in name (``default``, ``smoke``, ``crowd``,
``bounce``, ``warmup``) or the path of a TOML file::

    description = "what it shows"    # optional
    duration = 45                    # seconds of load (--duration overrides)
    drain = 5                        # at most this long after the load for queued mail
    global_limits = "40/second"      # as FAIRPOST_GLOBAL_LIMITS, e.g. "40/second; 50000/day"
    tenant_limits = "8/second"       # the default tenant quota
    inflight_cap = 8                 # jobs per tenant in SQS at once
    warmup_plan = "2/second from 0s | 10/second from 10s | none from 20s"  # optional (FAIRPOST_WARMUP__PLAN)

    [tenants.noisy]                  # one table per tenant; the name is the tenant id
    burst = 1500                     # mails enqueued at once ...
    burst_at = 3                     # ... this many seconds into the load (default 0)

    [tenants.umbrella]
    rate = 2                         # mails per second, evenly spaced, for the whole load
    recipients = 3                   # recipients of each mail (default 1)
    limits = "12/second"             # optional: this tenant's own quota
    weight = 2                       # optional: its fair-share weight
    inflight_cap = 4                 # optional: its own in-flight cap
    bounce = 0.1                     # optional: one mail in ten to a bouncing address
    webhook = true                   # optional: its outcomes as webhooks to the demo's receiver

    [reputation]                     # optional: the guard's settings (FAIRPOST_REPUTATION__*)
    throttle_limits = "2/second"

In a scenario with ``bounce``, the recording SES server's mailbox simulator reports a permanent bounce for
every ``bounce+...@simulator.amazonses.com`` recipient, SNS-wrapped, to an
events queue the replicas read, and the chart gains a panel with the
tenant's bounce rate, as the reputation guard counts it, against the
threshold, and when the guard throttled and paused it (``bounce`` scenario).

A tenant with ``webhook = true`` gets a webhook endpoint (as ``fairpost webhook
add`` makes it) at a receiver the demo runs on 127.0.0.1
(:mod:`fairpost.mailer.demo.webhooks`), which verifies each delivery with the
Standard Webhooks library; its mail that does not bounce goes to the mailbox
simulator's ``success`` address, whose delivery SES reports. After the drain the
demo waits (at most 20 s) for the deliveries still pending; the summary shows
the events received, and the check *webhooks reach the application* fails
unless a ``mail.sent`` arrived for each sent job, a ``mail.delivered`` (and, for
a bouncing tenant, a ``mail.bounced``) arrived where the demo's own SES
simulates them, and every signature verified.

A tenant may have both a burst and a rate; a burst due after the load phase
(``--duration`` shorter than ``burst_at``) is left out. Mail a scenario cannot send
within ``duration + drain`` (a burst larger than its quota allows in that
time) is reported as still waiting: it is held, not lost. Keep a trickle well
under its quota (the default's 3-recipient tenant uses 3 of its 8 a second):
SQS visibility timeouts are whole seconds, so a tenant that touches its quota
pauses for up to a second more than the quota needs, and a trickle that
touches it on every mail falls behind.
"""

from __future__ import annotations

import argparse

from fairpost.config import Settings

__all__ = ["run_demo"]


def run_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Run ``fairpost demo``; return the process exit code."""
    from fairpost.mailer.demo.run import run_demo as run

    return run(args, settings)
