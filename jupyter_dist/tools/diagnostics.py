"""`%dist doctor` and `%dist bench allreduce`: the fabric report and the bandwidth bench.

Doctor detects each node where its engines run (this host for virtual nodes; an engine of
each node for real hosts once the cluster is up) and needs no running cluster otherwise.
The bench runs on the current layout through the same path as a `%%distrun` cell.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from jupyter_dist.common.hosts import is_local_host
from jupyter_dist.engine import probes as bench
from jupyter_dist.plan import fabric_env as fabric
from jupyter_dist.plan.layout import build_layout
from jupyter_dist.plan.spec import RunSpec
from jupyter_dist.tools import doctor


def detect_nodes(session: Any, spec: RunSpec) -> list[fabric.NodeFabric]:
    """One `NodeFabric` per node: local detection for this host, an engine's for other hosts."""
    layout = build_layout(spec.nodes, spec.procs_per_node, spec.hosts, master_port=1)
    local = fabric.detect_node(layout.master_addr)
    nodes: list[fabric.NodeFabric] = []
    cluster = session.cluster
    for n, host in enumerate(layout.hosts):
        if is_local_host(host) or not cluster.running or cluster.shape is None:
            nodes.append(local)
            continue
        leader = cluster.engines[n * spec.procs_per_node]
        data = cluster.client[leader.engine_id].apply_sync(_detect_json, layout.master_addr)
        nodes.append(fabric.NodeFabric.from_json(data))
    return nodes


def _detect_json(master_addr: str) -> dict[str, Any]:
    from jupyter_dist.plan import fabric_env as f
    return f.detect_node(master_addr).to_json()


def doctor_report(session: Any, spec: RunSpec) -> doctor.DoctorReport:
    nodes = detect_nodes(session, spec)
    layout = build_layout(spec.nodes, spec.procs_per_node, spec.hosts, master_port=1)
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
    from IPython.display import display

    display({"text/plain": report.to_text(), "text/html": report.to_html()}, raw=True)


def run_allreduce_bench(session: Any, spec: RunSpec, sizes: list[int] | None = None, iters: int = 5) -> dict[str, Any]:
    """All-reduce timings on every rank of `spec`'s layout (torch.distributed env, the run's backend)."""
    spec = replace(spec, framework="pytorch")
    p = session.prepare(spec, None)
    session.bring_up(p)
    cluster = session.cluster
    ids = [e.engine_id for e in cluster.engines]
    ar = cluster.client[ids].apply_async(bench.allreduce_bench, sizes, iters=iters)
    rows_by_rank = ar.get(timeout=spec.timeout or 600)
    local = cluster.client[ids[0]].apply_sync(bench.local_copy_bandwidth)
    return {"rows": rows_by_rank[0], "world_size": spec.world_size, "backend": p.backend, "local_copy_GBps": local}


def show_bench(result: dict[str, Any]) -> None:
    from IPython.display import Image, display

    rows, world, backend = result["rows"], result["world_size"], result["backend"]
    table = bench.format_table(rows, world, backend)
    local = f"local copy on one rank (the local limit): {result['local_copy_GBps']:.2f} GB/s"
    display({"text/plain": f"{table}\n{local}", "text/html": bench.to_html(rows, world, backend) + f"<p>{local}</p>"}, raw=True)
    display(Image(data=bench.chart_png(rows, result["local_copy_GBps"])))
