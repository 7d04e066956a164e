"""Hand-made `NodeFabric`s for unit tests: one factory for every test module (tests/ is on the pythonpath)."""

from __future__ import annotations

from typing import Any

from jupyter_dist.common.node import IBPort, NodeFabric

ACTIVE = (IBPort("mlx5_0", 1, "ACTIVE", "InfiniBand"),)
DOWN = (IBPort("mlx5_0", 1, "DOWN", "InfiniBand"),)
ROCE = (IBPort("mlx5_0", 1, "ACTIVE", "Ethernet"),)


def node(**kw: Any) -> NodeFabric:
    """A CPU-only node with Open MPI and one Ethernet interface; `kw` overrides any field."""
    base: dict[str, Any] = dict(
        hostname="n0",
        gpu_count=0,
        gpu_names=(),
        ib_ports=(),
        interfaces=("eth0", "lo"),
        route_interface="eth0",
        mpi="Open MPI 5.0.11 (mpiexec at /x/bin/mpiexec)",
        topo_file=None,
        vm_size=None,
    )
    base.update(kw)
    return NodeFabric(**base)


# what the magics and the panel see on this host in their tests: 4 cores, no GPU, no MPI
HERE = node(hostname="here", interfaces=("lo", "eth0"), route_interface=None, mpi=None, cpu_count=4)
