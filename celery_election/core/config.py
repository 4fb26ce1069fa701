"""Election timings, validated once, before anything is built.

The timings are linked: a leader renews every ``renew_interval``, each attempt may take at
most ``call_timeout``, and it trusts its lease until ``ttl - safety_margin`` after the
attempt started. So the leader must get at least two renewals into one ttl, and its trust
window must outlast one renewal interval, or it would step down between two healthy
renewals. Every problem is reported at once, with its field, setting, value and rule.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, cast

from ..errors import ConfigurationError

__all__ = [
    "MAX_CANDIDATE_ID_LENGTH",
    "MAX_NAMESPACE_LENGTH",
    "ElectionConfig",
    "Seconds",
    "validate_candidate_id",
    "validate_namespace",
    "without_celery_prefix",
]

Seconds = float | int | timedelta

#: Key columns are VARCHAR(190): the longest utf8mb4 key MySQL indexes without a prefix.
MAX_NAMESPACE_LENGTH = 190
MAX_CANDIDATE_ID_LENGTH = 255

_SETTING_PREFIX = "election_"


def _seconds(name: str, value: object, problems: list[str]) -> float | None:
    setting = _SETTING_PREFIX + name
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append(
            f"{name} ({setting}) must be a number of seconds or a timedelta: got {value!r}"
        )
        return None
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        problems.append(f"{name} ({setting}) must be a positive number of seconds: got {value!r}")
        return None
    return seconds


class _Unset(float):
    """The default of a timing that follows from ttl: filled in on construction."""

    def __repr__(self) -> str:
        return "<from ttl>"


_UNSET: float = _Unset(0.0)


@dataclass(frozen=True)
class ElectionConfig:
    """Validated election timings, in seconds. It cannot exist invalid.

    Construction fills every default that follows from ttl and checks everything at once
    (also through ``dataclasses.replace``): one ConfigurationError lists each problem
    with its field, setting, value and rule. Values are seconds or a ``timedelta``.

    ttl: how long a lease lasts without renewal. Crash failover takes about this long;
        shorter means faster failover but less tolerance for a slow database. Default 10.
    renew_interval: how often the leader renews. Default 0.4 x ttl: the leader renews
        15 times a minute at the default ttl and has 0.4 x ttl - margin left to retry.
    poll_interval: how often a follower retries when nothing wakes it earlier (on
        PostgreSQL a NOTIFY does). A clean handoff on other databases takes up to this long.
        Default min(1, renew_interval).
    jitter: each wait is stretched or shrunk by up to this fraction, so candidates do not
        march in step. Default 0.1; must be in [0, 0.5).
    safety_margin: the leader stops trusting its lease this long before the database lets
        anyone else take it; covers clock rate error (chrony may slew by 1/12). Default
        max(ttl / 5, min(1, ttl / 4)).
    call_timeout: the deadline of one database attempt; a stalled connection is shut down
        when it passes. Default renew_interval.
    resign_backoff: after a voluntary resign(), stay out of the election this long so that
        another candidate takes over. Default ttl.
    fallback_interval: with working wakeups (PostgreSQL NOTIFY) a follower sleeps until
        the lease ends, pushed back by each renewal it hears of; it still reads the row at
        least this often. A hot standby waiting on a lock that the server takes from a
        silent holder (PostgreSQL, MySQL) reads it only this often: the grant wakes it.
        Default max(60, ttl).
    candidate_ttl: a candidate row is listed as live this long after its last heartbeat;
        heartbeats go out every candidate_ttl / 3, a follower's with its look at the
        lease (one connection for both). Default 3 x fallback_interval: a waiting
        follower's heartbeat, look and renewed lock wait then come once per fallback.
    liveness: delta of the liveness session (seconds), or False for none. The leader
        holds a lock on a connection of its own and pings it every delta / 4; the server
        ends a session silent for delta, and followers waiting on the lock take over
        delta after it is released: about delta after a crash, 2 x delta after a pause
        or a cut link, instead of a whole lease. The leader's trust also ends delta after
        its last good ping. Default min(1, (ttl - safety_margin) / 4), off when that is
        under 0.2 (measured: benchmarks/RESULTS.md); at least 0.2 and less than the trust
        window (ttl - safety_margin).
    standbys: with liveness, how many followers wait on the lock (hot standbys, one
        connection each); the others hold no connection and try for a standby slot once
        per fallback_interval, so a server's connections bound the leader's hot standbys,
        not the number of candidates. 0: every follower waits on the lock. Default 2.
    """

    ttl: float = 10.0
    renew_interval: float = _UNSET
    poll_interval: float = _UNSET
    jitter: float = 0.1
    safety_margin: float = _UNSET
    call_timeout: float = _UNSET
    resign_backoff: float = _UNSET
    candidate_ttl: float = _UNSET
    fallback_interval: float = _UNSET
    liveness: float | None = _UNSET
    standbys: int = 2

    def __post_init__(self) -> None:
        problems: list[str] = []
        given: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        ttl_s = _seconds("ttl", given["ttl"], problems)
        base = ttl_s if ttl_s is not None else 10.0

        def opt(name: str, default: float) -> float | None:
            value = given[name]
            return default if value is _UNSET else _seconds(name, value, problems)

        renew = opt("renew_interval", base * 0.4)
        renew_base = renew if renew is not None else base * 0.4
        values = {
            "ttl": ttl_s,
            "renew_interval": renew,
            "poll_interval": opt("poll_interval", min(1.0, renew_base)),
            "safety_margin": opt("safety_margin", max(base / 5, min(1.0, base / 4))),
            "call_timeout": opt("call_timeout", renew_base),
            "resign_backoff": opt("resign_backoff", base),
            "fallback_interval": opt("fallback_interval", max(60.0, base)),
        }
        fallback = values["fallback_interval"]
        values["candidate_ttl"] = opt("candidate_ttl", 3 * (fallback or max(60.0, base)))
        jitter = given["jitter"]
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)):
            problems.append(f"jitter (election_jitter) must be a fraction: got {jitter!r}")
        elif not (math.isfinite(jitter) and 0 <= jitter < 0.5):
            problems.append(f"jitter (election_jitter) must be in [0, 0.5): got {jitter!r}")
        else:
            values["jitter"] = float(jitter)
        problems += _linked(ttl_s, renew, values["safety_margin"], values["call_timeout"])
        margin = values["safety_margin"]
        if given["liveness"] is _UNSET:
            window = base - (margin if margin is not None else 0.0)
            default = min(1.0, window / 4)
            liveness: float | None = default if default >= MIN_LIVENESS else None
        else:
            liveness = _liveness(given["liveness"], ttl_s, margin, problems)
        standbys = given["standbys"]
        if (
            isinstance(standbys, bool)
            or not isinstance(standbys, int)
            or not 0 <= standbys <= MAX_STANDBYS
        ):
            problems.append(
                f"standbys (election_standbys) must be a whole number from 0 to "
                f"{MAX_STANDBYS} (0: every follower waits on the lock): got {standbys!r}"
            )
        if problems:
            raise ConfigurationError(problems)
        for name, value in values.items():
            assert value is not None  # else a problem was reported
            object.__setattr__(self, name, float(value))
        object.__setattr__(self, "liveness", liveness)

    @classmethod
    def create(cls, **timings: Seconds) -> ElectionConfig:
        """Build from keyword timings (seconds or timedelta); unknown names are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(timings) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown election timing(s) {', '.join(unknown)}: use {', '.join(sorted(known))}"
            )
        return cls(**cast(Any, timings))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], **overrides: Any) -> ElectionConfig:
        """Build from ``election_*`` settings (a Celery ``app.conf`` or any mapping)."""
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = settings.get(_SETTING_PREFIX + f.name)
            if value is not None:
                kwargs[f.name] = value
        kwargs.update({k: v for k, v in overrides.items() if v is not None})
        return cls.create(**kwargs)

    @property
    def trust_window(self) -> float:
        """How long after an attempt starts its success may be trusted."""
        return self.ttl - self.safety_margin

    @property
    def heartbeat_interval(self) -> float:
        """How often a candidate refreshes its row."""
        return self.candidate_ttl / 3


def _linked(
    ttl: float | None, renew: float | None, margin: float | None, timeout: float | None
) -> list[str]:
    """The rules between timings (each checked only when its values are valid)."""
    problems: list[str] = []
    if ttl is not None and renew is not None and not ttl > 2 * renew:
        problems.append(
            f"ttl (election_ttl) must exceed 2 x renew_interval (election_renew_interval): "
            f"got ttl={ttl}s, renew_interval={renew}s"
        )
    if ttl is not None and renew is not None and margin is not None and not margin < ttl - renew:
        problems.append(
            f"safety_margin (election_safety_margin) must be less than "
            f"ttl - renew_interval, or the leader stops trusting its lease before "
            f"it renews: got safety_margin={margin}s, ttl={ttl}s, renew_interval={renew}s"
        )
    if renew is not None and timeout is not None and timeout > renew:
        problems.append(
            f"call_timeout (election_call_timeout) must not exceed renew_interval: "
            f"got call_timeout={timeout}s, renew_interval={renew}s"
        )
    return problems


#: The most standby slots a lock session names (backends/locks.py).
MAX_STANDBYS = 64

#: Below this a liveness delta ends leadership at a GC pause (benchmarks/liveness.py).
MIN_LIVENESS = 0.2


def _liveness(
    value: object, ttl: float | None, margin: float | None, problems: list[str]
) -> float | None:
    """The liveness delta in seconds, or None when off (False or None)."""
    if value is None or value is False:
        return None
    delta = _seconds("liveness", value, problems)
    if delta is None:
        return None
    if delta < MIN_LIVENESS:
        problems.append(
            f"liveness (election_liveness) must be at least {MIN_LIVENESS}s (or False to "
            f"turn it off): a shorter delta ends leadership at a GC pause; got {value!r}"
        )
    elif ttl is not None and margin is not None and not delta < ttl - margin:
        problems.append(
            f"liveness (election_liveness) must be less than the trust window "
            f"ttl - safety_margin ({ttl - margin:g}s), or the lease would end first: "
            f"got {value!r}"
        )
    return delta


def _check_key(kind: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{kind} must be a string: got {value!r}")
    if not value or value != value.strip():
        raise ConfigurationError(
            f"{kind} must be non-empty without leading or trailing spaces: got {value!r}"
        )
    if len(value) > limit:
        raise ConfigurationError(
            f"{kind} must be at most {limit} characters: got {len(value)} ({value[:40]!r}...)"
        )
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ConfigurationError(f"{kind} must not contain control characters: got {value!r}")
    return value


def validate_namespace(namespace: object) -> str:
    """Return the namespace, or raise ConfigurationError saying what is wrong with it."""
    return _check_key("namespace (election_namespace)", namespace, MAX_NAMESPACE_LENGTH)


def validate_candidate_id(candidate_id: object) -> str:
    """Return the candidate id, or raise ConfigurationError saying what is wrong with it."""
    return _check_key("candidate_id", candidate_id, MAX_CANDIDATE_ID_LENGTH)


def without_celery_prefix(url: str) -> str:
    """``url`` without Celery's ``db+`` (result backend) or ``sqla+`` (kombu) prefix."""
    for prefix in ("db+", "sqla+"):
        url = url.removeprefix(prefix)
    return url
