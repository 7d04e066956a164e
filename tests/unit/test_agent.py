"""The rank agent answers from its own thread while the main thread waits; the token is checked."""

from __future__ import annotations

import threading
import time

import pytest

from jupyter_dist.cluster.agents import AgentAddress, RankAgents
from jupyter_dist.engine import agent, stacks

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def agents() -> RankAgents:
    ranks = RankAgents()
    stacks.register()
    host, port = agent.start(ranks.token)
    ranks.addresses[0] = AgentAddress(host, port)
    return ranks


def test_stacks_while_another_thread_waits(agents):
    release = threading.Event()

    def waiting_in_a_collective() -> None:
        release.wait(10)

    t = threading.Thread(target=waiting_in_a_collective, name="worker")
    t.start()
    try:
        t0 = time.monotonic()
        answers = agents.ask("stacks", timeout=2)
        assert time.monotonic() - t0 < 1.5
    finally:
        release.set()
        t.join()
    threads = {s["thread"]: s for s in answers.results[0]}
    assert answers.missing == {}
    assert threads["MainThread"]["main"] and next(iter(answers.results[0]))["thread"] == "MainThread"
    assert any(f[2] == "waiting_in_a_collective" for f in threads["worker"]["frames"])
    assert not any(name.startswith("jupyter-dist agent") for name in threads)


def test_a_wrong_token_and_an_unknown_op_are_refused(agents):
    stranger = RankAgents(addresses=agents.addresses)
    assert stranger.ask("stacks").missing == {0: "bad token"}
    assert agents.ask("format_disk").missing == {0: "unknown operation 'format_disk'"}


def test_a_rank_without_an_agent_is_named_missing(agents):
    closed = RankAgents(token=agents.token, addresses={**agents.addresses, 1: AgentAddress("127.0.0.1", 1)})
    answers = closed.ask("stacks", timeout=0.5)
    assert set(answers.results) == {0} and set(answers.missing) == {1}
    assert set(closed.ask("stacks", ranks=[2]).missing) == {2}
