"""Keys as the database stores them.

A key hold is a lease of one key (``lease.Lease`` with its ``key``): one row per
(namespace, key) with a term that grows at every change of hands (the fencing token),
the holder's per-session token, and the same liveness tag as the lease. Times are epoch
microseconds on the database's clock.
"""

from __future__ import annotations

import hashlib

from ..errors import ConfigurationError
from .config import validate_namespace

__all__ = [
    "KEY_LENGTH",
    "check_key",
    "holder_lock_name",
    "key_hash",
]

#: The longest key a row keeps readable (the primary key is its hash).
KEY_LENGTH = 500
#: A holder's token: uuid4().hex, as an elector's (schema.TOKEN_LENGTH).
TOKEN_LENGTH = 32


def key_hash(key: str) -> str:
    """The key's primary key: a hash, so any key fits a MySQL index (rule 9)."""
    return hashlib.sha1(key.encode("utf-8")).hexdigest()


def holder_lock_name(token: str) -> str:
    """The liveness "namespace" that names holder ``token``'s lock (no real one has NUL)."""
    return f"key-holder\0{token}"


def check_key(namespace: str, key: object, token: object) -> str:
    """``key`` if it fits a row (else one clear error); also checks namespace and token."""
    validate_namespace(namespace)
    if not isinstance(token, str) or len(token) != TOKEN_LENGTH:
        raise ConfigurationError(f"token must be a {TOKEN_LENGTH}-character string")
    if not isinstance(key, str) or not key or len(key) > KEY_LENGTH:
        raise ConfigurationError(f"a key must be 1-{KEY_LENGTH} characters: got {key!r}")
    return key
