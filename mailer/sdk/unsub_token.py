"""Unsubscribe tokens: who may stop which mail, signed, small enough for a header.

A token names a tenant, a recipient address, a topic and an expiry, and is
signed with HMAC-SHA256 under the first of ``FAIRPOST_UNSUBSCRIBE__KEYS``; every
key in the list verifies, so a key is rotated by putting a new one first and
dropping the old one once its tokens have expired. It is written in base32,
lower case and unpadded: safe in a URL path and in a mail address's local part,
where case may not survive.

Layout (before base32): version (1 byte), key id (1 byte: the first of the
key's SHA-256, to find the key without trying each), expiry (4 bytes, Unix
seconds), ``tenant \\x1f address \\x1f topic`` (UTF-8), then the first 12 bytes
of the HMAC over everything before it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from fairpost.mailer.errors import InvalidToken

__all__ = ["Token", "sign", "verify"]

VERSION = 1
_TAG_BYTES = 12
_HEAD = struct.Struct(">BBI")
_SEP = "\x1f"


@dataclass(frozen=True)
class Token:
    tenant: str
    address: str
    topic: str
    expires: int
    """Unix seconds."""


def _key_id(key: bytes) -> int:
    return hashlib.sha256(key).digest()[0]


def _tag(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()[:_TAG_BYTES]


def sign(token: Token, key: bytes) -> str:
    text = _SEP.join((token.tenant, token.address, token.topic))
    body = _HEAD.pack(VERSION, _key_id(key), token.expires) + text.encode()
    return base64.b32encode(body + _tag(key, body)).decode().rstrip("=").lower()


def verify(text: str, keys: Sequence[bytes], now: float) -> Token:
    """The token ``text`` names, or :class:`InvalidToken` (malformed, forged or expired)."""
    if not keys:
        raise InvalidToken("forged")
    try:
        raw = base64.b32decode(text.upper() + "=" * (-len(text) % 8))
    except (ValueError, TypeError):
        raise InvalidToken("malformed") from None
    if len(raw) < _HEAD.size + _TAG_BYTES:
        raise InvalidToken("malformed")
    body, tag = raw[:-_TAG_BYTES], raw[-_TAG_BYTES:]
    version, key_id, expires = _HEAD.unpack_from(body)
    if version != VERSION:
        raise InvalidToken("malformed")
    # Every key is tried whose id matches (two keys may share an id): compare_digest
    # each time, so the time taken says nothing of the tag.
    if not any(_key_id(k) == key_id and hmac.compare_digest(_tag(k, body), tag) for k in keys):
        raise InvalidToken("forged")
    if expires < now:
        raise InvalidToken("expired")
    try:
        tenant, address, topic = body[_HEAD.size :].decode().split(_SEP)
    except ValueError:
        raise InvalidToken("malformed") from None
    return Token(tenant, address, topic, expires)
