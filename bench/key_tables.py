"""What Redis keeps for a key beyond the key's ``MEMORY USAGE``: its tables' share.

``MEMORY USAGE`` counts a key's value, its name and its entry in the key table
as 24 bytes. Redis also keeps, for every key (Redis 7.0, jemalloc):

- the rest of that entry: 24 bytes allocated in jemalloc's 32-byte class
  (:data:`ENTRY_ROUNDING`);
- a slot of 8 bytes in the key table, whose slots are a power of two at least
  the keys it holds (at least 4): between 1 and 2 slots a key, 1.5 on average
  over a doubling;

and for every key with a TTL, in the expiry table, an entry of 32 bytes as
allocated (:data:`EXPIRY_ENTRY`) and a slot sized the same way. Measured on a
fresh redis-server 7.0.15, 100,000 hashes: 18.8 bytes a key beyond ``MEMORY
USAGE`` (this model: 18.5), 43.2 more once each has a TTL (42.5).

The memory model (docs/operations.md, "Redis memory per sent mail") adds
:func:`per_key` to each key a mail leaves; the soak (bench/soak.py) predicts its
growth with :func:`growth`, exact for its key counts at both ends.
"""

from __future__ import annotations

SLOT = 8
"""Bytes of one slot of a table (a pointer)."""
ENTRY_ROUNDING = 8
"""A key-table entry is 24 bytes, allocated as 32: what ``MEMORY USAGE`` leaves out."""
EXPIRY_ENTRY = 32
"""An expiry-table entry, 24 bytes, as allocated."""
AVERAGE_SLOTS = 1.5
"""Slots a key in a table, on average over a doubling (between 1 and 2)."""
LEAST_SLOTS = 4


def slots(keys: int) -> int:
    """The slots of a table that holds ``keys`` (none while it holds none)."""
    if keys <= 0:
        return 0
    size = LEAST_SLOTS
    while size < keys:
        size *= 2
    return size


def per_key(with_ttl: bool) -> float:
    """Bytes a key costs beyond its ``MEMORY USAGE``, on average over a doubling."""
    bytes_ = ENTRY_ROUNDING + SLOT * AVERAGE_SLOTS
    if with_ttl:
        bytes_ += EXPIRY_ENTRY + SLOT * AVERAGE_SLOTS
    return bytes_


def growth(keys: tuple[int, int], expires: tuple[int, int]) -> int:
    """Bytes the two tables grow by when the keys, and the keys with a TTL, go from
    the first count of each pair to the second (each table sized as Redis sizes it)."""
    (k0, k1), (e0, e1) = keys, expires
    table_slots = slots(k1) - slots(k0) + slots(e1) - slots(e0)
    return SLOT * table_slots + ENTRY_ROUNDING * (k1 - k0) + EXPIRY_ENTRY * (e1 - e0)
