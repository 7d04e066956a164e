"""`%dist doctor` and `%dist bench allreduce`: the fabric report and the bandwidth bench.

Doctor detects each node where its engines run (this host for virtual nodes; an engine of
each node for real hosts once the cluster is up) and needs no running cluster otherwise.
The bench runs on the current layout through the same path as a `%%distrun` cell.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from IPython.display import Image, display

from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.common.node import NodeFabric
from jupyter_dist.engine import node_probe, probes
from jupyter_dist.plan.plan import layout_of
from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools import bench_report as bench
from jupyter_dist.tools import doctor


def detect_nodes(session: Any, spec: RunSpec) -> list[NodeFabric]:
    """One `NodeFabric` per node: local detection for this host, an engine's for other hosts."""
    layout = layout_of(spec)
    local = node_probe.detect_node(layout.master_addr)
    nodes: list[NodeFabric] = []
    cluster = session.cluster
    for n, host in enumerate(layout.hosts):
        if is_local_host(host) or not cluster.running or cluster.shape is None:
            nodes.append(local)
            continue
        leader = cluster.engines[n * spec.procs_per_node]
        data = cluster.client[leader.engine_id].apply_sync(node_probe.detect_node_json, layout.master_addr)
        nodes.append(NodeFabric.from_json(data))
    return nodes


def doctor_report(session: Any, spec: RunSpec) -> doctor.DoctorReport:
    nodes = detect_nodes(session, spec)
    layout = layout_of(spec)
    return doctor.build_report(
        nodes,
        procs_per_node=spec.procs_per_node,
        nodes_requested=spec.nodes,
        backend=spec.backend,
        ib=spec.ib,
        kernel_env=os.environ,
        master_addr=layout.master_addr,
        all_local=layout.all_local,
        launcher=spec.launcher,
        nccl_debug=spec.nccl_debug,
    )


def show_doctor(report: doctor.DoctorReport) -> None:
    display({"text/plain": report.to_text(), "text/html": report.to_html()}, raw=True)


def run_allreduce_bench(session: Any, spec: RunSpec, sizes: list[int] | None = None, iters: int = 5) -> dict[str, Any]:
    """All-reduce timings on every rank of `spec`'s layout (torch.distributed env, the run's backend)."""
    spec = replace(spec, framework="pytorch")
    p = session.prepare(spec, None)
    session.bring_up(p)
    cluster = session.cluster
    ids = [e.engine_id for e in cluster.engines]
    ar = cluster.client[ids].apply_async(probes.allreduce_bench, sizes, iters=iters)
    rows_by_rank = ar.get(timeout=spec.timeout or 600)
    local = cluster.client[ids[0]].apply_sync(probes.local_copy_bandwidth)
    return {"rows": rows_by_rank[0], "world_size": spec.world_size, "backend": p.backend, "local_copy_GBps": local}


def show_bench(result: dict[str, Any]) -> None:
    rows, world, backend = result["rows"], result["world_size"], result["backend"]
    table = bench.format_table(rows, world, backend)
    local = f"local copy on one rank (the local limit): {result['local_copy_GBps']:.2f} GB/s"
    display({"text/plain": f"{table}\n{local}", "text/html": bench.to_html(rows, world, backend) + f"<p>{local}</p>"}, raw=True)
    display(Image(data=bench.chart_png(rows, result["local_copy_GBps"])))
