"""Remote control: ``celery inspect election`` and ``celery control election_resign``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery.worker.control import Panel

from celery_election.integration import control  # noqa: F401  (registers the commands)


def control_state(step: Any) -> Any:
    controller = SimpleNamespace() if step is None else SimpleNamespace(election=step)
    return SimpleNamespace(consumer=SimpleNamespace(controller=controller))


def test_commands_are_registered() -> None:
    assert Panel.meta["election"].type == "inspect"
    assert Panel.meta["election_resign"].type == "control"


def test_inspect_election_without_election() -> None:
    assert Panel.data["election"](control_state(None)) == {"enabled": False}


def test_inspect_election_reports_the_step() -> None:
    info = {"namespace": "ns", "leader": True, "term": 12, "trusted_for": 3.5}
    step = SimpleNamespace(info=lambda: info)
    assert Panel.data["election"](control_state(step)) == {"enabled": True, **info}


class FakeElector:
    def __init__(self, is_leader: bool, resigns: bool) -> None:
        self.is_leader = is_leader
        self._resigns = resigns
        self.calls: list[dict[str, Any]] = []

    def resign(self, **kwargs: Any) -> bool:
        self.calls.append(kwargs)
        self.is_leader = False
        return self._resigns


@pytest.mark.parametrize("step", [None, SimpleNamespace(elector=None)])
def test_resign_without_election(step: Any) -> None:
    reply = Panel.data["election_resign"](control_state(step))
    assert set(reply) == {"error"}
    assert "not enabled" in reply["error"]


@pytest.mark.parametrize(
    ("is_leader", "resigns", "expected"),
    [
        (True, True, {"ok": "resigned"}),
        (False, True, {"ok": "released an unconfirmed term"}),
        (False, False, {"ok": "not the leader"}),
    ],
)
def test_resign(is_leader: bool, resigns: bool, expected: dict[str, str]) -> None:
    elector = FakeElector(is_leader, resigns)
    reply = Panel.data["election_resign"](control_state(SimpleNamespace(elector=elector)))
    assert reply == expected
    assert len(elector.calls) == 1
    assert elector.calls[0].get("wait") is True
