"""Each rank's record of its collectives (real torch, a gloo group of one) and its resource samples
(real psutil), and the kernel side's store and drawings of them (pure, on samples made by hand)."""

from __future__ import annotations

import time

import pytest

from jupyter_dist.cluster.agents import AgentAddress, RankAgents
from jupyter_dist.engine import agent, collectives, resources
from jupyter_dist.run.resources import GIB, ResourcePoller, ResourceStore
from jupyter_dist.views.resources_view import resource_panels, resources_png, resources_svg, thinned


def sample(t: float, cpu: float, rss_gib: float, avail: float = 0.5, gpus=()) -> dict:
    return {"t": t, "cpu": cpu, "rss": int(rss_gib * GIB), "mem_total": 16 * GIB, "mem_avail": int(avail * 16 * GIB),
            "gpus": list(gpus)}


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    collectives.install()
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "s"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield torch, dist
    dist.destroy_process_group()


def test_collectives_are_numbered_with_their_sizes_and_nested_calls_are_not(group):
    torch, dist = group
    collectives.reset()
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(torch.zeros(2, 3, dtype=torch.float64), 0)
    dist.all_gather_object([None], {"x": 1})  # torch calls all_gather inside: one record
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    got = collectives.snapshot()
    assert got["in_flight"] == []
    assert [(r["op"], r["seq"]) for r in got["done"]] == [("all_reduce", 1), ("broadcast", 2),
                                                         ("all_gather_object", 3), ("all_reduce", 4)]
    assert got["done"][0]["tensors"] == [[[4], "float32"]]
    assert got["done"][1]["tensors"] == [[[2, 3], "float64"]]
    collectives.reset("the next cell")
    assert collectives.snapshot()["done"] == []


def test_a_subgroup_is_named_by_its_ranks_and_a_failed_collective_is_over(group):
    torch, dist = group
    collectives.reset()
    dist.all_reduce(torch.ones(1), group=dist.new_group([0]))
    with pytest.raises(Exception):  # noqa: B017, PT011 - torch's error type for a bad source rank varies
        dist.broadcast(torch.ones(1), 7)
    got = collectives.snapshot()
    assert got["in_flight"] == []
    assert [(r["op"], r["group"], r.get("error") is not None) for r in got["done"]] == [
        ("all_reduce", "ranks 0", False), ("broadcast", "default", True)]


def test_the_sampler_keeps_this_process_cpu_and_memory():
    resources.start(interval=0.05)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(resources.samples()["samples"]) < 2:
        time.sleep(0.05)
    got = resources.samples()
    s = got["samples"][-1]
    assert s["rss"] > 10 << 20 and s["mem_total"] >= s["mem_avail"] > 0 and s["cpu"] >= 0
    assert resources.samples({"since": s["t"]})["samples"] == []


def test_the_store_names_a_rank_near_its_memory_limit_and_sums_up_each_rank():
    store = ResourceStore()
    store.add(0, [sample(1.0, 50, 1.0), sample(2.0, 150, 1.5)])
    store.add(1, [sample(1.0, 90, 2.0), sample(2.0, 100, 6.0, avail=0.05)])
    store.add(2, [sample(1.0, 90, 2.0, gpus=[{"index": 0, "util": 97, "mem": 70 * GIB, "mem_used": 76 * GIB,
                                              "mem_total": 80 * GIB}])])
    assert store.peak_rss() == {0: int(1.5 * GIB), 1: 6 * GIB, 2: 2 * GIB}
    assert store.near_limit() == ["rank 1: host memory 95% used (the rank's 6.0 GiB)",
                                  "rank 2: GPU 0 memory 95% used (the rank's 70.0 GiB)"]
    assert store.summary_lines()[0] == "rank 0: CPU 100% mean, 150% peak; memory 1.50 GiB peak"
    assert store.summary_lines()[2].endswith("GPU 97% peak utilisation, 70.00 GiB peak memory")


def test_the_drawings_show_every_rank_and_gpus_only_where_sampled():
    store = ResourceStore()
    for r in range(4):
        store.add(r, [sample(t, 10 * r, 0.1 * (r + 1)) for t in (1.0, 2.0, 3.0, 4.0, 5.0)])
    panels = resource_panels(store.copy())
    assert [p.title for p in panels] == ["CPU % (100 = one core)", "resident memory, GiB"]
    assert [s.label for s in panels[0].series] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert resources_svg(store).startswith("<svg")
    assert resources_png(store)[:4] == b"\x89PNG"
    short = ResourceStore()
    short.add(0, [sample(t, 1, 0.1) for t in (1.0, 2.0, 3.0)])
    assert resources_png(short) is None  # a run of a few seconds leaves no chart


def test_the_poller_gathers_a_rank_samples_from_its_agent_while_a_run_goes():
    ranks = RankAgents()
    resources.register()
    resources.start(interval=0.05)  # already running at 0.05 s when the test above started it
    host, port = agent.start(ranks.token)
    ranks.addresses[3] = AgentAddress(host, port)
    with ResourcePoller(ranks, interval=0.1) as poller:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(poller.store.samples.get(3, [])) < 3:
            time.sleep(0.05)
    got = poller.store.samples[3]
    assert len(got) >= 3 and all(s["t"] >= poller.started for s in got)
    assert [s["t"] for s in got] == sorted({s["t"] for s in got})  # each sample once, in order


def test_a_long_run_is_thinned_for_the_live_view_keeping_its_last_sample():
    samples = [sample(float(t), t % 7, 0.1) for t in range(1, 1001)]
    kept = thinned(samples, 300)
    assert len(kept) <= 301 and kept[0] is samples[0] and kept[-1] is samples[-1]
    assert thinned(samples[:10], 300) == samples[:10] and thinned(samples, None) is samples
    store = ResourceStore()
    store.add(0, samples)
    assert len(resource_panels(store.copy(), max_points=300)[0].series[0].xs) == len(kept)
    assert len(resource_panels(store.copy())[0].series[0].xs) == 1000  # the saved PNG keeps every sample
