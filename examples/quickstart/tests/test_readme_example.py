# The docs' "Testing your app" page includes this file as it is (docs/testing.md).
from proj.tasks import refresh_report


def test_the_leader_refreshes(election):  # this process leads: term 1
    assert refresh_report.apply().get() == election.term == 1


def test_a_follower_does_not(election_follower):  # another worker leads
    assert refresh_report.apply().state != "SUCCESS"  # requeued: never run here


def test_a_failover_while_the_old_leader_lives(election):
    assert election.failover() == 2  # tasks started from now on see term 2
    assert refresh_report.apply().get() == 2
