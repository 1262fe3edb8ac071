"""Webhook deliveries of the outcome feed (docs/outcomes.md), a task of ``fairpost run``.

:mod:`.loop` fans the feed's events out to the tenants' endpoints and delivers
them, :mod:`.post` makes one signed, SSRF-safe POST, :mod:`.metrics` counts.
The queues themselves are :mod:`fairpost.mailer.sdk.outcomes.deliveries`'.
"""
