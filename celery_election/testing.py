"""Leadership under a test's control: leader tasks as leader, as follower, across failover.

Eagerly (``apply()``, ``task_always_eager``) or in Celery's in-process test worker.

A leader task decides at its start whether it may run by reading this process's shared
leadership record (``shared_state``), which a worker's elector writes. In a test there is
no elector, so every leader task is a follower: skipped, requeued or refused. A
controller installs a record of its own and says what it holds::

    with Leadership() as election:
        election.lead()                       # this process leads: term 1
        assert refresh.apply().get() == 1     # self.election_term is 1
        election.failover()                   # term 2; a task still running keeps 1
        election.follow()                     # another worker leads now
        assert refresh.apply().state == "IGNORED"   # on_follower="skip"

* :class:`Leadership` writes the record directly: no thread, no database, any term.
* :class:`ElectedLeadership` has the same methods, but goes through the real protocol:
  two Electors ("this worker" and "another worker") on one :class:`MemoryBackend` whose
  clock is a :class:`FakeClock`; the record is written from this worker's elector's trust
  watcher, as the worker bootstep does. Terms are then the backend's (large numbers).
* :func:`worker` starts Celery's in-process test worker on an app, consuming the leader
  queue whatever the leadership (a follower must receive leader tasks to show what it does
  with them), with the worker's own elector off so the controller stays in charge.

The pytest plugin (``celery_election.pytest_plugin``, loaded by the ``pytest11`` entry
point) wraps these in fixtures: ``election``, ``election_follower``, ``election_protocol``
and ``election_worker``.

This module never imports pytest or Celery: :func:`worker` and :func:`leader_queues` live on
the Celery side (``bootstep``, ``tasks``) and load on first use.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from .backends.memory import MemoryBackend
from .core.clock import FakeClock, boottime
from .core.config import ElectionConfig
from .election import shared_state
from .election.elector import Elector
from .election.shared_state import ENV_VAR, SharedLeadership
from .errors import ElectionError

__all__ = ["ElectedLeadership", "Leadership", "leader_queues", "worker"]

#: Celery-side names, resolved on first use as the package root does, so this kit loads
#: without Celery (a FastAPI service's tests use Leadership too).
_LAZY = {
    "worker": (".integration.bootstep", "in_process_worker"),
    "leader_queues": (".integration.tasks", "leader_queues"),
}

if TYPE_CHECKING:
    from .integration.bootstep import in_process_worker as worker
    from .integration.tasks import leader_queues


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module, __package__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The record's trust deadline while a controller says "leader": a fake clock never runs
#: out on its own, so the trust window ends only when the controller ends it.
_FOREVER = float("inf")

_C = TypeVar("_C", bound="_Controller")


class _Controller:
    """What both controllers share: the record, its installation, and the term views."""

    def __init__(self) -> None:
        self._record: SharedLeadership | None = None
        self._saved: tuple[SharedLeadership | None, str | None] | None = None

    # -- installation -----------------------------------------------------------------------

    def install(self: _C) -> _C:
        """Make this controller's record the process's (and its children's); returns self.

        The record that was installed before (a worker's, another controller's) comes back
        on :meth:`close`. Until :meth:`lead`, the record says "not leader".
        """
        if self._record is None:
            self._saved = (shared_state.in_use(), os.environ.get(ENV_VAR))
            self._record = SharedLeadership.create()  # "not leader"; path in ENV_VAR
            shared_state.use(self._record)
        return self

    def close(self) -> None:
        """Give the process its previous record back and remove this one (idempotent)."""
        record, saved = self._record, self._saved
        if record is None or saved is None:
            return
        self._record = self._saved = None
        previous, path = saved
        shared_state.use(previous)
        record.write(None, None)
        record.close()
        if path is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = path

    def __enter__(self: _C) -> _C:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def record(self) -> SharedLeadership:
        """The installed record (what every leader task of this process reads)."""
        if self._record is None:
            raise ElectionError(
                f"{type(self).__name__} is not installed: use it as a context manager "
                "(or call install(), and close() after)"
            )
        return self._record

    # -- the views --------------------------------------------------------------------------

    @property
    def term(self) -> int | None:
        """The term this process leads under, as a leader task starting now sees it.

        None when following (or past the trust window): ``self.election_term`` and
        ``current_term()`` in a task report the same value.
        """
        return None if self._record is None else self._record.leader_term()

    @property
    def leading(self) -> bool:
        """Whether a leader task starting now runs its body."""
        return self.term is not None

    # -- changes (the subclasses') ----------------------------------------------------------

    def lead(self, term: int | None = None) -> int:
        raise NotImplementedError

    def follow(self) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def as_leader(self, term: int | None = None) -> Iterator[int]:
        """Lead for the ``with`` block (yields the term); follow again after if we did."""
        was_leading = self.leading
        try:
            yield self.lead(term)
        finally:
            if not was_leading:
                self.follow()

    @contextlib.contextmanager
    def as_follower(self) -> Iterator[None]:
        """Follow for the ``with`` block; lead again after (a new term) if we led."""
        was_leading = self.leading
        self.follow()
        try:
            yield
        finally:
            if was_leading:
                self.lead()


class Leadership(_Controller):
    """Scripted leadership of this process: each change is written to the record at once.

    Terms start at 1 and only grow, as a real election's do; :attr:`latest_term` is the
    greatest one issued, whoever holds it. Use it as a context manager (it installs its
    record and restores the previous one on exit)::

        with Leadership() as election:
            election.lead()
            ...
    """

    def __init__(self) -> None:
        super().__init__()
        self._latest = 0
        self._held: int | None = None  # the term this process holds, trusted or not
        #: Every term issued, in order, with who took it ("this" or "other").
        self.history: list[tuple[int, str]] = []

    @property
    def latest_term(self) -> int:
        """The greatest term issued so far (0 before the first): the election's current term."""
        return self._latest

    def _issue(self, term: int | None, holder: str) -> int:
        if term is None:
            term = self._latest + 1
        elif isinstance(term, bool) or not isinstance(term, int) or term < 1:
            raise ValueError(f"term must be a positive int: got {term!r}")
        elif term <= self._latest:
            raise ValueError(
                f"terms only grow: term {term} is not greater than the latest, {self._latest}"
            )
        self._latest = term
        self.history.append((term, holder))
        return term

    def lead(self, term: int | None = None) -> int:
        """Lead from now on; returns the term.

        Already leading (and trusted): keeps its term (``term``, if given, must be that
        one or a greater, new one). Otherwise a new term: ``term`` if given, else the
        latest + 1.
        """
        record = self.record
        current = self.term
        if current is not None and term in (None, current):
            return current
        new = self._issue(term, "this")
        self._held = new
        record.write(new, _FOREVER)
        return new

    def follow(self) -> None:
        """Stop leading (another worker leads, or nobody): no new term."""
        self._held = None
        self.record.write(None, None)

    def failover(self, *, elsewhere: bool = False) -> int:
        """The election moves to a new, greater term while this process lives; returns it.

        Leader tasks started after this see the new term; one still running keeps the term
        it started under (``self.election_term``), so a write it fences with that term
        must now be refused. ``elsewhere=True``: another worker took the new term, so this
        process follows.
        """
        record = self.record
        new = self._issue(None, "other" if elsewhere else "this")
        if elsewhere:
            self._held = None
            record.write(None, None)
        else:
            self._held = new
            record.write(new, _FOREVER)
        return new

    def expire(self) -> None:
        """End the trust window without a new term (as when renewals stop).

        The record still names the term but its deadline has passed: leader tasks act as
        on a follower. :meth:`lead` after this takes a new term, as a real elector does.
        """
        record = self.record
        if self._held is not None:
            record.write(self._held, boottime() - 1.0)
        self._held = None


class ElectedLeadership(_Controller):
    """Leadership of this process through the real protocol, on a fake clock.

    Two candidates on one :class:`MemoryBackend` (``backend``) whose clock is a
    :class:`FakeClock` (``clock``): ``elector``, this worker's Elector (its trust watcher
    writes the record, as the worker bootstep's does), and ``rival``, another worker's.
    Each change returns once the electors agree on it (real time, at most ``timeout``
    seconds; usually a few milliseconds). Terms are the backend's: large and increasing.

    * :meth:`lead`: the rival (if leading) resigns and stops; a fresh elector of this
      worker wins the next term.
    * :meth:`follow`: this worker's elector stops (resigning its term); the rival wins.
    * :meth:`failover`: if this worker leads, fake time jumps past ``ttl`` with no renewal
      (a paused process, a stalled database): its trust ends, its renewal fails, and it
      wins the next term. With ``elsewhere=True`` the leader resigns while running (as
      ``celery election resign`` makes it) and the rival wins the next term.
    """

    def __init__(
        self,
        namespace: str = "testing",
        *,
        config: ElectionConfig | None = None,
        timeout: float = 5.0,
    ) -> None:
        super().__init__()
        self.namespace = namespace
        self.config = config or ElectionConfig()
        self.timeout = timeout
        self.clock = FakeClock()
        self.backend = MemoryBackend(self.clock)
        #: This worker's elector (a fresh one each time this worker must win again).
        self.elector: Elector | None = None
        #: Another worker's elector.
        self.rival: Elector | None = None
        self._count = 0

    @property
    def latest_term(self) -> int:
        """The term in the lease row (0 before the first election)."""
        lease = self.backend.current(self.namespace)
        return lease.term if lease is not None else 0

    # -- electors ---------------------------------------------------------------------------

    def _new(self, who: str) -> Elector:
        self._count += 1
        elector = Elector(
            self.backend,
            self.namespace,
            f"{who}-{self._count}",
            config=self.config,
            clock=self.clock,
            register=False,
        )
        if who == "this-worker":
            record = self.record
            token = elector.token

            def publish(term: int | None, until: float | None) -> None:
                # ``until`` is on the fake clock; the record is read on the real one. The
                # elector ends trust (term None) when fake time passes it: until then,
                # trust is unbounded in real time.
                if self.elector is elector and self._record is record:
                    record.write(term, None if term is None else _FOREVER, token)

            self.elector = elector  # before start: the first election may come at once
            elector.watch_trust(publish)
        else:
            self.rival = elector
        return elector.start()

    def _stop(self, elector: Elector | None) -> None:
        if elector is not None:
            elector.stop()

    def _wait(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not done():
            if time.monotonic() > deadline:
                raise ElectionError(f"{what}: not done after {self.timeout}s ({self!r})")
            time.sleep(0.001)

    def _this_term(self) -> int | None:
        e = self.elector
        term = e.term if e is not None else None
        # the record, not only the elector: tasks read the record
        return term if term is not None and self.term == term else None

    def __repr__(self) -> str:
        return f"<ElectedLeadership elector={self.elector!r} rival={self.rival!r}>"

    # -- changes ----------------------------------------------------------------------------

    def lead(self, term: int | None = None) -> int:
        """Win the next term (or keep the one this worker leads under); returns it."""
        self.record  # noqa: B018  (installed?)
        if term is not None:
            raise ValueError("ElectedLeadership cannot choose a term: the backend does")
        held = self._this_term()
        if held is not None:
            return held
        self._stop(self.rival)
        self._stop(self.elector)
        self._new("this-worker")
        self._wait(lambda: self._this_term() is not None, "this worker to be elected")
        result = self._this_term()
        assert result is not None
        return result

    def follow(self) -> None:
        """Stop this worker's elector (it resigns its term); the rival leads."""
        self.record  # noqa: B018
        self._stop(self.elector)
        rival = self.rival
        if rival is None or not rival.is_leader:
            self._stop(rival)
            rival = self._new("other-worker")
        self._wait(lambda: rival.is_leader and self.term is None, "the other worker to lead")

    def failover(self, *, elsewhere: bool = False) -> int:
        """A new, greater term while the old leader lives; returns it.

        The new term goes to this worker, or with ``elsewhere=True`` to the other one. If
        the winner leads already, fake time jumps past ``ttl`` with no renewal (a paused
        process, a stalled database): its trust ends, its renewal fails, it wins the next
        term. Otherwise the leader resigns while running (as ``celery election resign``
        makes it; it then stays out for ``resign_backoff`` of fake time) and a fresh
        elector of the winner takes the next term. With nobody leading, the winner is
        elected.
        """
        self.record  # noqa: B018  (installed?)
        before = self.latest_term
        mine = self.elector if self._this_term() is not None else None
        theirs = self.rival if self.rival is not None and self.rival.is_leader else None
        leader = mine or theirs

        def winner() -> Elector | None:
            return self.rival if elsewhere else self.elector

        if leader is not None and leader is winner():
            self._stop(self.elector if elsewhere else self.rival)  # the leader alone runs
            self.clock.advance(self.config.ttl + 0.001)
        else:
            self._stop(winner())  # a fresh winner: no resign backoff in its way
            if leader is not None:
                leader.resign()
            else:
                self._stop(self.elector if elsewhere else self.rival)
            self._new("other-worker" if elsewhere else "this-worker")

        def won() -> bool:
            w = winner()
            term = w.term if w is not None else None
            if term is None or term <= before:
                return False
            return self.term is None if elsewhere else self.term == term

        self._wait(won, "the next term to be won")
        w = winner()
        assert w is not None and w.term is not None
        return w.term

    def close(self) -> None:
        """Stop both electors, then give the process its previous record back."""
        self._stop(self.elector)
        self._stop(self.rival)
        self.backend.close()
        super().close()
