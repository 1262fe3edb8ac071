"""The outcome feed (docs/outcomes.md): what became of each mail, as events an
application reads (:mod:`.stream`, ``client.events(...)``) or receives as signed
webhooks (:mod:`.endpoints`, ``client.webhooks()``; delivered by the daemon).

The event format is :mod:`.feed`'s; the webhook endpoints and their delivery
queues are :mod:`.endpoints`' and :mod:`.deliveries`'. Nothing here needs AWS
or HTTP: the SDK reads and administers, the daemon delivers.
"""
