# ruff: noqa: E501  (each mutation quotes an exact line of source)
"""Targeted hand mutations: every safety condition, removed or weakened, must fail a test.

    .venv/bin/python -m harness.mutations                 # every mutation; a table; exit 1
    .venv/bin/python -m harness.mutations --only sched    # the ids that start with "sched"
    .venv/bin/python -m harness.mutations --json out.json

Each mutation replaces one exact piece of source (a WHERE condition of a step or a claim,
a trust bound, a fence, a configuration rule) with a weaker one, runs the tests that
should notice (``-x``: the first failure kills it), and puts the source back. A mutation
that leaves them green *survived*: either a test is missing or the mutation is
equivalent, and ``EQUIVALENT`` says why for the ones known to be. Run it on a clean
tree: it refuses if a file it mutates has uncommitted changes. (mutmut was the
alternative; it mutates every operator of a module, most of them not safety conditions,
and takes hours here.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEASE = ["tests/integration/test_hold_suite.py", "tests/integration/test_backend_suite.py",
         "tests/unit/test_liveness_rules.py"]  # fmt: skip
STATEFUL = ["tests/integration/test_stateful.py"]
BEAT = ["tests/integration/test_beat_runs.py"]
SCHED = [
    "tests/integration/test_schedule_store.py",
    "tests/unit/test_schedule_rules.py",
    "tests/integration/test_schedule_beat.py",
]


@dataclass(frozen=True)
class Mutation:
    id: str
    file: str
    old: str
    new: str
    tests: list[str]


M = Mutation
SQL_LEASE = "celery_election/backends/sql_lease.py"
SQL_CALLS = "celery_election/backends/sql_calls.py"
MEM = "celery_election/backends/memory.py"
MEM_HOLD = "celery_election/backends/memory_hold.py"
SQL_BEAT = "celery_election/backends/sql_beat.py"
MEM_BEAT = "celery_election/backends/memory_beat.py"
SCHEDULER = "celery_election/beat/scheduler.py"
SENDER = "celery_election/beat/sender.py"
LEDGER_PY = "celery_election/beat/ledger.py"
LEDGER = ["tests/integration/test_run_ledger.py"]
CLI_KEYS = "celery_election/keys/cli.py"
KEY_CLI = ["tests/integration/test_cli_keys.py"]
KEY_THREADS = ["tests/unit/test_key_holder_threads.py"]
KEY_KIT = ["tests/unit/test_singleton_kit.py"]
LEDGER_BEAT = ["tests/unit/test_ledger_beat.py", "tests/unit/test_beat.py"]
SQL_SCHED = "celery_election/schedule/store.py"
OPS = "celery_election/beat/ops.py"
DEC = "celery_election/core/decisions.py"
LOOP = "celery_election/election/loop.py"
LOCKS = "celery_election/backends/locks.py"
MYSQL_DIALECT = "celery_election/backends/dialect_mysql.py"
CONNECTION = "celery_election/backends/connection.py"
TOPOLOGIES = ["tests/integration/test_pg_topologies.py"]
BELIEF = "celery_election/election/belief.py"
RULES = ["tests/unit/test_decisions.py", "tests/unit/test_liveness_rules.py"]
ELECTION = [
    "tests/unit/test_belief.py",
    "tests/unit/test_elector.py",
    "tests/unit/test_liveness_rules.py",
]
ELIGIBLE = ["tests/unit/test_eligible.py"]
TRANSFER = ["tests/integration/test_transfer_suite.py"]
RUNSTATE = "celery_election/core/runstate.py"
MEM_RUNS = "celery_election/backends/memory_runs.py"
#: the simulation alone (not the tables): what it finds, it finds without being told
SIM = ["tests/unit/test_run_simulation.py::test_every_schedule_keeps_each_run_once"]
#: a release by another delivery needs a worker paused past its liveness while its key was
#: busy, then a takeover, then another copy: the simulation meets that about once in 10^5
RELEASE_TABLE = [
    "tests/unit/test_runstate.py::test_release_and_finish_belong_to_the_starting_delivery"
]
#: what the simulation cannot see (its schedule never changes): the store's own test
STORE_FENCES = [
    "tests/unit/test_runstate.py::test_the_memory_store_fences_the_claim_and_the_owed_runs_by_the_lease"
]
HANDOVER = ["tests/unit/test_transfer.py"]
RELEASE = ["tests/unit/test_release.py"]
RELEASE_LOCK = ["tests/unit/test_release.py", "tests/unit/test_eligible.py"]
BEAT_SCHED = "celery_election/beat/scheduler.py"
GUARDS = "celery_election/beat/guards.py"
CATCHUP = "celery_election/beat/catchup.py"
DUE = "celery_election/core/due.py"
DUE_UNIT = ["tests/unit/test_due.py", "tests/unit/test_schedule_rules.py"]
FENCE = "celery_election/beat/fence.py"
BEAT_UNIT = ["tests/unit/test_beat.py"]
PUBLISH = "celery_election/beat/publish.py"
CONFIRMS = "celery_election/beat/confirms.py"
CONFIRMS_UNIT = ["tests/unit/test_confirms.py"]
REFUSED = [
    "tests/integration/test_beat_publishers.py::test_a_run_the_broker_refused_stays_pending_and_owed"
]
BEAT_ELECTION = "celery_election/beat/election.py"
PUBLISHERS = ["tests/unit/test_burst_publish.py", "tests/integration/test_beat_publishers.py"]
CRON = "celery_election/schedule/cron.py"
CRON_UNIT = ["tests/unit/test_cron_dst.py"]
SQL_INSTALL = "celery_election/backends/sql_install.py"
SQL_KEYS = "celery_election/backends/sql_keys.py"
MEM_KEYS = "celery_election/backends/memory_keys.py"
HOLDER = "celery_election/election/holder.py"
LOCK_THREAD = "celery_election/election/lock_thread.py"
KEY_SUITE = ["tests/integration/test_hold_suite.py", "tests/integration/test_key_suite.py"]
SINGLETON = ["tests/unit/test_singleton.py"]
SQL_RUNS = "celery_election/backends/sql_runs.py"
RUNONCE = "celery_election/runs/runonce.py"
ONCE = "celery_election/runs/once.py"
WINDOW_E2E = "tests/e2e/test_beat_election.py::"
RUN_ROWS = ["tests/integration/test_run_rows.py", "tests/unit/test_once.py"]
ONCE_E2E = "tests/e2e/test_run_once.py::test_a_redelivered_finished_run_is_skipped_and_counted"
WINDOW4_E2E = (
    "tests/e2e/test_run_once.py::test_acks_late_a_run_killed_mid_task_runs_exactly_once_more"
)
RUN_NOW_ROW = (
    "tests/integration/test_schedule_beat.py::"
    "test_a_run_now_whose_term_ended_before_its_send_is_sent_once_from_its_row"
)
VERSIONS = ["tests/integration/test_versions.py"]
TRACING_PY = "celery_election/core/tracing.py"
TRACING = ["tests/e2e/test_tracing.py"]

MUTATIONS = [
    # -- upgrades: tables or peers newer than this code are refused before any write ------------
    M("versions-schema", SQL_CALLS, "    if schema > SCHEMA_VERSION:", "    if False:", VERSIONS),
    M("versions-protocol", SQL_CALLS, "    if protocol > PROTOCOL:", "    if False:", VERSIONS),
    M("versions-first-write", SQL_CALLS, "        if write and not self._versions_checked:", "        if False:", VERSIONS),
    M("versions-before-ddl", SQL_INSTALL, "                    check_versions(read_versions(backend.meta, conn), backend.description)",
      "                    pass", VERSIONS),
    # -- the lease steps (SQL) ------------------------------------------------------------
    M("lease-elect-expired", SQL_LEASE, "t.c.token.is_(None), t.c.expires_at <= now",
      "t.c.token.is_(None), sa.true()", LEASE),
    M("lease-take-term", SQL_LEASE, "            t.c.term == term,\n            t.c.token == sa.bindparam(\"p_seen_token\"",
      "            sa.true(),\n            t.c.token == sa.bindparam(\"p_seen_token\"", LEASE),
    M("lease-take-token", SQL_LEASE, 't.c.token == sa.bindparam("p_seen_token", type_=sa.String()),',
      "sa.true(),", LEASE),
    M("lease-take-tagged", SQL_LEASE, "t.c.liveness_us.is_not(None),", "sa.true(),", LEASE),
    M("lease-take-waited", SQL_LEASE, 't.c.liveness_us <= sa.bindparam("p_waited", type_=sa.BigInteger),',
      "sa.true(),", LEASE),
    M("lease-renew-token", SQL_LEASE, "*row, t.c.token == token, t.c.term == term, t.c.expires_at > now",
      "*row, t.c.term == term, t.c.expires_at > now", LEASE),
    M("lease-renew-term", SQL_LEASE, "*row, t.c.token == token, t.c.term == term, t.c.expires_at > now",
      "*row, t.c.token == token, t.c.expires_at > now", LEASE),
    M("lease-renew-unexpired", SQL_LEASE, "*row, t.c.token == token, t.c.term == term, t.c.expires_at > now",
      "*row, t.c.token == token, t.c.term == term", LEASE),
    M("lease-resign-token", SQL_LEASE, ".where(*row, t.c.token == token, t.c.term == term)\n",
      ".where(*row, t.c.term == term)\n", LEASE),
    M("lease-resign-term", SQL_LEASE, ".where(*row, t.c.token == token, t.c.term == term)\n",
      ".where(*row, t.c.token == token)\n", LEASE),
    M("lease-term-floor", SQL_LEASE, 'greatest(t.c.term + 1, now, sa.bindparam("p_floor", type_=sa.BigInteger))',
      'greatest(t.c.term + 1, now)', LEASE),
    M("fork-guard", SQL_CALLS, "        with self._fork_guard:\n            return self._run_bounded(",
      "        if True:\n            return self._run_bounded(", ["tests/integration/test_fork_guard.py"]),
    # -- the lease steps (memory: the model every other test trusts) -----------------------
    M("memory-elect-vacant", MEM_HOLD, "return row.token is None or row.expires_at <= now", "return True",
      [*LEASE, *STATEFUL]),
    M("memory-take-term", MEM_HOLD, "row.term == seen_term\n", "True\n", [*LEASE, *STATEFUL]),
    M("memory-take-token", MEM_HOLD, "and row.token == seen_token\n", "and True\n", [*LEASE, *STATEFUL]),
    M("memory-take-tagged", MEM_HOLD, "and row.liveness_us is not None\n            and row.liveness_us <=",
      "and True\n            and (row.liveness_us or 0) <=", [*LEASE, *STATEFUL]),
    M("memory-take-waited", MEM_HOLD, "and row.liveness_us <= us(waited)",
      "and True", [*LEASE, *STATEFUL]),
    # -- trust and configuration --------------------------------------------------------------
    M("trust-margin", "celery_election/core/lease.py", "return attempt_started + ttl - safety_margin",
      "return attempt_started + ttl", ["tests/unit/test_elector.py", "tests/unit/test_config.py"]),
    M("config-liveness-min", "celery_election/core/config.py", "    if delta < MIN_LIVENESS:\n",
      "    if False:\n", ["tests/unit/test_config.py"]),
    M("config-liveness-window", "celery_election/core/config.py",
      "elif ttl is not None and margin is not None and not delta < ttl - margin:",
      "elif False:", ["tests/unit/test_config.py"]),
    # -- the elector's decisions (pure) and belief --------------------------------------------
    M("dec-takeover-waited", DEC, "and waited * 1_000_000 >= lease.liveness_us", "and True", RULES),
    M("dec-takeover-tagged", DEC, "and lease.held and lease.liveness_us is not None and lease.token != token",
      "and lease.held and lease.token != token", RULES),
    M("dec-takeover-token", DEC, "and lease.held and lease.liveness_us is not None and lease.token != token",
      "and lease.held and lease.liveness_us is not None", RULES),
    M("dec-takeover-held", DEC, "and lease.held and lease.liveness_us is not None and lease.token != token",
      "and lease.liveness_us is not None and lease.token != token", RULES),
    M("dec-takeover-proven", DEC, "return self.granted_at is not None and now < self.good_until",
      "return self.granted_at is not None", RULES),
    M("dec-grace", DEC, "seen.now - seen.vacant_since >= grace", "seen.now - seen.vacant_since >= 0", RULES),
    M("dec-grace-wait", DEC, "wait = max(0.0, since + grace - seen.now)", "wait = 0.0", RULES),
    M("dec-trust-ping", DEC, "return min(lead.lease_until, bound)", "return lead.lease_until", RULES),
    M("dec-trust-lease", DEC, "return min(lead.lease_until, bound)", "return bound", RULES),
    M("dec-trust-regrant", DEC, "bound = proof.previous", "bound = proof.good_until", RULES),
    M("dec-trust-two-grants", DEC, "        bound = -math.inf\n", "        bound = proof.good_until\n", RULES),
    M("dec-extend-lapsed", DEC, "if not proof.has_lock or done >= proof.good_until:", "if not proof.has_lock:", RULES),
    M("dec-extend-lost", DEC, "if not proof.has_lock or done >= proof.good_until:", "if done >= proof.good_until:", RULES),
    M("dec-rate", DEC, "RATE_ALLOWANCE = 1 / 12", "RATE_ALLOWANCE = 0", RULES),
    M("dec-elect-late", DEC, "        return Next.LEAD if in_time else Next.GIVE_UP\n    if result.lease is not None",
      "        return Next.LEAD\n    if result.lease is not None", RULES),
    M("dec-renew-late", DEC, "        return Next.LEAD if in_time else Next.GIVE_UP\n    if lease is None",
      "        return Next.LEAD\n    if lease is None", RULES),
    M("dec-renew-expired", DEC, "return Next.GIVE_UP  # still ours but not renewable: it expired",
      "return Next.FOLLOW", RULES),
    # -- the election thread's timing rules (pure) ---------------------------------------------
    M("dec-wakeup-look-by", DEC, "return min(max(look_at, now + length + spread * 0.02), look_by)",
      "return max(look_at, now + length + spread * 0.02)", RULES),
    M("dec-wakeup-untagged-looks", DEC, "if not lock_on or seen.liveness_us is not None:", "if True:", RULES),
    M("dec-wakeup-other-term", DEC, "if term != seen.term:\n            return look_at",
      "if False:\n            return look_at", RULES),
    M("dec-wakeup-own-election", DEC, 'if kind == "elected" and term is not None and term == held:',
      "if False:", RULES),
    M("dec-lock-failing-leader", DEC, "return news in (LockNews.GRANTED, LockNews.LOST, LockNews.UNSUPPORTED, LockNews.HOT)",
      "return news is not LockNews.PINGED", RULES),
    M("dec-lock-lost-follower", DEC, "return news in (LockNews.GRANTED, LockNews.UNSUPPORTED, LockNews.HOT, LockNews.FAILING)",
      "return news is not LockNews.PINGED", RULES),
    M("dec-retry-third", DEC, "return min(delay, max(0.01, trust_left / 3))", "return min(delay, max(0.01, trust_left))", RULES),
    M("dec-retry-floor", DEC, "return min(delay, max(0.01, trust_left / 3))", "return min(delay, trust_left / 3)", RULES),
    M("dec-release-following", DEC, "return following and wait >= ttl", "return wait >= ttl", RULES),
    M("dec-release-long-wait", DEC, "return following and wait >= ttl", "return following", RULES),
    # -- election_eligible: an ineligible candidate never takes a term (issue 45) -------------
    M("dec-ineligible-looks", DEC, "    if not seen.eligible:\n        return Call.LOOK, 0.0\n", "", RULES),
    M("dec-ineligible-no-lock", DEC, "proof = seen.proof if seen.eligible else None", "proof = seen.proof", RULES),
    M("loop-ineligible-seen", LOOP, "eligible = self.candidate.eligible", "eligible = True", ELIGIBLE),
    M("elector-ineligible-no-lock-thread", "celery_election/election/elector.py", "if self.eligible:  # the lock is for those who may lead",
      "if True:  # the lock is for those who may lead", ELIGIBLE),
    M("candidate-eligible-stored", "celery_election/backends/sql_candidates.py",
      '            "eligible": eligible,\n            "release": values["release"],\n        }',
      '            "release": values["release"],\n        }', LEASE),
    M("candidate-eligible-read", "celery_election/backends/sql_candidates.py",
      "eligible=r.eligible is None or bool(r.eligible),", "eligible=True,", LEASE),
    # -- transfer: the hand-over's one write names the target (issue 45) ----------------------
    M("transfer-holder-token", SQL_LEASE, '        t.c.token == sa.bindparam("p_token", type_=sa.String()),\n        t.c.term == sa.bindparam("p_term"',
      '        sa.true(),\n        t.c.term == sa.bindparam("p_term"', TRANSFER),
    M("transfer-holder-term", SQL_LEASE, '        t.c.term == sa.bindparam("p_term", type_=sa.BigInteger),\n        t.c.expires_at > now,\n    )',
      "        sa.true(),\n        t.c.expires_at > now,\n    )", TRANSFER),
    M("transfer-holder-unexpired", SQL_LEASE, "        t.c.expires_at > now,\n    )\n    live_target", "        sa.true(),\n    )\n    live_target", TRANSFER),
    M("transfer-target-namespace", SQL_LEASE, "            c.c.namespace == ns,\n            c.c.token == target,", "            sa.true(),\n            c.c.token == target,", TRANSFER),
    M("transfer-target-token", SQL_LEASE, "            c.c.token == target,", "            sa.true(),", TRANSFER),
    M("transfer-target-live", SQL_LEASE, "            c.c.expires_at > now,\n            sa.or_(", "            sa.true(),\n            sa.or_(", TRANSFER),
    M("transfer-target-eligible", SQL_LEASE, "sa.or_(c.c.eligible.is_(None), c.c.eligible.is_(True)),", "sa.true(),", TRANSFER),
    M("transfer-made-names-target", SQL_LEASE, '"transferred": sa.update(t).where(*holder, live_target)', '"transferred": sa.update(t).where(*holder)', TRANSFER),
    M("transfer-asked-names-target", SQL_LEASE, '"asked": sa.update(t).where(*holder, live_target)', '"asked": sa.update(t).where(*holder)', TRANSFER),
    M("memory-transfer-holds", MEM, "return self._holds(row, now, token, term) and self._may_lead(namespace, target, now)",
      "return self._may_lead(namespace, target, now)", TRANSFER),
    M("memory-transfer-may-lead", MEM, "return self._holds(row, now, token, term) and self._may_lead(namespace, target, now)",
      "return self._holds(row, now, token, term)", TRANSFER),
    M("memory-may-lead-live", MEM, "return c is not None and c.expires_at_us > now and c.eligible", "return c is not None and c.eligible", TRANSFER),
    M("memory-may-lead-eligible", MEM, "return c is not None and c.expires_at_us > now and c.eligible",
      "return c is not None and c.expires_at_us > now", TRANSFER),
    M("dec-accept-later-term", DEC, "return Next.ACCEPT if result.lease.term > had else Next.RENEW", "return Next.ACCEPT", RULES),
    M("dec-accept-never", DEC, "return Next.ACCEPT if result.lease.term > had else Next.RENEW", "return Next.RENEW", [*RULES, *HANDOVER]),
    M("dec-transfer-asked-term", DEC, "if lease is None or not lease.held_by(token) or lease.term != term:",
      "if lease is None or not lease.held_by(token):", RULES),
    M("dec-transfer-asked-self", DEC, "return target if target is not None and target != token else None", "return target", RULES),
    M("loop-transfer-belief-first", LOOP, "self._belief.end(RevokeReason.TRANSFERRED, veto=term or 0)", "pass", HANDOVER),
    # -- release preference: an older release leaves a vacancy to a newer one (issue 45) --------
    M("dec-release-newer", DEC, "c.eligible and c.token != token and release_key(c.release) > mine",
      "c.eligible and c.token != token and release_key(c.release) >= mine", RULES),
    M("dec-release-eligible", DEC, "c.eligible and c.token != token and release_key(c.release) > mine",
      "c.token != token and release_key(c.release) > mine", RULES),
    M("dec-release-not-self", DEC, "c.eligible and c.token != token and release_key(c.release) > mine",
      "c.eligible and release_key(c.release) > mine", RULES),
    M("dec-release-trailing-zeros", DEC, "    while parts and parts[-1] == 0:", "    while False:", RULES),
    M("dec-defer-bounded", DEC, "return newer and (since is None or now - since < patience)", "return newer", [*RULES, *RELEASE]),
    M("dec-defer-newer", DEC, "return newer and (since is None or now - since < patience)",
      "return since is None or now - since < patience", [*RULES, *RELEASE]),
    M("loop-lead-bound-by-grant", LOOP, "return Lead(term, until, proof.grant if tag is not None else None)",
      "return Lead(term, until, None)", ELECTION),
    M("loop-register-retry", LOOP, "every = config.heartbeat_interval if ok else config.poll_interval",
      "every = config.heartbeat_interval", ["tests/unit/test_elector.py"]),
    M("loop-hold-back", LOOP, "if call is not Call.LOOK and self._hold_back(now):", "if False:", RELEASE),
    M("loop-hold-back-no-lock", LOOP, "eligible = self.candidate.eligible and not held_back",
      "eligible = self.candidate.eligible", RELEASE_LOCK),
    M("candidate-release-stored", "celery_election/backends/sql_candidates.py", '            "release": values["release"],\n', "", LEASE),
    # -- belief: one owner, each transition once ------------------------------------------------
    M("belief-veto", BELIEF, "if self._closed or lead.term <= self._vetoed:", "if self._closed:", ELECTION),
    M("belief-closed", BELIEF, "if self._closed or lead.term <= self._vetoed:", "if lead.term <= self._vetoed:", ELECTION),
    M("belief-trust-clock", BELIEF, "if lead is None or self._clock.monotonic() >= trust_end(lead, self._proof()):",
      "if lead is None:", ELECTION),
    M("belief-once", BELIEF, "        lead, self._lead = self._lead, None\n", "        lead = self._lead\n", ELECTION),
    M("belief-never-revived", BELIEF, "if self._lead is not None and self._lead.term == lead.term and self.trusted():",
      "if self._lead is not None and self._lead.term == lead.term:", ELECTION),
    M("watchers-before-elected", BELIEF, "            self._tell(lead)\n            self._post(\"elected\", lead.term, vacancy=vacancy)\n",
      "            self._post(\"elected\", lead.term, vacancy=vacancy)\n            self._tell(lead)\n", ELECTION),
    M("watchers-before-revoked", BELIEF, "            self._tell(None)\n            self._post(\"revoked\", lead.term, reason)\n",
      "            self._post(\"revoked\", lead.term, reason)\n            self._tell(None)\n", ELECTION),
    # -- the liveness lock's sessions -------------------------------------------------------
    M("lock-reprobe-before-wait", LOCKS, "            if not self._verified:\n", "            if False:\n", TOPOLOGIES),
    M("lock-probe-before-silence-bound", LOCKS, "        if self._verified:  # else acquire() probes first",
      "        if True:  # else acquire() probes first", TOPOLOGIES),
    M("lock-lapsed-proof-regranted", LOCK_THREAD,
      "elif self.regrant and not self.proof.proven(self._clock.monotonic()):", "elif False:", ELECTION),
    M("lock-dead-waiter-kept", LOCKS, "if self.description not in _NO_CONNECTION_CHECK:",
      "if False:", ["tests/integration/test_liveness.py::test_a_standby_gone_in_its_lock_wait_frees_its_slot_within_delta"]),
    M("lock-failing-is-no-wakeup", LOOP, "live.session.silent_holders_lose and live.waits_well,",
      "live.session.silent_holders_lose,", ELECTION),
    M("lock-grant-unwanted", LOCK_THREAD,
      "        if not self.wanted:  # asked to let go while the grant was on its way\n",
      "        if False:\n", ["tests/unit/test_liveness_rules.py::test_a_grant_that_arrives_after_the_lock_was_given_up_is_released"]),
    M("lock-interrupt-first", LOCKS, "        if wait and self._interrupted:  # an interrupt that came first",
      "        if False:  # an interrupt that came first",
      ["tests/integration/test_liveness.py::test_an_interrupt_that_came_before_the_wait_ends_it_as_it_starts"]),
    M("lock-interrupt-sqlite", CONNECTION, "        dbapi_conn.interrupt()\n        return\n", "        pass\n",
      ["tests/unit/test_liveness_rules.py::test_interrupting_a_sqlite3_statement_ends_it_at_once"]),
    M("memory-silent-keeps", MEM, "            and self.silent_holders_lose\n", "",
      ["tests/unit/test_singleton_kit.py::test_a_silent_holder_keeps_its_lock_only_where_silence_does_not_end_it"]),
    # -- the drivers (psycopg2, mysqlclient) ------------------------------------------------------
    M("driver-found-rows", MYSQL_DIALECT, 'cparams["client_flag"] = without_found_rows(cparams.get("client_flag", 0))',
      'cparams["client_flag"] = cparams.get("client_flag", 0)',
      ["tests/integration/test_backend_suite.py::test_an_update_that_changes_nothing_counts_no_row_on_mysql"]),
    M("driver-mysqlclient-call-socket", MYSQL_DIALECT, "connection.remember_socket(dbapi_conn)  # mysqlclient: for the call deadline",
      "pass", ["tests/integration/test_backend_suite.py::test_a_call_past_its_deadline_is_cut_on_every_driver"]),
    M("driver-mysqlclient-lock-socket", MYSQL_DIALECT, "connection.remember_socket(conn)  # mysqlclient: for interrupt()",
      "pass", ["tests/integration/test_liveness.py::test_a_lock_wait_is_cut_from_another_thread_on_every_driver"]),
    M("driver-psycopg2-sqlstate", CONNECTION, 'code = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)',
      'code = getattr(exc, "sqlstate", None)', ["tests/integration/test_liveness.py::test_a_lock_wait_that_times_out_keeps_its_session_on_every_driver"]),
    # -- the beat fence -------------------------------------------------------------------------
    M("beat-holds-token", SQL_BEAT, 'lease.c.token == sa.bindparam("p_token", type_=sa.String()),',
      'sa.bindparam("p_token", type_=sa.String()).is_not(None),', BEAT),
    M("beat-holds-unexpired", SQL_BEAT, "        lease.c.expires_at > db_now_us(),\n", "", BEAT),
    M("beat-holds-term", SQL_BEAT, "        lease.c.term == term,\n", "", BEAT),
    M("beat-batch-key", SQL_BEAT, "t.c.entry_key == v.c.entry_key,", "v.c.entry_key.is_not(None),", BEAT),
    M("beat-batch-was-at", SQL_BEAT, "t.c.last_run_at == v.c.was_at,", "v.c.was_at.is_not(None),", BEAT),
    M("beat-batch-was-count", SQL_BEAT, "t.c.total_run_count == v.c.was_count,", "v.c.was_count.is_not(None),", BEAT),
    M("beat-batch-update-term", SQL_BEAT, "                self._lease_term() == term,\n", "                sa.true(),\n", BEAT),
    M("beat-batch-insert-term", SQL_BEAT, ".where(self._lease_term() == term, v.c.entry_key", ".where(sa.true(), v.c.entry_key", BEAT),
    M("beat-batch-pad", SQL_BEAT, ".where(self._lease_term() == term, v.c.entry_key != PAD)",
      ".where(self._lease_term() == term)", BEAT),
    M("beat-batch-rowcount", SQL_BEAT, "return match if match and result.rowcount == len(match) else set()",
      "return match", BEAT),
    M("memory-batch-fence", MEM_BEAT, "if not leading or _run_key(stored) != _run_key(r.expected) or _held(b, namespace, r):",
      "if _run_key(stored) != _run_key(r.expected) or _held(b, namespace, r):", BEAT),
    M("memory-batch-cas", MEM_BEAT, "if not leading or _run_key(stored) != _run_key(r.expected) or _held(b, namespace, r):",
      "if not leading or _held(b, namespace, r):", BEAT),
    # -- the run ledger (issue 42; its row, issue 52): claimed until sent, owed, recovered --------
    M("ledger-claim-pending-batch", SQL_BEAT, "                self._unheld(v.c.was_key),\n", "", LEDGER),
    M("ledger-hold-claimed-only", SQL_BEAT, "r.c.run_key == was_key, r.c.state == CLAIMED",
      "r.c.run_key == was_key", LEDGER),
    M("ledger-mysql-pending", SQL_BEAT, "            and was[k] not in held\n", "", LEDGER),
    M("ledger-mysql-held-claimed-only", SQL_BEAT, "r.c.run_key.in_(keys), r.c.state == CLAIMED)",
      "r.c.run_key.in_(keys))", LEDGER),
    M("ledger-mem-pending", MEM_BEAT, "!= _run_key(r.expected) or _held(b, namespace, r):", "!= _run_key(r.expected):", LEDGER),
    M("ledger-mem-held-claimed-only", MEM_BEAT, "return stored is not None and stored.row.state == CLAIMED",
      "return stored is not None", LEDGER),
    M("ledger-claim-writes-rows", SQL_BEAT, "        if chunk[0].pending:\n", "        if False:\n", LEDGER),
    M("ledger-mem-claim-writes-row", MEM_BEAT, "            b.runs.claim(namespace, term,", "            (namespace, term,", LEDGER),
    M("ledger-confirm-claimed-only", SQL_RUNS, "t.c.run_key.in_(keys), t.c.state == CLAIMED)", "t.c.run_key.in_(keys))", LEDGER),
    M("ledger-pending-claimed-only", SQL_BEAT, ".where(r.c.namespace == namespace, r.c.state == CLAIMED)",
      ".where(r.c.namespace == namespace)", LEDGER),
    M("ledger-prune-keeps-claimed", SQL_RUNS, "t.c.started_at < cut, kept, beat)", "t.c.started_at < cut, beat)", LEDGER),
    M("ledger-mem-prune-keeps-claimed", MEM_RUNS, "s.created_us < cut\n                   and s.row.state != runstate.CLAIMED and",
      "s.created_us < cut\n                   and", LEDGER),
    M("claim-batch-atomic", SQL_BEAT, "atomic=chunk[0].pending)", "atomic=False)", LEDGER),
    M("claim-atomic-dialect", "celery_election/backends/dialect_base.py", '            conn.execution_options(isolation_level="READ COMMITTED")\n',
      "            pass\n", LEDGER),
    M("claim-atomic-lost-wrapped", "celery_election/backends/dialect_base.py", "        except dbapi.Error as exc:\n",
      "        except ZeroDivisionError as exc:\n", LEDGER),
    M("run-now-atomic", SQL_SCHED, "return self._do(work, self.entry, atomic=True)", "return self._do(work, self.entry)",
      ["tests/integration/test_schedule_store.py"]),
    M("run-end-acks-late-at-once", "celery_election/runs/runonce.py", "        if verdict.acks_late:\n            self._write([end])\n            return\n",
      "", RUN_ROWS),
    M("run-ends-kept", "celery_election/runs/runonce.py", "                self._ends[:0] = ends  # not written: they wait for the next\n",
      "                pass\n", RUN_ROWS),
    M("prune-history-apart", SQL_RUNS, "beat = t.c.kind.is_not(None) if history else t.c.kind.is_(None)", "beat = sa.true()",
      [*LEDGER, *RUN_ROWS]),
    M("prune-mem-history-apart", MEM_RUNS, " and bool(s.row.term) == history]", "]", [*LEDGER, *RUN_ROWS]),
    M("history-thread-prunes", "celery_election/beat/history.py", "                self._pruning()\n", "",
      ["tests/integration/test_schedule_beat.py", "tests/unit/test_history_writer.py"]),
    M("prune-while-leading", "celery_election/beat/history.py", "if self._prune is None or self._term is None or",
      "if self._prune is None or", ["tests/unit/test_history_writer.py"]),
    M("prune-again-at-once", OPS, 'history=True, again=0.0)', 'history=True)',
      ["tests/integration/test_schedule_beat.py"]),
    M("rows-named-by-the-message", ONCE, "            namespace=_header(request, ROWS),\n", "", ["tests/unit/test_once.py"]),
    M("rows-named-by-the-beat", SENDER, "            headers[ROWS] = fence.namespace  # its row: where the claim wrote it\n", "",
      [WINDOW_E2E + "test_a_run_sent_again_while_its_first_copy_runs_is_run_once"]),
    M("ledger-claims-pending", SCHEDULER, "request(next_entry, at, pending=True,", "request(next_entry, at, pending=False,", LEDGER_BEAT),
    M("ledger-no-recovery", SCHEDULER, "if not self._sender.recover(lead, self.schedule, lambda: self.producer):", "if False:", LEDGER_BEAT),
    M("beat-closed-tick-exits", SCHEDULER, "        if self._closed:  # SIGTERM's handler closed it", "        if False:  # SIGTERM's handler closed it",
      ["tests/unit/test_beat.py::test_a_scheduler_closed_under_its_tick_ends_the_beat"]),
    M("beat-interrupted-link-collected", SCHEDULER, "                if interrupted and \"connection\"", "                if False and \"connection\"",
      ["tests/unit/test_beat.py::test_after_a_close_inside_a_tick_the_broker_link_is_dropped_without_the_protocol"]),
    M("ledger-no-retry", SENDER, "        if send.claim is not None:\n            self.ledger.failed(entry, send.claim)\n",
      "", LEDGER_BEAT),
    M("ledger-new-task-id", RUNSTATE, 'return str(uuid.uuid5(_RUNS, f"{namespace}\\0{entry}\\0{at}"))', "return str(uuid.uuid4())",
      LEDGER_BEAT),
    # -- the confirms: a run counts as sent once the broker acked it (beat/confirms.py) ---
    M("ledger-confirm", SENDER, "        confirmed = applies(producer)\n", "        confirmed = False\n", REFUSED),
    M("ledger-confirm-publisher", PUBLISH, "        confirmed = applies(self.producer)\n", "        confirmed = False\n", REFUSED),
    M("confirms-channel", CONFIRMS, "        if channel is not self._channel:\n            return\n", "", CONFIRMS_UNIT),
    M("confirms-own-tag", CONFIRMS, "        if self._published != mark + 1:", "        if False:", CONFIRMS_UNIT),
    M("confirms-inside-publish", CONFIRMS, "            self._early = ack  # the publish in progress: after() settles it",
      "            pass", CONFIRMS_UNIT),
    # the seeded simulation publishes through Confirms: windows 1 and 11 of issue 52
    M("sim-confirms-inside-publish", CONFIRMS, "            self._early = ack  # the publish in progress: after() settles it",
      "            pass", SIM),
    M("sim-confirms-unanswered", CONFIRMS, "            self._failed.extend(self._pending.values())\n            self._pending.clear()\n        acked",
      "            self._acked.extend(self._pending.values())\n            self._pending.clear()\n        acked", SIM),
    M("sim-warn-unchecked", "celery_election/runs/once.py", "    _unchecked_warned.add(task.name)\n", "    return\n", SIM),
    M("beat-close-in-tick", BEAT_SCHED, "        if self._ticking == threading.get_ident():", "        if False:",
      ["tests/unit/test_beat.py::test_a_close_inside_a_tick_only_marks_it_closed_till_the_close_at_exit"]),
    M("confirms-uncertain", CONFIRMS, "                self._uncertain = True\n                raise", "                raise", CONFIRMS_UNIT),
    M("confirms-unanswered", CONFIRMS, "            self._failed.extend(self._pending.values())\n            self._pending.clear()\n        acked",
      "            self._acked.extend(self._pending.values())\n            self._pending.clear()\n        acked", CONFIRMS_UNIT),
    # -- the beat's clock: the runaway guard and cron's daylight-saving rules ---------------
    M("guard-held", GUARDS, "        hold = runaway_hold(entry, self._answers)\n", "        hold = None\n", BEAT_UNIT),
    M("guard-cron-fields", GUARDS, "        if seen is not None and seen > now:", "        if False:", BEAT_UNIT),
    M("guard-interval-period", GUARDS, "        period = schedule.run_every.total_seconds()",
      "        period = MIN_GAP", BEAT_UNIT),
    M("guard-min-gap", GUARDS, "MIN_GAP = 1.0", "MIN_GAP = 0.0", BEAT_UNIT),
    # -- a publisher process sends only while the claiming term is trusted ----------------
    M("publish-fence-term", PUBLISH, "if not reading.trusted(checked) or reading.term != job.term:",
      "if not reading.trusted(checked):", PUBLISHERS),
    M("publish-fence-trust", PUBLISH, "if not reading.trusted(checked) or reading.term != job.term:",
      "if reading.term != job.term:", PUBLISHERS),
    M("publish-record-written", BEAT_ELECTION,
      "elector.watch_trust(lambda term, until: record.write(term, until, elector.token))",
      "pass", PUBLISHERS),
    M("publish-lost-not-resent", PUBLISH, "kept += [job for job, _ in share]",
      "kept += list(jobs)", PUBLISHERS),
    # -- the fence at a send, and a retried claim ----------------------------------------
    M("beat-send-refused-claim", FENCE, "if claim is not None and (not claim.won or claim.term != lead.term):",
      "if claim is not None and claim.term != lead.term:", ["tests/unit/test_ledger_beat.py", *BEAT_UNIT, *BEAT]),
    M("beat-send-claim-term", FENCE, "if claim is not None and (not claim.won or claim.term != lead.term):",
      "if claim is not None and not claim.won:", [*BEAT_UNIT, *BEAT]),
    M("beat-claim-gives-up", FENCE, "if boottime() + delay > deadline or election.leadership() != lead:",
      "if election.leadership() != lead:", ["tests/unit/test_ledger_beat.py"]),
    M("beat-claim-stops-unled", FENCE, "if boottime() + delay > deadline or election.leadership() != lead:",
      "if boottime() + delay > deadline:", ["tests/unit/test_ledger_beat.py"]),
    M("beat-claim-unanswered", FENCE, "claims = [RunClaim(False, r.expected, True, answered=False) for r in requests]",
      "claims = [RunClaim(False, r.expected, True) for r in requests]", ["tests/unit/test_ledger_beat.py"]),
    M("beat-unanswered-unclaimed", BEAT_SCHED, "                if result.answered:", "                if True:",
      ["tests/unit/test_ledger_beat.py"]),
    M("beat-unanswered-due-at-once", BEAT_SCHED, "when = now if run.claim is None else", "when = now if False else",
      ["tests/unit/test_ledger_beat.py"]),
    M("ledger-claim-lost-unanswered", SQL_BEAT, "RunClaim(False, r.expected, True, answered=False) for r in chunk",
      "RunClaim(False, r.expected, True) for r in chunk", LEDGER),
    M("beat-retry-own", FENCE, "return RunClaim(True, state, True) if not claim.won and mine else claim",
      "return claim", BEAT),
    # -- a claimed run waits in the ledger for one send ------------------------------------
    M("beat-claim-taken-once", BEAT_SCHED, "        run = self._ledger.pop(entry.name, None)\n", "        run = self._ledger.get(entry.name)\n", BEAT_UNIT),
    M("cron-fixed-first-occurrence", CRON, "lowest = first_local if mode != \"fixed\" or seen is None else max(first_local, seen)",
      "lowest = first_local", CRON_UNIT),
    M("cron-any-both-occurrences", CRON, "lowest = first_local if mode != \"fixed\" or seen is None",
      "lowest = first_local if mode == \"wild\" or seen is None", CRON_UNIT),
    M("cron-gap-runs-at-its-end", CRON, 'if i and mode != "wild" and start > a and seen is not None and seen < first_local:',
      "if False:", CRON_UNIT),
    M("cron-gap-not-for-wildcards", CRON, 'if i and mode != "wild" and start > a', "if i and start > a", CRON_UNIT),
    M("cron-transitions-seen", CRON, "if offs[0] == offs[-1] and len(set(offs)) == 1:", "if True:", CRON_UNIT),
    # -- the operable schedule ------------------------------------------------------------------
    M("sched-run-now-seen", SQL_SCHED, 't.c.run_now_at == sa.bindparam("p_seen", type_=sa.BigInteger),',
      'sa.bindparam("p_seen", type_=sa.BigInteger).is_not(None),', SCHED),
    M("sched-run-now-term", SQL_SCHED, "lease_term.scalar_subquery() == term,", "sa.true(),", SCHED),
    M("sched-run-now-token", SQL_SCHED, 'lease.c.token == sa.bindparam("p_token", type_=sa.String()),',
      'sa.bindparam("p_token", type_=sa.String()).is_not(None),', SCHED),
    M("sched-run-now-lease-ns", SQL_SCHED, 'lease.c.namespace == sa.bindparam("p_lease_ns", type_=key_type(190)),',
      'sa.bindparam("p_lease_ns", type_=key_type(190)).is_not(None),', SCHED),
    M("sched-run-now-unexpired", SQL_SCHED, "                lease.c.expires_at > db_now_us(),\n", "", SCHED),
    M("sched-run-now-entry", SQL_SCHED, 't.c.entry_key == sa.bindparam("p_key", type_=key_type(40)),',
      'sa.bindparam("p_key", type_=key_type(40)).is_not(None),', SCHED),
    M("sched-run-now-row", SQL_SCHED, "            self.backend.runs.write_claimed(conn, lease_ns, term, [run])\n", "",
      [RUN_NOW_ROW, WINDOW_E2E + "test_a_run_now_whose_leader_dies_before_its_send_runs_once"]),
    M("ledger-recovers-run-now", LEDGER_PY, "            if run.run_now:\n                out.append((entry, None, run.run))\n                continue\n",
      "            if run.run_now:\n                continue\n",
      [RUN_NOW_ROW, WINDOW_E2E + "test_a_run_now_whose_leader_dies_before_its_send_runs_once"]),
    M("sched-run-now-owed", SENDER, "                self.ledger.failed_now(entry, run_now, self._run_now_id(entry, run_now))\n",
      "                pass\n", [RUN_NOW_ROW]),
    M("sched-request-once", "celery_election/schedule/api.py",
      'return {"run_now_at": row.run_now_at if pending else now}', 'return {"run_now_at": now}', SCHED),
    M("sched-store-lost-round", SQL_SCHED, "        except LostRound as exc:", "        except ZeroDivisionError as exc:",
      ["tests/integration/test_schedule_store.py"]),
    M("sched-changes-since", SQL_SCHED, ".where(t.c.namespace == namespace, t.c.version > since)",
      ".where(t.c.namespace == namespace)", SCHED),
    # one condition for the overlap policy's last run sent and the overdue alarm's open run
    M("sched-sent-not-dropped", "celery_election/schedule/marks.py", "t.c.entry_key == key, t.c.state != DROPPED)",
      "t.c.entry_key == key)", [*SCHED, "tests/integration/test_web_app.py", "tests/integration/test_overdue.py"]),
    M("sched-open-after-finish", "celery_election/schedule/marks.py", "r.c.finished_at.is_(None), r.c.started_at > last)",
      "r.c.finished_at.is_(None))", ["tests/integration/test_overdue.py"]),
    M("sched-open-entry", "celery_election/schedule/marks.py", "return sa.and_(t.c.namespace == namespace, t.c.entry_key == key,",
      "return sa.and_(t.c.namespace == namespace,", ["tests/integration/test_overdue.py"]),
    M("sched-marks-beat-rows", "celery_election/schedule/marks.py", ".where(namespaces, r.c.kind.is_not(None))",
      ".where(namespaces)", ["tests/integration/test_schedule_store.py"]),
    M("sched-overlap-busy", CATCHUP, "    if busy:\n        return Decision(skip_to=now", "    if False:\n        return Decision(skip_to=now", SCHED),
    M("sched-skip-before", CATCHUP, "if skip_before is not None and times[0] < skip_before:",
      "if False:", SCHED),
    M("sched-grace", CATCHUP, "late = [t for t in times if (now - t).total_seconds() > grace]",
      "late: list[datetime] = []", SCHED),
    M("sched-all-bound", CATCHUP, "        if len(times) > most:\n", "        if False:\n", SCHED),
    # when a run fell due (core/due.py): the catch-up's count of missed times, the window
    M("due-times-cap", DUE, "while len(out) < cap:", "while len(out) <= cap:", DUE_UNIT),
    M("due-times-past-last", DUE, "if due > now or due <= last:", "if due > now:", DUE_UNIT),
    M("due-times-up-to-now", DUE, "if due > now or due <= last:", "if due <= last:", DUE_UNIT),
    M("due-window-start", DUE, "if due is not None and start:", "if False:", DUE_UNIT),
    M("due-window-end", DUE, "and due > datetime.fromisoformat(end):", "and due >= datetime.fromisoformat(end):", DUE_UNIT),
    M("sched-paused-out-of-view", OPS, "if row is None or row.task is not None or (row.enabled and not row.paused):",
      "if True:", SCHED),
    M("sched-dynamic-origin", OPS, "return entry.name not in self._identity and super().follows_deploys(entry)",
      "return super().follows_deploys(entry)", SCHED),
    M("sched-window-start", OPS, 'in_window(now, row.spec.get("start_at"), ', "in_window(now, None, ", SCHED),
    M("sched-window-end", OPS, 'row.spec.get("expires_at")) == now', "None) == now", SCHED),
    M("sched-dynamic-paused", OPS, "if row.enabled and not row.paused and inside:", "if inside:", SCHED),
    # -- key holds (singleton tasks): each WHERE condition of a step, SQL and memory ---------
    # the hold's steps (sql_lease.hold_updates, memory_hold.py) are the lease's and a key's
    # alike: their mutations are lease-* and memory-*, killed by the hold suite over both
    # uses. Here what only keys have: one renewal for all of a token's keys, and an
    # operator's release.
    M("keys-renew-token", SQL_KEYS, ".where(t.c.namespace == ns, t.c.token == token, t.c.expires_at > now)",
      ".where(t.c.namespace == ns, t.c.expires_at > now)", KEY_SUITE),
    M("keys-renew-unexpired", SQL_KEYS, ".where(t.c.namespace == ns, t.c.token == token, t.c.expires_at > now)",
      ".where(t.c.namespace == ns, t.c.token == token)", KEY_SUITE),
    M("keys-forced-term", SQL_KEYS, '            t.c.term == sa.bindparam("p_term", type_=sa.BigInteger),\n            t.c.token.is_not(None),',
      "            t.c.token.is_not(None),", KEY_SUITE),
    M("keys-forced-held", SQL_KEYS, '            t.c.term == sa.bindparam("p_term", type_=sa.BigInteger),\n            t.c.token.is_not(None),',
      '            t.c.term == sa.bindparam("p_term", type_=sa.BigInteger),', KEY_SUITE),
    M("keys-mem-renew-token", MEM_KEYS, "if ns == bid.namespace and row.token == bid.token and row.expires_at > now:",
      "if ns == bid.namespace and row.expires_at > now:", KEY_SUITE),
    M("keys-mem-renew-unexpired", MEM_KEYS, "if ns == bid.namespace and row.token == bid.token and row.expires_at > now:",
      "if ns == bid.namespace and row.token == bid.token:", KEY_SUITE),
    M("keys-mem-release-token", MEM_KEYS, "lambda r: r.token == token and r.term == term", "lambda r: r.term == term", KEY_SUITE),
    M("keys-mem-release-term", MEM_KEYS, "lambda r: r.token == token and r.term == term", "lambda r: r.token == token", KEY_SUITE),
    M("keys-mem-forced-term", MEM_KEYS, "lambda r: r.term == term and r.token is not None", "lambda r: r.token is not None", KEY_SUITE),
    M("keys-mem-forced-held", MEM_KEYS, "lambda r: r.term == term and r.token is not None", "lambda r: r.term == term", KEY_SUITE),
    # -- key holds: the holder's trust bound and its take-over ---------------------------------
    M("keys-trust-proof", HOLDER, "proof.grant if held.tagged else None", "None", SINGLETON),
    M("keys-late-success", HOLDER, "        if not self.trusted(held):  # won, but too late", "        if False:  # won, but too late",
      SINGLETON),
    M("keys-probe-ended", HOLDER, "and self._ended(inc, seen.token)):", "and self._ended(inc, seen.token) is not None):",
      SINGLETON),
    M("keys-lapsed-kept", HOLDER, '"celery-election-keys", regrant=False,', '"celery-election-keys", regrant=True,',
      SINGLETON),
    M("keys-wait-delta", HOLDER, "while (waited := self._clock.monotonic() - answered) < need:", "while False:", SINGLETON),
    M("keys-renew-trust", HOLDER, "                    if (held.key, held.term) in terms:",
      "                    if True:", SINGLETON),
    M("keys-ping-lost", LOCK_THREAD, "                self.session.ping()\n                if not self.session.has_lock:",
      "                self.session.ping()\n                if False:", KEY_SUITE),
    # -- singleton tasks' operators (issue 43): the CLI's release is fenced by the term seen ------
    M("keyops-cli-term", CLI_KEYS, "    if term is not None and term != hold.term:\n", "    if False:\n", KEY_CLI),
    M("keyops-cli-held", CLI_KEYS, "    if hold is None or not hold.held:\n", "    if hold is None:\n", KEY_CLI),
    # -- the key holder shared by a worker's threads: its session, its renewals, an outage --------
    M("keyops-probe-lock", HOLDER, "            with live.session_lock:\n                return cast(",
      "            if True:\n                return cast(", KEY_THREADS),
    M("keyops-renew-apart", HOLDER, "        inc.granted.set()\n",
      "        inc.granted.set()\n        if news is LockNews.PINGED:\n            self._renew()\n", KEY_THREADS),
    M("keyops-unreachable-busy", "celery_election/keys/singleton.py", "        except BackendUnavailableError as exc:  # never lost",
      "        except KeyError as exc:  # never lost", KEY_THREADS),
    M("keyops-one-waiting-drop", "celery_election/keys/singleton.py", "            if slot is None:\n                log.info(",
      "            if False:\n                log.info(", KEY_KIT),
    M("keyops-one-waiting-free", "celery_election/keys/singleton.py", "        self._free_waiting(holder, key)\n", "", KEY_KIT),
    M("keyops-one-waiting-unsent", "celery_election/keys/singleton.py", "            if WAITING in headers:\n", "            if False:\n", KEY_KIT),
    M("keyops-e2e-one-waiting", "celery_election/keys/singleton.py", "            if slot is None:\n                log.info(",
      "            if False:\n                log.info(",
      ["tests/e2e/test_singleton_workers.py::test_one_waiting_runs_the_running_one_and_one_more[postgresql]"]),
    M("keyops-e2e-hold-vacant", SQL_LEASE, "t.c.token.is_(None), t.c.expires_at <= now", "t.c.token.is_(None), sa.true()",
      ["tests/e2e/test_singleton_workers.py::test_each_key_runs_alone_every_task_once_and_a_killed_holder_is_replaced[postgresql]"]),
    # -- run once on the workers: a run's row turns a second delivery into a skip or a wait ----
    M("once-no-run-row", RUNONCE, "            decided = self._start(ns, d, holder, task_name, hostname, ends)\n",
      "            decided = Start(\"run\", \"started\", None)\n", RUN_ROWS),
    M("once-worker-check", ONCE, "            _wrap(type(task))\n", "            pass\n",
      ["tests/unit/test_once.py", ONCE_E2E]),
    M("once-worker-check-e2e", ONCE, "            _wrap(type(task))\n", "            pass\n", [ONCE_E2E]),
    M("once-defer-running", ONCE, "    if verdict.verdict == \"defer\":", "    if False:", RUN_ROWS),
    M("once-no-liveness", RUNONCE, "holder.identity(),", "None,", RUN_ROWS),
    M("once-liveness-unasked", HOLDER, "        return inc is None or self._ended(inc, token) is not True",
      "        return True", [*RUN_ROWS, WINDOW4_E2E]),
    M("once-defer-unnamed", ONCE, "    headers[DEFERRED_BY] = list(put_off)\n", "    pass\n", RUN_ROWS),
    M("once-defer-own-try", ONCE, "_defer(task, task_id, (*put_off, token),", "_defer(task, task_id, put_off,",
      RUN_ROWS),
    M("once-resend-unmarked", SENDER, "            if attempt > 1 or recovered is not None:", "            if False:", LEDGER_BEAT),
    M("once-resend-all-marked", SENDER, "            if attempt > 1 or recovered is not None:", "            if True:", LEDGER_BEAT),
    # -- the run rows on SQL: one conditional write per transition --------------------------------
    M("rows-insert-if-absent", SQL_RUNS, "stmt: Any = self.backend.db.insert_ignore(t, values)",
      'stmt = self.backend.db.upsert(t, values, lambda new: {"pid": new.pid})', RUN_ROWS),
    M("rows-cas-state", SQL_RUNS, "                t.c.state.is_not_distinct_from(raw.state),\n", "", RUN_ROWS),
    M("rows-cas-attempt", SQL_RUNS, "                t.c.attempt == raw.attempt,\n", "", RUN_ROWS),
    M("rows-cas-delivery", SQL_RUNS, "                t.c.delivery.is_not_distinct_from(raw.delivery),\n", "", RUN_ROWS),
    M("rows-cas-finished", SQL_RUNS, "                t.c.finished_at.is_(None)\n                if raw.finished_at is None\n                else t.c.finished_at.is_not(None),\n",
      "", RUN_ROWS),
    M("rows-lost-write-won", SQL_RUNS, "            .values(values)\n        )\n        return self._changed(stmt)\n",
      "            .values(values)\n        )\n        self._changed(stmt)\n        return True\n", RUN_ROWS),
    M("rows-lost-insert-won", SQL_RUNS, "                return self._changed(stmt.returning(t.c.run_key), rows=True, ends=ends)\n            return self._changed(stmt, ends=ends)\n",
      "                self._changed(stmt.returning(t.c.run_key), rows=True, ends=ends)\n                return True\n            self._changed(stmt, ends=ends)\n            return True\n", RUN_ROWS),
    M("rows-finish-by-its-delivery", SQL_RUNS, "                t.c.delivery == delivery,\n", "", RUN_ROWS),
    M("rows-finish-open-only", SQL_RUNS, "                sa.or_(t.c.state == STARTED, t.c.outcome == runstate.LOST),\n", "", RUN_ROWS),
    M("rows-finish-lost-revived", SQL_RUNS, "sa.or_(t.c.state == STARTED, t.c.outcome == runstate.LOST)", "t.c.state == STARTED",
      RUN_ROWS),
    M("rows-fast-start-unstarted", SQL_RUNS, "sa.update(t).where(*mine, t.c.state.in_((CLAIMED, SENT)))",
      "sa.update(t).where(*mine)", RUN_ROWS),
    M("rows-old-row-started", SQL_RUNS, "    state = raw.state or (ENDED if raw.finished_at is not None else STARTED)",
      "    state = raw.state or ENDED", RUN_ROWS),
    # -- windows of issue 52 closed in the mechanisms of 0.2 (until the run is one row) -------
    M("ledger-recheck", SENDER, "            if lead is not None and boottime() >= self._recheck_at:",
      "            if False:", LEDGER_BEAT),
    M("ledger-recheck-known", LEDGER_PY, "if r.claimed_us < cut and not self._knows(r)]", "if r.claimed_us < cut]", LEDGER_BEAT),
    M("ledger-promotion-unconfirmed", LEDGER_PY, " if r.task_id not in self._unconfirmed]", "]", LEDGER_BEAT),
    M("ledger-recheck-e2e", SENDER, "            if lead is not None and boottime() >= self._recheck_at:",
      "            if False:", [WINDOW_E2E + "test_runs_whose_confirm_changed_nothing_are_sent_again_by_the_same_leader"]),
    M("once-singleton-after-key", ONCE, ' or getattr(cls, "election_check_in_call", False):', ":",
      [WINDOW_E2E + "test_a_beat_run_whose_singleton_key_is_busy_runs_once_after_its_requeue"]),
    # -- the run's life as one row: each guard, killed by the simulation alone ----------------
    M("run-claim-once", RUNSTATE, "    if existing is not None:\n        return None\n", "", SIM),
    M("run-adopt-claimed", RUNSTATE, "    if row.state == CLAIMED and row.term < term:", "    if row.term < term:", SIM),
    M("run-adopt-earlier", RUNSTATE, "    if row.state == CLAIMED and row.term < term:", "    if row.state == CLAIMED:", SIM),
    M("run-owes-claimed", RUNSTATE, "    return row.state == CLAIMED and row.term == term", "    return row.term == term", SIM),
    M("run-owes-term", RUNSTATE, "    return row.state == CLAIMED and row.term == term", "    return row.state == CLAIMED", SIM),
    M("run-confirm-claimed", RUNSTATE, "    if row.state == CLAIMED:\n        return replace(row, state=SENT)",
      "    if row.state != ENDED:\n        return replace(row, state=SENT)", SIM),
    M("run-start-unsent-only", RUNSTATE, "    if row.state in (CLAIMED, SENT):", "    if row.state != ENDED:", SIM),
    M("run-start-own-started", RUNSTATE, "    if row.delivery in d.put_off:", "    if row.delivery in d.put_off and row.state == STARTED:", SIM),
    M("run-start-own-any", RUNSTATE, "    if row.delivery in d.put_off:", "    if row.state == STARTED:", SIM),
    M("run-start-early-ack", RUNSTATE, "    if not row.acks_late:\n        return Start(\"skip\", \"started\", None)", "    if False:\n        pass", SIM),
    M("run-start-alive", RUNSTATE, "    if row.worker is not None and starter_alive(row.worker):\n",
      "    if False:\n", SIM),
    M("run-start-defer", RUNSTATE, '        return Start("defer", "running", None)', '        return Start("skip", "running", None)', SIM),
    M("run-release-delivery", RUNSTATE, "    if row.state == STARTED and row.delivery == delivery:\n        return replace(row, state=SENT",
      "    if row.state == STARTED:\n        return replace(row, state=SENT", SIM + RELEASE_TABLE),
    M("run-finish-delivery", RUNSTATE, "    if row.delivery == delivery and (row.state == STARTED or row.outcome == LOST):",
      "    if row.state == STARTED or row.outcome == LOST:", SIM),
    M("run-finish-started", RUNSTATE, "    if row.delivery == delivery and (row.state == STARTED or row.outcome == LOST):",
      "    if row.delivery == delivery:", SIM),
    M("run-finish-lost", RUNSTATE, "    if row.delivery == delivery and (row.state == STARTED or row.outcome == LOST):",
      "    if row.delivery == delivery and row.state == STARTED:", SIM),
    M("run-reap-early-only", RUNSTATE, "        and not row.acks_late\n        and row.worker is not None\n",
      "        and row.worker is not None\n", SIM),
    M("run-reap-dead-only", RUNSTATE, "        and not starter_alive(row.worker)\n    ):", "    ):", SIM),
    M("run-memory-claim-fence", MEM_RUNS, "            if not self.leads(namespace, term):\n                return [False] * len(runs)\n", "", SIM + STORE_FENCES),
    M("run-memory-owed-fence", MEM_RUNS, "            if not self.leads(namespace, term):\n                return []\n", "", SIM + STORE_FENCES),
    # a worker's liveness as the guard asks it (the simulation has its own: the store's test)
    M("run-holder-alive", HOLDER, "        return inc is None or self._ended(inc, token) is not True",
      "        return True", RUN_ROWS),
    # -- traces: a run's context travels with its message (one trace per run) -----------------
    M("otel-run-not-current", SENDER, "with tracing.current(send.span):", "with tracing.current(None):", TRACING),
    M("otel-publisher-no-context", PUBLISH, 'with tracing.from_headers(options.get("headers")):',
      "with tracing.from_headers(None):", TRACING),
    M("otel-no-inject", TRACING_PY, "        _propagate.inject(headers, context=_trace.set_span_in_context(span))",
      "        pass", TRACING),
    M("otel-trace-id-random", TRACING_PY, "        parent = run_parent(task_id)", "        parent = None", TRACING),
]  # fmt: skip

#: Mutations known to leave every test green because they change nothing observable.
EQUIVALENT = {
    "run-adopt-claimed": "a row's term is read only while it is claimed (owes, drop): a later "
    "leader writing its term on a sent or started row changes nothing anyone reads; the state "
    "test keeps the adoption statement to the rows it must change",
    "run-adopt-earlier": "owed() adopts only under the lease's fence, so no row carries a term "
    "later than the caller's; the bound is for a caller outside the fence",
    "run-owes-term": "owed() adopts every earlier term's claimed row first, under the fence: "
    "every claimed row it then reads is the caller's",
    "run-finish-started": "a delivery's second finish of its own ended row (a retry after the "
    "first one's answer was lost) writes the outcome the first wrote; the state test keeps the "
    "statement from rewriting it",
    "lease-take-tagged": "in SQL, `liveness_us <= :waited` is already false for NULL",
    "sched-request-once": "a second click while one is pending then rewrites the request's "
    "time; the leader's claim compares the time it saw and looks again, so still one run",
}


def run(m: Mutation, python: str) -> tuple[str, float]:
    path = ROOT / m.file
    source = path.read_text()
    if source.count(m.old) != 1:
        return "NOT FOUND", 0.0
    path.write_text(source.replace(m.old, m.new))
    start = time.monotonic()
    try:
        done = subprocess.run(
            # -m "": the second tier's tests count too (pyproject deselects them)
            [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "", *m.tests],
            cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:  # a hang is no failing assertion: said, not counted
        return "TIMEOUT", time.monotonic() - start
    finally:
        path.write_text(source)
    return VERDICTS.get(done.returncode, f"ERROR {done.returncode}"), time.monotonic() - start


#: Seconds a mutation's tests may take (the slowest take under 2 minutes).
TIMEOUT = 600


#: pytest's exit codes: 1 is a test that failed. Any other (2 interrupted, a collection
#: error; 3 internal; 4 usage; 5 no tests) proves nothing: a run whose tests could not
#: start, in a venv missing a driver, was once counted as 226 kills.
VERDICTS = {0: "SURVIVED", 1: "killed"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="Run the mutations whose id starts so.")
    parser.add_argument("--json", help="Also write the results here.")
    parser.add_argument("--after", default="", help="Resume: the mutations after this id.")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if m.id.startswith(args.only)]
    if args.after:
        chosen = chosen[[m.id for m in chosen].index(args.after) + 1 :]
    files = sorted({m.file for m in chosen})
    dirty = subprocess.run(["git", "status", "--porcelain", *files], cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    if dirty:
        sys.exit(f"uncommitted changes in a file to mutate; commit or stash first:\n{dirty}")
    results = []
    for m in chosen:
        verdict, took = run(m, sys.executable)
        note = EQUIVALENT.get(m.id, "")
        results.append({"id": m.id, "file": m.file, "verdict": verdict, "seconds": round(took, 1),
                        "note": note})  # fmt: skip
        print(f"{m.id:<28} {verdict:<9} {took:6.1f}s  {note}", flush=True)
    killed = sum(r["verdict"] == "killed" for r in results)
    print(f"\n{killed}/{len(results)} killed")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    unexplained = [r for r in results if r["verdict"] != "killed" and not r["note"]]
    sys.exit(1 if unexplained else 0)


if __name__ == "__main__":
    main()
