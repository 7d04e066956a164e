"""The controller's heartbeat arguments: a short period, and a dead engine still declared after 30 s."""

from jupyter_dist.cluster import heartbeat


def test_the_period_is_short_and_the_silence_before_death_is_the_default_30_s() -> None:
    args = dict(a.lstrip("-").split("=") for a in heartbeat.controller_args())
    period_ms = int(args["HeartMonitor.period"])
    misses = int(args["HeartMonitor.max_heartmonitor_misses"])
    assert period_ms < 3000  # ipyparallel's default rounds every engine start up to a 3 s tick
    assert period_ms * misses == 30_000
