"""The Elector against the real databases: handoff, stalls, killed connections, outages."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from celery_election import Elector, RevokeReason
from celery_election.backends import SQLBackend, backend_from_url
from celery_election.core.clock import boottime
from celery_election.core.lease import Bid
from celery_election.election.elector import Subscription, Transition
from celery_election.errors import BackendUnavailableError
from harness.cluster import wait_until
from harness.proxy import Proxy

from ..conftest import unique_prefix

FAST = dict(ttl=2.0, renew_interval=0.4, poll_interval=0.1, safety_margin=0.5)
WAIT = 10.0


def overlapping(history: list[Transition]) -> list[tuple[Transition, Transition]]:
    """Pairs of (elected) transitions of different candidates whose belief spans overlap."""
    spans: list[tuple[str, float, float, Transition]] = []
    open_: dict[str, Transition] = {}
    for t in sorted(history, key=lambda t: t.at):
        if t.kind == "elected":
            open_[t.candidate_id] = t
        elif t.candidate_id in open_:
            start = open_.pop(t.candidate_id)
            spans.append((t.candidate_id, start.at, t.at, start))
    spans += [(c, s.at, float("inf"), s) for c, s in open_.items()]
    return [
        (a[3], b[3])
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
        if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
    ]


class Group:
    """Electors sharing one history of transitions, read from their subscriptions."""

    def __init__(self) -> None:
        self.electors: list[Elector] = []
        self.subs: list[Subscription] = []
        self.backends: list[SQLBackend] = []

    def add(self, backend: Any, name: str, **kw: Any) -> Elector:
        e = Elector(backend, "it", name, **{**FAST, **kw})
        self.electors.append(e)
        self.subs.append(e.subscribe())
        return e

    def wait_for(self, kind: str, who: str | None = None) -> Transition:
        done = threading.Event()
        found: list[Transition] = []
        # poll every subscription without consuming other candidates' events
        deadline = threading.Event()
        timer = threading.Timer(WAIT, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                for e, sub in zip(self.electors, self.subs, strict=False):
                    item = sub.get(timeout=0.02)
                    if item is None:
                        continue
                    self.history.append(item)
                    if item.kind == kind and (who is None or e.candidate_id == who):
                        found.append(item)
                        done.set()
                if done.is_set():
                    return found[0]
        finally:
            timer.cancel()
        raise AssertionError(f"no {kind} transition within {WAIT}s")

    history: list[Transition] = []

    def stop(self) -> None:
        for e in self.electors:
            e.stop()
        for sub in self.subs:
            while (item := sub.get(timeout=0)) is not None:
                self.history.append(item)
        for b in self.backends:
            b.close()


@pytest.fixture
def group() -> Iterator[Group]:
    g = Group()
    g.history = []
    yield g
    g.stop()


@pytest.fixture
def installed(sql_url: str) -> Iterator[tuple[str, str]]:
    prefix = unique_prefix()
    b = backend_from_url(sql_url, table_prefix=prefix)
    b.install()
    yield sql_url, prefix
    b.uninstall()
    b.close()


def test_three_electors_elect_one_and_hand_over_on_stop(
    installed: tuple[str, str], group: Group
) -> None:
    url, prefix = installed
    for i in range(3):
        b = backend_from_url(url, table_prefix=prefix)
        group.backends.append(b)  # type: ignore[arg-type]
        group.add(b, f"c{i}").start()
    first = group.wait_for("elected")
    leaders = [e for e in group.electors if e.is_leader]
    assert [e.candidate_id for e in leaders] == [first.candidate_id]
    # each registers from its own thread on start: the leader may win before the last one
    # has registered
    wait_until(
        lambda: {c.candidate_id for c in group.backends[0].candidates("it")} == {"c0", "c1", "c2"},
        10,
        "three registered candidates",
    )
    leaders[0].stop()
    second = group.wait_for("elected")
    assert second.candidate_id != first.candidate_id and second.term > first.term
    assert group.backends[0].current("it").leader_id == second.candidate_id
    group.stop()
    assert overlapping(group.history) == []


def test_two_electors_with_one_candidate_id_never_both_lead(
    installed: tuple[str, str], group: Group
) -> None:
    url, prefix = installed
    electors = []
    for _ in range(2):
        b = backend_from_url(url, table_prefix=prefix)
        group.backends.append(b)  # type: ignore[arg-type]
        electors.append(group.add(b, "same-host:1"))
    for e in electors:
        e.start()
    group.wait_for("elected")
    electors[0].stop() if electors[0].is_leader else electors[1].stop()
    group.wait_for("elected")
    group.stop()
    assert overlapping(group.history) == []
    assert len([t for t in group.history if t.kind == "elected"]) == 2


@pytest.fixture(params=["postgresql", "mysql"])
def server_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("pg_url" if request.param == "postgresql" else "mysql_url")


def test_a_stalled_connection_is_cut_at_the_call_deadline(server_url: str) -> None:
    proxy, via = Proxy.for_url(server_url)
    b = backend_from_url(via, table_prefix=unique_prefix())
    try:
        b.install()
        assert b.current("x", timeout=1.0) is None
        proxy.stall()
        with pytest.raises(BackendUnavailableError, match=r"did not answer within 0\.5s"):
            b.current("x", timeout=0.5)
        with pytest.raises(BackendUnavailableError):
            b.elect(Bid("x", uuid.uuid4().hex, "a", 5.0), timeout=0.5)
        proxy.resume()
        # the stalled connection was discarded; a fresh one works
        assert b.elect(Bid("x", uuid.uuid4().hex, "a", 5.0), timeout=2.0).won
    finally:
        proxy.resume()
        b.uninstall()
        b.close()
        proxy.close()


def test_a_leader_behind_a_stalled_link_steps_down_and_another_takes_over(
    server_url: str, group: Group
) -> None:
    prefix = unique_prefix()
    proxy, via = Proxy.for_url(server_url)
    stalled = backend_from_url(via, table_prefix=prefix)
    direct = backend_from_url(server_url, table_prefix=prefix)
    group.backends += [stalled, direct]  # type: ignore[list-item]
    direct.install()
    try:
        a = group.add(stalled, "behind-proxy")
        a.start()
        group.wait_for("elected", "behind-proxy")
        b = group.add(direct, "direct")
        b.start()
        proxy.stall()
        revoked = group.wait_for("revoked", "behind-proxy")
        assert revoked.reason is RevokeReason.EXPIRED
        elected = group.wait_for("elected", "direct")
        assert elected.term > revoked.term
        assert elected.at > revoked.at
        proxy.resume()
        group.stop()
        assert overlapping(group.history) == []
    finally:
        proxy.resume()
        direct.uninstall()
        proxy.close()


def test_killed_connections_are_replaced_and_leadership_survives(pg_url: str) -> None:
    """Sessions killed under a leader cost it nothing: no error, no lost term, no gap.

    Each kill ends every session of the backend's pool; the next renewal meets the dead
    connection, and the backend repeats it once on a fresh one (a renew is scoped to
    token and term, so repeating it is safe), all within the call: the elector sees a
    renewal that succeeded. The timings are wider than FAST's: the repeat opens a new
    connection inside the call's deadline (renew_interval), and under CI's load a
    connect can take longer than FAST's 0.4 s, which is a slow server, not a lost kill.
    """
    timings = dict(ttl=6.0, renew_interval=1.5, poll_interval=0.1, safety_margin=1.5)
    app_name = f"ce-test-{uuid.uuid4().hex[:8]}"
    b = backend_from_url(
        pg_url,
        table_prefix=unique_prefix(),
        engine_options={"connect_args": {"application_name": app_name}},
    )
    b.install()
    errors: list[BaseException] = []
    killer = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    e = Elector(b, "kill", "victim", on_error=errors.append, **timings)
    sub = e.subscribe()
    window = timings["ttl"] - timings["safety_margin"]

    def kill_sessions() -> set[int]:
        # pg_terminate_backend in the select list: it runs only on the rows the WHERE
        # keeps (in the WHERE, the planner may call it before the name test: on anyone)
        with killer.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": app_name},
            ).all()
        assert all(done for _, done in rows), rows
        return {pid for pid, _ in rows}

    def sessions() -> set[int]:
        with killer.connect() as conn:
            return set(
                conn.execute(
                    sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :name"),
                    {"name": app_name},
                ).scalars()
            )

    try:
        e.start()
        elected = sub.get(timeout=WAIT)
        assert elected is not None and elected.kind == "elected"
        killed: set[int] = set()
        for _ in range(3):
            pids = kill_sessions()
            assert pids, "no session of the backend to kill"
            killed |= pids
            after = boottime()
            # a renewal that started after the kill has succeeded: trust moved past it
            wait_until(
                lambda: (e.trusted_until or 0.0) >= after + window,  # noqa: B023
                WAIT,
                "a renewal after the kill",
            )
            assert e.is_leader and e.term == elected.term, f"term {elected.term} lost: {e.term}"
            live = sessions()
            assert live and not live & killed, (live, killed)  # on new connections only
        assert sub.get(timeout=0) is None  # no transition at all: never revoked
        lease = b.current("kill")
        assert lease is not None and lease.held_by(e._token) and lease.term == elected.term
        e.stop()  # joins the event thread: every error it had would be delivered now
        assert errors == []
    finally:
        e.stop()
        b.uninstall()
        b.close()
        killer.dispose()


def test_an_unreachable_database_at_start_leaves_a_follower_that_keeps_trying() -> None:
    b = backend_from_url("postgresql+psycopg://postgres@127.0.0.1:1/none", connect_timeout=1)
    errors: list[BaseException] = []
    got = threading.Event()

    def on_error(exc: BaseException) -> None:
        errors.append(exc)
        if len(errors) >= 3:
            got.set()

    e = Elector(b, "down", "lonely", on_error=on_error, **FAST)
    try:
        e.start()
        assert got.wait(WAIT)  # it retried, and is still alive
        assert all(isinstance(x, BackendUnavailableError) for x in errors)
        import psycopg

        assert isinstance(errors[0].__cause__, psycopg.OperationalError)  # the driver's own
        assert not e.is_leader and e._thread is not None and e._thread.is_alive()
    finally:
        e.stop()
        b.close()
