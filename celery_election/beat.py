"""Leader-only beat: run ``celery beat -S celery_election.beat:LeaderScheduler`` everywhere.

Every beat process is a candidate; only the leader sends. Each due tick is *claimed*
before it is sent: a ledger row unique on (namespace, entry, nominal due time), inserted
by one statement that share-locks the lease row and checks the claimer's token, term and
unexpired lease (DESIGN.md, rule 6). The tick is sent only if the claim committed and the
leader still trusts its lease afterwards. So a tick is sent at most once, even when a
paused leader wakes up believing it still leads: its claim is refused.

Nominal due times. The ledger key is the time the schedule says the tick was due, computed
from the last *claimed* due time (kept in the shared ``beat_state`` table), never from
``last_run_at``: Celery sets that to the send time, so two schedulers would compute
different keys. A fresh interval entry is anchored on the epoch (every beat computes the
same first due time); crontab times are absolute; solar ones are rounded up to the second.

Decisions:

* A tick claimed by a leader that died (or lost its trust) before sending is **not
  resent** by default: at most once. ``election_beat_resend_unconfirmed = True`` makes a
  new leader resend ticks claimed by earlier terms but never confirmed as sent (each
  confirmation costs one more statement per tick).
* Ticks that fell due while nobody led are sent **once** per entry on takeover (missed
  ticks collapse into the latest one); ``election_beat_missed = "skip"`` skips them.
* The shared state is loaded again at every promotion (not only at start-up), so a new
  leader resumes where the old one stopped.
* Under ``celery worker -B --election`` the embedded beat shares its worker's leadership
  through the worker's shared record: it is not a second candidate.
* Nothing blocks in ``beat_init``: the elector starts in the background, and ``tick()``
  only reads an in-memory flag until this process leads.

``LeaderSchedulerMixin`` gives the same to another scheduler class, e.g.::

    class LeaderDatabaseScheduler(LeaderSchedulerMixin, DatabaseScheduler):
        pass
"""

from __future__ import annotations

import heapq
import logging
import os
import socket
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

from celery.beat import PersistentScheduler, event_t
from celery.schedules import crontab
from celery.schedules import schedule as interval

from . import shared_state
from .app import ElectionSettings
from .backends import backend_from_url
from .clock import boottime
from .config import validate_namespace
from .elector import Elector
from .errors import ConfigurationError, ElectionError
from .history import Recorder

__all__ = ["LeaderScheduler", "LeaderSchedulerMixin", "next_due"]

log = logging.getLogger("celery_election.beat")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_US = timedelta(microseconds=1)
_FOLLOWER_TICK = 0.2  # seconds between two looks at the (in-memory) leadership flag
_PRUNE_EVERY = 300.0
_OFFSET_EVERY = 60.0


def _us(dt: datetime) -> int:
    return (dt - EPOCH) // _US


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=timezone.utc)


def next_due(sched: Any, last: datetime) -> datetime:
    """The nominal due time that follows ``last`` in ``sched``, exactly (no "now" in it)."""
    last = _aware(last)
    if isinstance(sched, crontab):
        start, delta, _now = sched.remaining_delta(last)
        following: datetime = start + delta
        return _aware(following)
    if type(sched) is interval:
        step: timedelta = sched.run_every
        return last + step
    # Solar and custom schedules only offer "remaining from now", so round the event up to
    # a whole second: every beat computes the same key, and the next event after a key is
    # a later one (rounding down made the key precede its own event, which then came
    # "next" forever).
    after = last
    for _ in range(3):
        estimate: datetime = _aware(sched.now()) + sched.remaining_estimate(after)
        key = estimate.replace(microsecond=0)
        if key < estimate:
            key += timedelta(seconds=1)
        if key > last:
            return key
        after = last + timedelta(seconds=1)
    return last + timedelta(seconds=1)


def _anchor(sched: Any, now: datetime) -> datetime:
    """Where a schedule with no shared state starts: the same for every beat process."""
    if type(sched) is interval and sched.run_every.total_seconds() > 0:
        step: int = sched.run_every // _US
        return EPOCH + _US * ((_us(now) // step) * step)
    return now


def beat_namespace(app: Any, settings: ElectionSettings, *, embedded: bool) -> str:
    """Embedded beat shares its worker's namespace; standalone beats elect in their own."""
    if embedded:  # `celery worker -B --election`: the worker's leadership
        return settings.namespace
    ns = app.conf.get("election_beat_namespace") or f"{settings.namespace}-beat"
    return validate_namespace(ns)


class _BeatElection:
    """The leadership a scheduler acts on: its own Elector, or the worker's record."""

    def __init__(self, app: Any) -> None:
        conf = app.conf
        self.record = shared_state.current()
        self.settings = ElectionSettings.from_app(app)
        self.namespace = beat_namespace(app, self.settings, embedded=self.record is not None)
        missed = conf.get("election_beat_missed", "once")
        if missed not in ("once", "skip"):
            raise ConfigurationError(
                f"election_beat_missed must be 'once' or 'skip': got {missed!r}"
            )
        self.missed = missed
        self.resend = conf.get("election_beat_resend_unconfirmed", False) is True
        self.retention = float(conf.get("election_beat_ledger_retention", 86400.0))
        # Embedded, this process only claims ticks (the worker runs the election): no LISTEN.
        listen = False if self.record is not None else None
        options = self.settings.backend_options(listen=listen)
        self.backend: Any = backend_from_url(self.settings.url, **options)
        if self.settings.auto_install:
            try:
                self.backend.install()
            except ElectionError as exc:
                log.error("beat election: could not create the tables yet (%s)", exc)
        self.elector: Elector | None = None
        if self.record is None:
            self.elector = Elector(
                self.backend,
                self.namespace,
                f"beat@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
                config=self.settings.config,
            )
        history = self.settings.history_file
        self.recorder = Recorder(history, role="beat") if history else None
        if self.elector is not None:
            if self.recorder is not None:
                self.recorder.attach(self.elector)
            self.elector.start()

    def leadership(self) -> tuple[int, str] | None:
        """(term, token) while this process may act as leader, else None. No I/O."""
        if self.record is not None:
            reading = self.record.read()
            if reading.trusted() and reading.term is not None and reading.token:
                return reading.term, reading.token
            return None
        assert self.elector is not None
        term = self.elector.term
        return None if term is None else (term, self.elector.token)

    def describe(self) -> str:
        mode = "embedded: the worker's leadership" if self.record is not None else "candidate"
        return f"{self.backend.description} namespace={self.namespace!r} ({mode})"

    def close(self) -> None:
        if self.elector is not None:
            self.elector.stop()
            self.elector = None
        self.backend.close()


class LeaderSchedulerMixin:
    """Make a Celery beat scheduler send only on the leader, each tick at most once."""

    app: Any
    schedule: Any
    max_interval: float
    _heap: Any

    _election: _BeatElection | None = None
    _loaded_term: int | None = None

    # -- set-up and tear-down ---------------------------------------------------------------

    def setup_schedule(self) -> None:
        super().setup_schedule()  # type: ignore[misc]
        if self._election is None:
            self._election = _BeatElection(self.app)
            self._last_due: dict[str, datetime] = {}
            self._claims: dict[str, tuple[bool, datetime]] = {}
            self._next_prune = 0.0
            self._clock_offset = timedelta(0)
            self._next_offset = 0.0
            log.info("beat election: %s", self._election.describe())

    def close(self) -> None:
        election, self._election = self._election, None
        if election is not None:
            election.close()
        super().close()  # type: ignore[misc]

    @property
    def info(self) -> str:
        base = super().info  # type: ignore[misc]
        try:
            s = ElectionSettings.from_app(self.app)
            where = backend_description(s.url)
            ns = beat_namespace(self.app, s, embedded=shared_state.current() is not None)
            line = f"    . election -> {where} namespace={ns!r}, ttl={s.config.ttl}s"
        except ElectionError as exc:
            line = f"    . election -> misconfigured: {exc}"
        return f"{base}\n{line}" if base else line

    # -- the loop ---------------------------------------------------------------------------

    def tick(self, *args: Any, **kwargs: Any) -> float:
        election = self._election
        lead = election.leadership() if election is not None else None
        if lead is None:
            self._loaded_term = None
            return min(self.max_interval, _FOLLOWER_TICK)
        if lead[0] != self._loaded_term:
            self._next_offset = 0.0
            self._measure_offset()
            self._promote(*lead)
        self._measure_offset()
        self._maybe_prune()
        return float(super().tick(*args, **kwargs))  # type: ignore[misc]

    def _now(self) -> datetime:
        """Now on the database's clock: every beat computes the same due times from it."""
        return _aware(self.app.now()).astimezone(timezone.utc) + self._clock_offset

    def _measure_offset(self) -> None:
        """Read the database clock against this host's (one statement, leader only).

        Due times and the shared state are nominal times every beat must agree on. With
        the host clock a beat whose clock is an hour fast claimed the tick an hour ahead
        and stored it, and the next leader then waited an hour (the chaos runs skew one
        process's clock). The offset is good to half a round trip; it is measured again
        at each promotion and every minute while leading.
        """
        election = self._election
        if election is None or boottime() < self._next_offset:
            return
        self._next_offset = boottime() + _OFFSET_EVERY
        try:
            before = self.app.now().timestamp()
            lease = election.backend.current(election.namespace)
            after = self.app.now().timestamp()
        except ElectionError as exc:
            log.warning("beat election: could not read the database clock (%s)", exc)
            return
        if lease is not None:
            offset = lease.db_now_us / 1_000_000 - (before + after) / 2
            if abs(offset) > 1:
                log.warning("beat election: this host's clock is %+.3fs off the database's; "
                            "due times follow the database", -offset)  # fmt: skip
            self._clock_offset = timedelta(seconds=offset)

    def _promote(self, term: int, token: str) -> None:
        """Newly leading: resume from the shared state, not from this process's memory."""
        election = self._election
        assert election is not None
        try:
            stored = election.backend.beat_entries(election.namespace)
        except ElectionError as exc:
            log.error("beat election: cannot load the shared schedule state (%s)", exc)
            return  # _loaded_term stays unset: try again next tick
        now = self._now()
        self._last_due = {}
        for name, entry in self.schedule.items():
            if name in stored:
                due = EPOCH + _US * stored[name][0]
                entry.total_run_count = max(entry.total_run_count, stored[name][1])
            else:
                due = _anchor(entry.schedule, now)
            if election.missed == "skip":
                due = self._collapse(entry.schedule, due, now, include_last=True)
            self._last_due[name] = due
        self._loaded_term = term
        self._heap = None  # rebuilt from the loaded state
        log.info(
            "beat election: leading (term %s); resumed %d entries from the shared state",
            term,
            len(stored),
        )
        if election.resend:
            self._resend_unconfirmed(term, token)

    def _resend_unconfirmed(self, term: int, token: str) -> None:
        election = self._election
        assert election is not None
        for name, due_us, old_term in election.backend.unconfirmed_ticks(election.namespace, term):
            entry = self.schedule.get(name)
            if entry is None:
                continue
            if election.backend.reclaim_tick(
                election.namespace, token, term, name, due_us, old_term
            ):
                log.warning("beat election: resending %s due %s (never confirmed)", name, due_us)
                super().apply_entry(entry, producer=getattr(self, "producer", None))  # type: ignore[misc]
                election.backend.confirm_tick(election.namespace, name, due_us)

    def _maybe_prune(self) -> None:
        election = self._election
        if election is None or boottime() < self._next_prune:
            return
        self._next_prune = boottime() + _PRUNE_EVERY
        cutoff = _us(self._now()) - int(election.retention * 1_000_000)
        try:
            election.backend.prune_ledger(election.namespace, cutoff)
        except ElectionError as exc:
            log.warning("beat election: could not prune the ledger (%s)", exc)

    def _collapse(
        self, sched: Any, due: datetime, now: datetime, *, include_last: bool = False
    ) -> datetime:
        """The latest nominal due time <= now, starting from ``due`` (missed ticks -> one)."""
        if type(sched) is interval and sched.run_every.total_seconds() > 0:
            step: int = sched.run_every // _US
            first: datetime = due if include_last else due + sched.run_every
            if first > now:
                return due
            return first + _US * (((_us(now) - _us(first)) // step) * step)
        current = due if include_last else next_due(sched, due)
        if current > now:
            return due
        for _ in range(100_000):
            following = next_due(sched, current)
            if following > now:
                break
            current = following
        return current

    def _due(self, entry: Any) -> tuple[datetime, datetime]:
        """(the due time to claim now or next, the one after it), from the shared state."""
        last = self._last_due.get(entry.name)
        if last is None:
            last = self._last_due[entry.name] = _anchor(entry.schedule, self._now())
        now = self._now()
        due = self._collapse(entry.schedule, last, now)
        if due == last:
            due = next_due(entry.schedule, last)
        return due, next_due(entry.schedule, due)

    def is_due(self, entry: Any) -> tuple[bool, float]:
        due, following = self._due(entry)
        now = self._now()
        if due <= now:
            return True, max(0.0, (following - now).total_seconds())
        return False, (due - now).total_seconds()

    def populate_heap(self, event_t: Any = event_t, heapify: Any = heapq.heapify) -> None:
        """As Celery's, but ordered by this scheduler's own due times."""
        self._heap = []
        for entry in self.schedule.values():
            is_due, delay = self.is_due(entry)
            when = self._when(entry, 0 if is_due else delay) or 0  # type: ignore[attr-defined]
            self._heap.append(event_t(when, 5, entry))
        heapify(self._heap)

    def reserve(self, entry: Any) -> Any:
        """Claim the tick that is due (before anything is sent), then advance the entry."""
        due, _ = self._due(entry)
        election = self._election
        lead = election.leadership() if election is not None else None
        claimed = False
        if lead is not None and election is not None:
            claimed = self._claim(election, lead, entry.name, due)
        self._last_due[entry.name] = due
        self._claims[entry.name] = (claimed, due)
        return super().reserve(entry)  # type: ignore[misc]

    def _claim(
        self, election: _BeatElection, lead: tuple[int, str], name: str, due: datetime
    ) -> bool:
        """Claim, retrying a failed call while still trusted (up to one renew interval).

        A claim that raised may have committed: the retry counts a claim already held by
        this term as ours. Without the retry, a database blip at a tick's due time lost
        that tick although this process went on leading (the chaos runs found it).
        """
        deadline = boottime() + election.settings.config.renew_interval
        delay = 0.05
        retry = False
        while True:
            try:
                return bool(election.backend.claim_tick(
                    election.namespace, lead[1], lead[0], name, _us(due), retry=retry
                ))  # fmt: skip
            except ElectionError as exc:
                if boottime() + delay > deadline or election.leadership() != lead:
                    log.error("beat election: could not claim %s (%s); not sent", name, exc)
                    return False
                log.warning("beat election: claim of %s failed (%s); retrying", name, exc)
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            retry = True

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        claimed, due = self._claims.pop(entry.name, (False, None))
        election = self._election
        if not claimed or election is None or due is None:
            log.info("beat election: %s due %s was not claimed by this leader; not sent",
                     entry.name, due)  # fmt: skip
            return
        checked = boottime()  # read before the check: the history's rule for an act
        lead = election.leadership()
        if lead is None:
            log.warning(
                "beat election: %s due %s claimed, but trust ended before sending; not sent",
                entry.name,
                due,
            )
            return
        # The task can see which tick it is (self.request.election_due, epoch us) and the
        # term it was sent under, e.g. to fence its own writes.
        headers = dict(entry.options.get("headers") or {})
        headers.update(election_due=_us(due), election_term=self._loaded_term)
        original = entry.options
        entry.options = {**original, "headers": headers}
        try:
            super().apply_entry(entry, producer=producer)  # type: ignore[misc]
        finally:
            # Celery compares the schedule with a snapshot that holds this very entry: a
            # changed options dict there made every tick rebuild the whole heap.
            entry.options = original
        if election.recorder is not None:
            election.recorder.record("send", mono=checked, ns=election.namespace,
                                     term=lead[0], entry=entry.name, due=_us(due))  # fmt: skip
        if election.resend:
            assert due is not None
            election.backend.confirm_tick(election.namespace, entry.name, _us(due))


def backend_description(url: str) -> str:
    """A URL with its password hidden, for logs and banners."""
    from sqlalchemy.engine import make_url

    for prefix in ("db+", "sqla+"):
        url = url.removeprefix(prefix)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.rsplit("@", 1)[-1]


class LeaderScheduler(LeaderSchedulerMixin, PersistentScheduler):
    """PersistentScheduler that sends only on the elected beat, each tick at most once."""
