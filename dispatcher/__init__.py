"""A generic fair dispatcher: per-tenant queues in Redis, deficit round robin, leases."""
