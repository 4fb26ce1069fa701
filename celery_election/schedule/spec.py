"""What a stored schedule entry means: its schedule as a spec (JSON), and its policies.

A spec is plain data, stored as JSON by ``schedule/store.py``; ``from_spec`` gives
the Celery schedule it stands for (an interval, a crontab in its own time zone, a solar
event, or one run at a time), ``to_spec`` the spec of a Celery schedule or of an
operator's text (``parse_schedule``). ``check_spec`` and ``check_policies`` refuse what
cannot be built, with one line that says what to write instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from celery.schedules import BaseSchedule, crontab, schedstate, solar
from celery.schedules import schedule as interval

from ..errors import ConfigurationError
from .cron import CronFields, next_run

__all__ = [
    "CATCH_UP",
    "OVERLAP",
    "POLICY_DEFAULTS",
    "RESUME",
    "SKIP_GRACE",
    "OneOff",
    "ZonedCrontab",
    "check_policies",
    "check_spec",
    "describe",
    "from_spec",
    "instant",
    "parse_schedule",
    "to_spec",
]

CATCH_UP = ("latest", "skip", "all")
OVERLAP = ("allow", "skip")
RESUME = ("skip", "catch_up")
POLICY_DEFAULTS: dict[str, Any] = {
    "catch_up": "latest",
    "catch_up_max": 10,
    "grace": None,
    "overlap": "allow",
    "overlap_timeout": 3600.0,
}
SKIP_GRACE = 1.0  # catch_up="skip" without a grace: a run later than this was missed


class ZonedCrontab(crontab):  # type: ignore[misc]
    """A crontab read in its own time zone (``tz``), not the app's, with cron's DST rules.

    When it runs next is ``cron.next_run`` (Vixie cron's rules for repeated and skipped
    wall-clock times, over UTC instants), not Celery's local-time arithmetic, which at a
    fall-back can answer due at every tick or skip the repeated hour's runs.
    """

    def __init__(self, *args: Any, tz: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zone = tz
        self.tz = ZoneInfo(tz)
        self._fields = CronFields.of(self)

    def remaining_estimate(self, last_run_at: datetime, ffwd: Any = None) -> timedelta:
        """Time from now to the first run after ``last_run_at`` (negative: overdue)."""
        now: datetime = self.maybe_make_aware(self.now())
        following = next_run(self._fields, self.tz, self.maybe_make_aware(last_run_at))
        if following is None:  # no date matches (e.g. day 31 of February): never
            return timedelta(days=36500)
        return following - now

    def __reduce__(self) -> tuple[Any, ...]:
        return (_zoned, (self._orig_minute, self._orig_hour, self._orig_day_of_week,
                         self._orig_day_of_month, self._orig_month_of_year, self.zone))  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ZonedCrontab) and other.zone != self.zone:
            return False
        return bool(super().__eq__(other))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<crontab: {cron_text(self)} ({self.zone})>"


def _zoned(m: str, h: str, dow: str, dom: str, moy: str, tz: str) -> ZonedCrontab:
    return ZonedCrontab(m, h, dow, dom, moy, tz=tz)


class OneOff(BaseSchedule):  # type: ignore[misc]
    """Due once, at ``at``: after the run that followed it, never again."""

    def __init__(self, at: datetime, nowfun: Any = None, app: Any = None) -> None:
        super().__init__(nowfun=nowfun, app=app)
        self.at = at

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        now: datetime = self.maybe_make_aware(self.now())
        return self.at - now

    def is_due(self, last_run_at: datetime) -> schedstate:
        if self.maybe_make_aware(last_run_at) >= self.at:
            return schedstate(False, 86400.0)  # it ran
        left = self.remaining_estimate(last_run_at).total_seconds()
        return schedstate(left <= 0, 86400.0 if left <= 0 else left)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OneOff) and other.at == self.at

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (OneOff, (self.at,))

    def __repr__(self) -> str:
        return f"<once: {self.at.isoformat()}>"


def cron_text(c: crontab) -> str:
    fields = (c._orig_minute, c._orig_hour, c._orig_day_of_month, c._orig_month_of_year,
              c._orig_day_of_week)  # fmt: skip
    return " ".join(str(f) for f in fields)


_EVERY = re.compile(
    r"(?:every\s+)?(\d+(?:\.\d+)?)\s*(s|sec|seconds?|m|min|minutes?|h|hours?|d|days?)?"
)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_schedule(text: str, *, tz: str | None = None) -> dict[str, Any]:
    """A schedule written by an operator, as a spec.

    "every 10s" (or "30", s/m/h/d), "*/5 * * * *" (minute hour day-of-month month
    day-of-week), "at 2026-12-01T10:00:00+00:00", "sunrise 48.85 2.35" (solar event,
    latitude, longitude).
    """
    words = text.strip()
    m = _EVERY.fullmatch(words.lower())
    if m:
        unit = (m.group(2) or "s")[0]
        return check_spec({"every": float(m.group(1)) * _UNITS[unit]})
    if words.lower().startswith("at "):
        return check_spec({"at": words[3:].strip()})
    fields = words.split()
    if len(fields) == 3 and fields[0].lower() in solar._all_events:
        return check_spec({"solar": fields[0].lower(), "lat": fields[1], "lon": fields[2]})
    if len(fields) == 5:
        return check_spec({"cron": words, "tz": tz})
    raise ConfigurationError(
        f"cannot read the schedule {text!r}: write 'every 10s' (s/m/h/d), a crontab of 5 "
        f"fields ('*/5 * * * *'), 'at 2026-12-01T10:00:00+00:00' or 'sunrise LAT LON'"
    )


def to_spec(value: Any, *, tz: str | None = None) -> dict[str, Any]:
    """A schedule (Celery's objects, a timedelta, seconds, a datetime or text) as a spec."""
    if isinstance(value, str):
        return parse_schedule(value, tz=tz)
    if isinstance(value, dict):
        return check_spec(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return check_spec({"every": float(value)})
    if isinstance(value, timedelta):
        return check_spec({"every": value.total_seconds()})
    if isinstance(value, datetime):
        return check_spec({"at": value.isoformat()})
    if isinstance(value, crontab):  # a ZonedCrontab in its own zone
        return check_spec({"cron": cron_text(value), "tz": getattr(value, "zone", tz)})
    if isinstance(value, solar):
        return check_spec({"solar": value.event, "lat": value.lat, "lon": value.lon})
    if isinstance(value, interval):
        return check_spec({"every": value.run_every.total_seconds()})
    if isinstance(value, OneOff):
        return check_spec({"at": value.at.isoformat()})
    raise ConfigurationError(
        f"unsupported schedule {value!r}: use seconds, a timedelta, crontab(...), "
        f"solar(...), a datetime or text such as 'every 10s'"
    )


def check_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec, normalised, if ``from_spec`` can build it; else one clear error."""
    out = {k: v for k, v in spec.items() if v is not None}
    if "tz" in out:
        try:
            ZoneInfo(str(out["tz"]))
        except (ZoneInfoNotFoundError, ValueError):
            raise ConfigurationError(
                f"unknown time zone {out['tz']!r}: use an IANA name such as 'Europe/Paris' or 'UTC'"
            ) from None
    if "every" in out:
        try:
            out["every"] = float(out["every"])
        except (TypeError, ValueError):
            out["every"] = 0.0
        if not out["every"] > 0:
            raise ConfigurationError(f"an interval must be > 0 seconds: got {spec['every']!r}")
    elif "cron" in out:
        fields = str(out["cron"]).split()
        try:
            if len(fields) != 5:
                raise ValueError("5 fields: minute hour day-of-month month day-of-week")
            from_spec({"cron": " ".join(fields)})  # Celery's crontab checks each field
        except ValueError as exc:
            raise ConfigurationError(f"bad crontab {out['cron']!r}: {exc}") from None
        out["cron"] = " ".join(fields)
    elif "solar" in out:
        try:
            solar(str(out["solar"]), float(out["lat"]), float(out["lon"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(
                f"bad solar schedule {dict(spec)!r}: {exc} (events: "
                f"{', '.join(sorted(solar._all_events))})"
            ) from None
        out["lat"], out["lon"] = float(out["lat"]), float(out["lon"])
    elif "at" in out:
        out["at"] = instant(out["at"]).isoformat()
    else:
        raise ConfigurationError(f"a schedule needs every, cron, solar or at: got {dict(spec)!r}")
    return out


def instant(value: Any) -> datetime:
    try:
        when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    except ValueError:
        raise ConfigurationError(
            f"bad time {value!r}: use ISO 8601 with a zone, e.g. 2026-12-01T10:00:00+00:00"
        ) from None
    if when.tzinfo is None:
        raise ConfigurationError(f"the time {value!r} has no zone: add one, e.g. +00:00")
    return when


def from_spec(spec: Mapping[str, Any], app: Any = None) -> BaseSchedule:
    """The Celery schedule a spec stands for."""
    if "every" in spec:
        return interval(timedelta(seconds=float(spec["every"])), app=app)
    if "cron" in spec:
        m, h, dom, moy, dow = str(spec["cron"]).split()
        if spec.get("tz"):
            return ZonedCrontab(m, h, dow, dom, moy, tz=str(spec["tz"]), app=app)
        return crontab(m, h, dow, dom, moy, app=app)
    if "solar" in spec:
        return solar(spec["solar"], float(spec["lat"]), float(spec["lon"]), app=app)
    return OneOff(instant(spec["at"]), app=app)


def describe(spec: Mapping[str, Any]) -> str:
    """A schedule in words, in its own time zone."""
    if "every" in spec:
        seconds = float(spec["every"])
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size and seconds % size == 0:
                return f"every {int(seconds // size)}{unit}"
        return f"every {seconds:g}s"
    if "cron" in spec:
        return f"cron {spec['cron']} ({spec.get('tz') or 'app time zone'})"
    if "solar" in spec:
        return f"at {spec['solar']} ({spec['lat']}, {spec['lon']})"
    return f"once at {spec['at']}"


def check_policies(values: Mapping[str, Any]) -> dict[str, Any]:
    """Policies with their defaults, checked; one clear error for a bad one."""
    out = {**POLICY_DEFAULTS, **{k: v for k, v in values.items() if k in POLICY_DEFAULTS}}
    for name, choices in (("catch_up", CATCH_UP), ("overlap", OVERLAP)):
        if out[name] not in choices:
            raise ConfigurationError(
                f"{name} must be one of {', '.join(choices)}: got {out[name]!r}"
            )
    for name, low in (("catch_up_max", 1), ("grace", 0), ("overlap_timeout", 0)):
        value = out[name]
        if value is None and name == "grace":
            continue
        try:
            number = int(value) if name == "catch_up_max" else float(value)
        except (TypeError, ValueError):
            number = low - 1
        if number < low or (low == 0 and number <= 0 and name == "overlap_timeout"):
            raise ConfigurationError(f"{name} must be a number >= {low}: got {value!r}")
        out[name] = number
    return out
