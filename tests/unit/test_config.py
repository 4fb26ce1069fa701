"""ElectionConfig, key validation and the Elector constructor's checks: table-driven."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from celery_election.backends import MemoryBackend
from celery_election.backends.base import BACKEND_MEMBERS
from celery_election.core.config import (
    MAX_CANDIDATE_ID_LENGTH,
    MAX_NAMESPACE_LENGTH,
    ElectionConfig,
    validate_candidate_id,
    validate_namespace,
)
from celery_election.election.elector import Elector
from celery_election.errors import ConfigurationError, ElectionError

SECONDS_FIELDS = [
    "ttl",
    "renew_interval",
    "poll_interval",
    "safety_margin",
    "call_timeout",
    "resign_backoff",
    "candidate_ttl",
    "fallback_interval",
]


def expected_defaults(ttl: float) -> dict[str, float]:
    """The documented defaults, written out independently of the implementation."""
    renew = ttl * 0.4
    return {
        "ttl": ttl,
        "renew_interval": renew,
        "poll_interval": min(1.0, renew),
        "jitter": 0.1,
        "safety_margin": max(ttl / 5, min(1.0, ttl / 4)),
        "call_timeout": renew,
        "resign_backoff": ttl,
        "candidate_ttl": 3 * max(60.0, ttl),  # 3 x fallback: heartbeats go with looks
        "fallback_interval": max(60.0, ttl),
    }


def as_dict(config: ElectionConfig) -> dict[str, float]:
    return {name: getattr(config, name) for name in [*SECONDS_FIELDS, "jitter"]}


def problems_of(**kwargs: Any) -> list[str]:
    with pytest.raises(ConfigurationError) as info:
        ElectionConfig.create(**kwargs)
    return info.value.problems


# -- defaults -------------------------------------------------------------------------------


def test_candidate_ttl_follows_a_given_fallback_interval() -> None:
    """A follower heartbeats with its look (once per fallback): its row must outlive that."""
    config = ElectionConfig(fallback_interval=45)
    assert config.candidate_ttl == 135.0
    assert config.heartbeat_interval == pytest.approx(config.fallback_interval)


def test_default_config_is_ttl_10() -> None:
    config = ElectionConfig.create()
    assert config.ttl == 10.0
    assert config.renew_interval == pytest.approx(4.0)
    assert config.poll_interval == 1.0
    assert config.jitter == 0.1
    assert config.safety_margin == 2.0
    assert config.call_timeout == pytest.approx(4.0)
    assert config.fallback_interval == 60.0
    assert config.resign_backoff == 10.0
    assert config.candidate_ttl == 180.0  # 3 x fallback: a follower heartbeats with its look
    assert config.trust_window == pytest.approx(8.0)
    assert config.heartbeat_interval == pytest.approx(60.0)


@pytest.mark.parametrize("ttl", [0.3, 1, 2.5, 3, 4, 10, 30, 120, 3600])
def test_defaults_follow_ttl(ttl: float) -> None:
    config = ElectionConfig.create(ttl=ttl)
    assert as_dict(config) == pytest.approx(expected_defaults(float(ttl)))
    # Whatever the ttl, the defaults must be mutually consistent.
    assert config.ttl > 2 * config.renew_interval
    assert config.safety_margin < config.ttl - config.renew_interval
    assert config.call_timeout <= config.renew_interval


def test_all_values_are_floats() -> None:
    config = ElectionConfig.create(ttl=30, renew_interval=5, poll_interval=1, jitter=0)
    for name, value in as_dict(config).items():
        assert type(value) is float, name


def test_renew_interval_drives_its_dependent_defaults() -> None:
    config = ElectionConfig.create(ttl=30, renew_interval=0.5)
    assert config.poll_interval == 0.5
    assert config.call_timeout == 0.5
    assert config.safety_margin == 6.0


def test_explicit_values_are_kept() -> None:
    config = ElectionConfig.create(
        ttl=20,
        renew_interval=4,
        poll_interval=0.25,
        jitter=0.2,
        safety_margin=3,
        call_timeout=2,
        resign_backoff=7,
        candidate_ttl=90,
        fallback_interval=45,
    )
    assert as_dict(config) == {
        "ttl": 20.0,
        "renew_interval": 4.0,
        "poll_interval": 0.25,
        "jitter": 0.2,
        "safety_margin": 3.0,
        "call_timeout": 2.0,
        "resign_backoff": 7.0,
        "candidate_ttl": 90.0,
        "fallback_interval": 45.0,
    }


def test_timedeltas_are_accepted_everywhere() -> None:
    config = ElectionConfig.create(
        ttl=timedelta(seconds=30),
        renew_interval=timedelta(seconds=5),
        poll_interval=timedelta(milliseconds=500),
        safety_margin=timedelta(seconds=4),
        call_timeout=timedelta(seconds=2),
        resign_backoff=timedelta(minutes=1),
        candidate_ttl=timedelta(minutes=3),
        fallback_interval=timedelta(minutes=2),
    )
    assert as_dict(config) == {
        "ttl": 30.0,
        "renew_interval": 5.0,
        "poll_interval": 0.5,
        "jitter": 0.1,
        "safety_margin": 4.0,
        "call_timeout": 2.0,
        "resign_backoff": 60.0,
        "candidate_ttl": 180.0,
        "fallback_interval": 120.0,
    }


def test_timedelta_ttl_drives_defaults() -> None:
    assert as_dict(ElectionConfig.create(ttl=timedelta(minutes=2))) == pytest.approx(
        expected_defaults(120.0)
    )


def test_config_is_frozen() -> None:
    config = ElectionConfig.create()
    with pytest.raises(AttributeError):
        config.ttl = 1.0  # type: ignore[misc]


# -- single bad values ----------------------------------------------------------------------

NOT_A_NUMBER: list[Any] = [True, False, "10", "1s", b"10", [10], complex(1, 0), object]
NOT_POSITIVE: list[Any] = [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("field", SECONDS_FIELDS)
@pytest.mark.parametrize("value", NOT_A_NUMBER, ids=repr)
def test_non_numbers_are_rejected(field: str, value: Any) -> None:
    problems = problems_of(**{field: value})
    assert problems == [
        f"{field} (election_{field}) must be a number of seconds or a timedelta: got {value!r}"
    ]


@pytest.mark.parametrize("field", SECONDS_FIELDS)
@pytest.mark.parametrize("value", NOT_POSITIVE, ids=repr)
def test_non_positive_or_non_finite_values_are_rejected(field: str, value: float) -> None:
    problems = problems_of(**{field: value})
    assert problems == [
        f"{field} (election_{field}) must be a positive number of seconds: got {value!r}"
    ]


@pytest.mark.parametrize("field", SECONDS_FIELDS)
@pytest.mark.parametrize(
    ("value", "shown"),
    [(timedelta(0), "0.0"), (timedelta(seconds=-1), "-1.0")],
    ids=["zero", "neg"],
)
def test_non_positive_timedeltas_are_rejected(field: str, value: timedelta, shown: str) -> None:
    problems = problems_of(**{field: value})
    assert problems == [
        f"{field} (election_{field}) must be a positive number of seconds: got {shown}"
    ]


@pytest.mark.parametrize("field", SECONDS_FIELDS)
def test_bad_value_message_names_field_setting_and_value(field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionConfig.create(**{field: -7})
    message = str(info.value)
    assert message.startswith(f"{field} (election_{field}) ")
    assert "got -7" in message


@pytest.mark.parametrize(
    ("jitter", "fragment"),
    [
        (True, "jitter (election_jitter) must be a fraction: got True"),
        ("0.1", "jitter (election_jitter) must be a fraction: got '0.1'"),
        ([0.1], "jitter (election_jitter) must be a fraction: got [0.1]"),
        (-0.1, "jitter (election_jitter) must be in [0, 0.5): got -0.1"),
        (0.5, "jitter (election_jitter) must be in [0, 0.5): got 0.5"),
        (1, "jitter (election_jitter) must be in [0, 0.5): got 1"),
        (math.nan, "jitter (election_jitter) must be in [0, 0.5): got nan"),
        (math.inf, "jitter (election_jitter) must be in [0, 0.5): got inf"),
    ],
    ids=repr,
)
def test_bad_jitter_is_rejected(jitter: Any, fragment: str) -> None:
    assert problems_of(jitter=jitter) == [fragment]


@pytest.mark.parametrize("jitter", [0, 0.0, 0.25, 0.49])
def test_jitter_in_range_is_accepted(jitter: float) -> None:
    assert ElectionConfig.create(jitter=jitter).jitter == float(jitter)


@pytest.mark.parametrize("standbys", [-1, 65, 1.5, True, "2", None])
def test_standbys_outside_0_to_64_is_one_clear_problem(standbys: Any) -> None:
    assert problems_of(standbys=standbys) == [
        "standbys (election_standbys) must be a whole number from 0 to 64 (0: every "
        f"follower waits on the lock): got {standbys!r}"
    ]


@pytest.mark.parametrize("standbys", [0, 1, 2, 64])
def test_standbys_in_range_is_accepted(standbys: int) -> None:
    assert ElectionConfig.create(standbys=standbys).standbys == standbys


# -- inconsistent timings -------------------------------------------------------------------

TTL_VS_RENEW = (
    "ttl (election_ttl) must exceed 2 x renew_interval (election_renew_interval): "
    "got ttl={ttl}s, renew_interval={renew}s"
)
MARGIN_VS_WINDOW = (
    "safety_margin (election_safety_margin) must be less than ttl - renew_interval, "
    "or the leader stops trusting its lease before it renews: "
    "got safety_margin={margin}s, ttl={ttl}s, renew_interval={renew}s"
)
TIMEOUT_VS_RENEW = (
    "call_timeout (election_call_timeout) must not exceed renew_interval: "
    "got call_timeout={timeout}s, renew_interval={renew}s"
)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"ttl": 5, "renew_interval": 3}, TTL_VS_RENEW.format(ttl=5.0, renew=3.0)),
        ({"ttl": 6, "renew_interval": 3}, TTL_VS_RENEW.format(ttl=6.0, renew=3.0)),
        (
            {"ttl": timedelta(seconds=4), "renew_interval": timedelta(seconds=2)},
            TTL_VS_RENEW.format(ttl=4.0, renew=2.0),
        ),
        (
            {"ttl": 10, "renew_interval": 3, "safety_margin": 8},
            MARGIN_VS_WINDOW.format(margin=8.0, ttl=10.0, renew=3.0),
        ),
        (
            {"ttl": 10, "renew_interval": 3, "safety_margin": 7},
            MARGIN_VS_WINDOW.format(margin=7.0, ttl=10.0, renew=3.0),
        ),
        (
            {"ttl": 10, "renew_interval": 3, "call_timeout": 4},
            TIMEOUT_VS_RENEW.format(timeout=4.0, renew=3.0),
        ),
        (
            {"ttl": 10, "renew_interval": 3, "call_timeout": 3.001},
            TIMEOUT_VS_RENEW.format(timeout=3.001, renew=3.0),
        ),
    ],
    ids=[
        "ttl<2renew",
        "ttl=2renew",
        "timedeltas",
        "margin>window",
        "margin=window",
        "timeout>renew",
        "timeout-just-over",
    ],
)
def test_inconsistent_timings_are_rejected(kwargs: dict[str, Any], problem: str) -> None:
    assert problems_of(**kwargs) == [problem]


def test_ttl_vs_renew_message_has_the_documented_shape() -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionConfig.create(ttl=5, renew_interval=3)
    message = str(info.value)
    assert "ttl (election_ttl) must exceed 2 x renew_interval" in message
    assert "got ttl=5.0s, renew_interval=3.0s" in message


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ttl": 6.01, "renew_interval": 3},
        {"ttl": 10, "renew_interval": 3, "safety_margin": 6.99},
        {"ttl": 10, "renew_interval": 3, "call_timeout": 3},
        {"ttl": 10, "renew_interval": 3, "call_timeout": 0.1},
    ],
)
def test_timings_at_the_edge_are_accepted(kwargs: dict[str, Any]) -> None:
    config = ElectionConfig.create(**kwargs)
    for name, value in kwargs.items():
        assert getattr(config, name) == float(value)


def test_explicit_renew_interval_is_checked_against_default_ttl() -> None:
    assert problems_of(renew_interval=5) == [TTL_VS_RENEW.format(ttl=10.0, renew=5.0)]


def test_default_margin_is_checked_against_explicit_renew_interval() -> None:
    # ttl 10 gives a default margin of 2, which does not fit in ttl - renew = 1.5 either.
    problems = problems_of(ttl=10, renew_interval=8.5)
    assert problems == [
        TTL_VS_RENEW.format(ttl=10.0, renew=8.5),
        MARGIN_VS_WINDOW.format(margin=2.0, ttl=10.0, renew=8.5),
    ]


# -- many problems at once ------------------------------------------------------------------


def test_every_problem_is_reported_in_one_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionConfig.create(
            ttl=5,
            renew_interval=3,
            safety_margin=4,
            call_timeout=4,
            jitter=0.7,
            candidate_ttl=0,
            poll_interval="fast",
        )
    err = info.value
    assert err.problems == [
        "poll_interval (election_poll_interval) must be a number of seconds or a timedelta: "
        "got 'fast'",
        "candidate_ttl (election_candidate_ttl) must be a positive number of seconds: got 0",
        "jitter (election_jitter) must be in [0, 0.5): got 0.7",
        TTL_VS_RENEW.format(ttl=5.0, renew=3.0),
        MARGIN_VS_WINDOW.format(margin=4.0, ttl=5.0, renew=3.0),
        TIMEOUT_VS_RENEW.format(timeout=4.0, renew=3.0),
    ]
    message = str(err)
    assert message.splitlines()[0] == "invalid election configuration:"
    for problem in err.problems:
        assert f"  - {problem}" in message
    assert len(message.splitlines()) == 1 + len(err.problems)


def test_bad_values_of_every_field_are_all_reported() -> None:
    problems = problems_of(**dict.fromkeys(SECONDS_FIELDS, -1), jitter=-1)
    assert len(problems) == len(SECONDS_FIELDS) + 1
    for field in [*SECONDS_FIELDS, "jitter"]:
        assert sum(p.startswith(f"{field} (election_{field}) ") for p in problems) == 1, field


def test_invalid_ttl_skips_the_checks_that_depend_on_it() -> None:
    # A second, derived complaint about the same bad ttl would only be noise.
    assert problems_of(ttl=-10, renew_interval=3) == [
        "ttl (election_ttl) must be a positive number of seconds: got -10"
    ]


# -- the error type -------------------------------------------------------------------------


def test_configuration_error_is_a_value_error_and_an_election_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionConfig.create(ttl=0)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ElectionError)
    with pytest.raises(ValueError, match=r"ttl \(election_ttl\)"):
        ElectionConfig.create(ttl=0)
    with pytest.raises(ElectionError, match=r"ttl \(election_ttl\)"):
        ElectionConfig.create(ttl=0)


def test_configuration_error_from_one_string() -> None:
    err = ConfigurationError("one thing is wrong")
    assert err.problems == ["one thing is wrong"]
    assert str(err) == "one thing is wrong"


def test_configuration_error_from_a_list() -> None:
    err = ConfigurationError(["a is wrong", "b is wrong"])
    assert err.problems == ["a is wrong", "b is wrong"]
    assert str(err) == "invalid election configuration:\n  - a is wrong\n  - b is wrong"


# -- from_settings --------------------------------------------------------------------------


def test_from_settings_reads_election_keys_and_ignores_the_rest() -> None:
    settings: dict[str, Any] = {
        "election_ttl": 30,
        "election_renew_interval": timedelta(seconds=5),
        "election_poll_interval": 0.5,
        "election_jitter": 0.2,
        "election_safety_margin": 4,
        "election_call_timeout": 2,
        "election_resign_backoff": 15,
        "election_candidate_ttl": 120,
        "election_fallback_interval": 90,
        # Not timings: other election settings and the rest of the app's config.
        "election_url": "sqlite:///x.db",
        "election_namespace": "prod",
        "election_table_prefix": "x_",
        "broker_url": "memory://",
        "ttl": 1,
        "renew_interval": "nonsense",
        "ELECTION_TTL": "also not ours",
    }
    config = ElectionConfig.from_settings(settings)
    assert as_dict(config) == {
        "ttl": 30.0,
        "renew_interval": 5.0,
        "poll_interval": 0.5,
        "jitter": 0.2,
        "safety_margin": 4.0,
        "call_timeout": 2.0,
        "resign_backoff": 15.0,
        "candidate_ttl": 120.0,
        "fallback_interval": 90.0,
    }


def test_from_settings_empty_gives_defaults() -> None:
    assert ElectionConfig.from_settings({}) == ElectionConfig.create()


def test_from_settings_none_means_unset() -> None:
    config = ElectionConfig.from_settings({"election_ttl": 30, "election_renew_interval": None})
    assert as_dict(config) == pytest.approx(expected_defaults(30.0))


def test_from_settings_overrides_win_and_none_overrides_are_ignored() -> None:
    config = ElectionConfig.from_settings(
        {"election_ttl": 30, "election_poll_interval": 2}, ttl=60, poll_interval=None
    )
    assert config.ttl == 60.0
    assert config.poll_interval == 2.0


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            {"election_ttl": "30"},
            "ttl (election_ttl) must be a number of seconds or a timedelta: got '30'",
        ),
        (
            {"election_call_timeout": True},
            "call_timeout (election_call_timeout) must be a number of seconds or a timedelta: "
            "got True",
        ),
        (
            {"election_candidate_ttl": -60},
            "candidate_ttl (election_candidate_ttl) must be a positive number of seconds: got -60",
        ),
        (
            {"election_ttl": 5, "election_renew_interval": 3},
            TTL_VS_RENEW.format(ttl=5.0, renew=3.0),
        ),
    ],
)
def test_from_settings_rejects_bad_settings_by_name(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ElectionConfig.from_settings(settings)
    assert info.value.problems == [problem]


# -- namespace and candidate id -------------------------------------------------------------

NS = "namespace (election_namespace)"
CID = "candidate_id"
KEY_CHECKS = [
    pytest.param(validate_namespace, NS, MAX_NAMESPACE_LENGTH, id="namespace"),
    pytest.param(validate_candidate_id, CID, MAX_CANDIDATE_ID_LENGTH, id="candidate_id"),
]


def test_key_length_limits() -> None:
    assert MAX_NAMESPACE_LENGTH == 190
    assert MAX_CANDIDATE_ID_LENGTH == 255


@pytest.mark.parametrize(("check", "kind", "limit"), KEY_CHECKS)
@pytest.mark.parametrize(
    "value", ["default", "prod-eu", "a", "host:1234:abcdef12", "prödüction", "a b", "Ω"]
)
def test_good_keys_are_returned(check: Any, kind: str, limit: int, value: str) -> None:
    assert check(value) == value


@pytest.mark.parametrize(("check", "kind", "limit"), KEY_CHECKS)
def test_key_at_the_limit_is_accepted(check: Any, kind: str, limit: int) -> None:
    assert check("x" * limit) == "x" * limit


@pytest.mark.parametrize(("check", "kind", "limit"), KEY_CHECKS)
def test_key_over_the_limit_is_rejected(check: Any, kind: str, limit: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        check("x" * (limit + 1))
    message = str(info.value)
    assert message.startswith(f"{kind} must be at most {limit} characters: got {limit + 1} ")
    assert len(message) < 200  # the value is abbreviated, not echoed whole


@pytest.mark.parametrize(("check", "kind", "limit"), KEY_CHECKS)
@pytest.mark.parametrize("value", ["", " ", " prod", "prod ", "\tprod", "prod\n"], ids=repr)
def test_empty_or_padded_keys_are_rejected(check: Any, kind: str, limit: int, value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        check(value)
    assert str(info.value) == (
        f"{kind} must be non-empty without leading or trailing spaces: got {value!r}"
    )


@pytest.mark.parametrize(("check", "kind", "limit"), KEY_CHECKS)
@pytest.mark.parametrize(
    "value",
    ["a\nb", "a\rb", "a\tb", "a\x00b", "a\x1bb", "a\x7fb", "a\x85b", "a\x9bb"],
    ids=repr,
)
def test_control_characters_are_rejected(check: Any, kind: str, limit: int, value: str) -> None:
    # All of Unicode category Cc: C0, DEL and C1 (U+0085 is a line break to splitlines()).
    with pytest.raises(ConfigurationError) as info:
        check(value)
    assert str(info.value) == f"{kind} must not contain control characters: got {value!r}"


@pytest.mark.parametrize(("check", "kind", "limit"), KEY_CHECKS)
@pytest.mark.parametrize("value", [None, 42, b"prod", ["prod"]], ids=repr)
def test_non_string_keys_are_rejected(check: Any, kind: str, limit: int, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        check(value)
    assert str(info.value) == f"{kind} must be a string: got {value!r}"


# -- the Elector constructor ----------------------------------------------------------------


def test_elector_takes_timing_arguments() -> None:
    elector = Elector(MemoryBackend(), "ns", "me", ttl=30, renew_interval=timedelta(seconds=5))
    assert elector.config == ElectionConfig.create(ttl=30, renew_interval=5)
    assert elector.namespace == "ns"
    assert elector.candidate_id == "me"


def test_elector_takes_a_config() -> None:
    config = ElectionConfig.create(ttl=30)
    assert Elector(MemoryBackend(), config=config).config is config


def test_elector_defaults() -> None:
    elector = Elector(MemoryBackend())
    assert elector.config == ElectionConfig.create()
    assert elector.namespace == "default"
    validate_candidate_id(elector.candidate_id)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"ttl": 5, "renew_interval": 3}, TTL_VS_RENEW.format(ttl=5.0, renew=3.0)),
        ({"ttl": 0}, "ttl (election_ttl) must be a positive number of seconds: got 0"),
        ({"jitter": 0.5}, "jitter (election_jitter) must be in [0, 0.5): got 0.5"),
        (
            {"call_timeout": timedelta(seconds=60)},
            TIMEOUT_VS_RENEW.format(timeout=60.0, renew=4.0),
        ),
    ],
)
def test_elector_rejects_bad_timings_at_construction(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Elector(MemoryBackend(), "ns", **kwargs)
    assert info.value.problems == [problem]


def test_elector_reports_all_timing_problems_at_once() -> None:
    with pytest.raises(ConfigurationError) as info:
        Elector(MemoryBackend(), ttl=5, renew_interval=3, jitter=-1)
    assert info.value.problems == [
        "jitter (election_jitter) must be in [0, 0.5): got -1",
        TTL_VS_RENEW.format(ttl=5.0, renew=3.0),
    ]


@pytest.mark.parametrize("timing", [{"ttl": 30}, {"jitter": 0.2}, {"ttl": 30, "call_timeout": 1}])
def test_elector_refuses_config_and_timing_arguments_together(timing: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as info:
        Elector(MemoryBackend(), config=ElectionConfig.create(), **timing)
    assert str(info.value) == (
        f"pass either config= or timing arguments, not both: got {sorted(timing)}"
    )


@pytest.mark.parametrize(
    "backend",
    [object(), None, "memory://", MemoryBackend],
    ids=["object()", "None", "'memory://'", "MemoryBackend"],  # ids that do not vary by run
)
def test_elector_refuses_a_non_backend(backend: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        Elector(backend)
    problem = (
        "a class, not an instance"
        if backend is MemoryBackend
        else f"it has no {', '.join(BACKEND_MEMBERS)}"
    )
    assert str(info.value) == (
        f"backend must be a celery_election backend (see backend_from_url): got {backend!r}: "
        + problem
    )


class _Proxy:
    """A user's wrapper around a backend: every attribute forwarded, nothing declared."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self._inner, name)


def test_a_proxy_around_a_backend_is_a_backend() -> None:
    """Accepted by what it can do: ``isinstance`` against the Protocol refused it on 3.12+."""
    proxy = _Proxy(MemoryBackend())
    elector = Elector(proxy, "proxied", ttl=3)
    with elector:
        assert elector.wait_for_leadership(5)
    assert "elect" in proxy.calls


def test_a_backend_missing_a_call_is_refused_by_name() -> None:
    class Partial(_Proxy):
        def __getattr__(self, name: str) -> Any:
            if name == "take_over":
                raise AttributeError(name)
            return super().__getattr__(name)

    with pytest.raises(ConfigurationError, match=r": it has no take_over$"):
        Elector(Partial(MemoryBackend()))


@pytest.mark.parametrize(
    ("namespace", "problem"),
    [
        ("", f"{NS} must be non-empty without leading or trailing spaces: got ''"),
        (" ns", f"{NS} must be non-empty without leading or trailing spaces: got ' ns'"),
        ("n\ns", f"{NS} must not contain control characters: got 'n\\ns'"),
        (None, f"{NS} must be a string: got None"),
    ],
    ids=repr,
)
def test_elector_refuses_a_bad_namespace(namespace: Any, problem: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Elector(MemoryBackend(), namespace)
    assert str(info.value) == problem


@pytest.mark.parametrize("candidate_id", ["", "me ", "x" * 256, 7], ids=repr)
def test_elector_refuses_a_bad_candidate_id(candidate_id: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"^candidate_id must "):
        Elector(MemoryBackend(), "ns", candidate_id)


def test_a_config_cannot_exist_invalid() -> None:
    """The constructor fills and checks (it once left derived fields at 0.0, and
    candidate_ttl=0 made the elector heartbeat in a hot loop)."""
    import dataclasses

    assert ElectionConfig() == ElectionConfig.create()
    assert ElectionConfig(ttl=30).renew_interval == 12.0
    assert ElectionConfig().candidate_ttl == 180.0
    with pytest.raises(ConfigurationError, match=r"candidate_ttl \(election_candidate_ttl\)"):
        ElectionConfig(candidate_ttl=0)
    with pytest.raises(ConfigurationError, match="candidate_ttl"):
        dataclasses.replace(ElectionConfig(), candidate_ttl=0)
    # replace() keeps the other values as given: a ttl too short for them is refused
    with pytest.raises(ConfigurationError, match="must exceed 2 x renew_interval"):
        dataclasses.replace(ElectionConfig(), ttl=5)
    assert dataclasses.replace(ElectionConfig(ttl=5), jitter=0).jitter == 0.0


def test_unknown_timing_names_are_one_clear_error() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown election timing.*tll.*use call_timeout"):
        Elector(MemoryBackend(), tll=5)


# -- the settings: one definition -----------------------------------------------------------


def test_every_timing_is_a_documented_setting() -> None:
    import dataclasses

    from celery_election.settings import SETTINGS

    arguments = {s.argument for s in SETTINGS if s.argument}
    assert arguments == {f.name for f in dataclasses.fields(ElectionConfig)}


def test_only_the_settings_module_reads_election_settings() -> None:
    """An ``election_*`` key read anywhere else escapes validation (tasks.py once did)."""
    import re
    from pathlib import Path

    package = Path(__file__).resolve().parents[2] / "celery_election"
    reads = re.compile(r"""conf(\.get\(|\[)\s*["']election_|conf\.election_""")
    offenders = [
        str(f.relative_to(package))
        for f in package.rglob("*.py")
        if f.name != "settings.py" and reads.search(f.read_text())
    ]
    assert offenders == []


LIVENESS_TOO_SHORT = (
    "liveness (election_liveness) must be at least 0.2s (or False to turn it off): a shorter "
    "delta ends leadership at a GC pause; got {value!r}"
)
LIVENESS_VS_WINDOW = (
    "liveness (election_liveness) must be less than the trust window ttl - safety_margin "
    "({window:g}s), or the lease would end first: got {value!r}"
)


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"liveness": 0.1}, LIVENESS_TOO_SHORT.format(value=0.1)),
        ({"liveness": 0.199}, LIVENESS_TOO_SHORT.format(value=0.199)),
        ({"ttl": 10, "liveness": 8}, LIVENESS_VS_WINDOW.format(window=8, value=8)),
        ({"ttl": 10, "liveness": 9}, LIVENESS_VS_WINDOW.format(window=8, value=9)),
        (
            {"ttl": 10, "safety_margin": 4, "liveness": 6},
            LIVENESS_VS_WINDOW.format(window=6, value=6),
        ),
    ],
    ids=["below-min", "just-below-min", "window", "over-window", "window-with-margin"],
)
def test_liveness_rules(kwargs: dict[str, Any], problem: str) -> None:
    """Each liveness rule, one row each: removing a rule fails its rows."""
    assert problems_of(**kwargs) == [problem]


@pytest.mark.parametrize(
    ("kwargs", "delta"),
    [
        ({"liveness": 0.2}, 0.2),
        ({"ttl": 10, "liveness": 7.99}, 7.99),
        ({"liveness": False}, None),
        ({"ttl": 0.5}, None),  # the default would be under 0.2 s: off
    ],
)
def test_liveness_at_the_edges_is_accepted(kwargs: dict[str, Any], delta: float | None) -> None:
    assert ElectionConfig.create(**kwargs).liveness == delta
