"""``celery election keys`` and ``release KEY``: the singleton tasks' holds, on real databases."""

from __future__ import annotations

import json
import time
from pathlib import Path

from celery_election.backends import backend_from_url
from celery_election.election.holder import KeyHolder

from .test_cli import cli, target

__all__ = ["target"]  # the fixture, used by name


def test_keys_lists_the_holds_and_release_frees_only_the_term_seen(
    target: tuple[str, str],
) -> None:
    url, prefix = target
    assert cli(url, prefix, "install").exit_code == 0
    empty = cli(url, prefix, "keys", "-N", "jobs")
    assert empty.exit_code == 0 and "no key is held in namespace 'jobs'" in empty.output
    backend = backend_from_url(url, table_prefix=prefix)
    holder = KeyHolder(backend, "jobs", holder_id="worker-1", liveness=10.0)  # not starved by load
    try:
        a, b = holder.acquire('report:{"account":1}'), holder.acquire("report:2")
        assert a is not None and b is not None
        listed = cli(url, prefix, "keys", "-N", "jobs", "--json")
        assert listed.exit_code == 0, listed.output
        rows = {h["key"]: h for h in json.loads(listed.output)}
        assert sorted(rows) == ["report:2", 'report:{"account":1}']
        row = rows['report:{"account":1}']
        assert set(row) == {"key", "holder", "since", "held_for", "term", "expires_in", "liveness"}
        assert (row["holder"], row["term"], row["liveness"]) == ("worker-1", a.term, 10.0)
        assert row["held_for"] >= 0 and row["expires_in"] > 0 and row["since"]
        human = cli(url, prefix, "keys", "-N", "jobs")
        assert "KEY" in human.output and "HOLDER" in human.output and "TERM" in human.output
        line = next(x for x in human.output.splitlines() if x.startswith("report:2 "))
        assert "worker-1" in line and line.endswith(str(b.term))
        # fenced by the term the operator saw: an other term frees nothing
        stale = cli(url, prefix, "release", "report:2", "-N", "jobs", "--term", str(b.term - 1))
        assert stale.exit_code == 1 and "changed hands since you looked" in stale.output
        assert backend.keys.get("jobs", "report:2").held
        freed = cli(url, prefix, "release", "report:2", "-N", "jobs", "--term", str(b.term))
        assert freed.exit_code == 0 and f"term {b.term} of worker-1" in freed.output
        assert not backend.keys.get("jobs", "report:2").held
        again = cli(url, prefix, "release", "report:2", "-N", "jobs")
        assert again.exit_code == 1
        assert "key 'report:2' is not held in namespace 'jobs'" in again.output
        assert not holder.release(b)  # the holder finds its term over
        listed = json.loads(cli(url, prefix, "keys", "-N", "jobs", "--json").output)
        assert [h["key"] for h in listed] == ['report:{"account":1}']
        # a new hold of the key: the old term never frees it
        c = holder.acquire("report:2")
        assert c is not None and c.term > b.term
        old = cli(url, prefix, "release", "report:2", "-N", "jobs", "--term", str(b.term))
        assert old.exit_code == 1 and backend.keys.get("jobs", "report:2").held
        assert cli(url, prefix, "release", "report:2", "-N", "jobs").exit_code == 0
    finally:
        holder.close()
        backend.close()


def test_a_released_key_is_taken_at_once_by_the_next_holder(target: tuple[str, str]) -> None:
    url, prefix = target
    backend = backend_from_url(url, table_prefix=prefix)
    backend.install()
    stuck = KeyHolder(backend, "jobs", holder_id="stuck", ttl=3.0)
    other = KeyHolder(backend, "jobs", holder_id="other")
    try:
        held = stuck.acquire("k")
        assert held is not None and other.acquire("k", wait=False) is None
        assert cli(url, prefix, "release", "k", "-N", "jobs").exit_code == 0
        got = other.acquire("k", wait=False)
        assert got is not None and got.term > held.term
        deadline = time.monotonic() + 10
        while stuck.trusted(held):  # its renewals find nothing: it stops trusting the hold
            assert time.monotonic() < deadline, "the released holder kept trusting its hold"
            time.sleep(0.05)
    finally:
        stuck.close()
        other.close()
        backend.close()


def test_clear_errors(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path}/nothing.db"
    for args in (["keys"], ["release", "k"]):
        result = cli(missing, "x_", *args)
        assert result.exit_code == 1 and "no election database at" in result.output
        assert not (tmp_path / "nothing.db").exists()
    url = f"sqlite:///{tmp_path}/empty.db"
    backend_from_url(url, table_prefix="other_").install()  # a file, not our tables
    result = cli(url, "x_", "keys")
    assert result.exit_code == 1 and "install" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
