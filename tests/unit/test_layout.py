from __future__ import annotations

import socket

import pytest

from jupyter_dist.common.ports import LISTEN_PORTS_LOW, ephemeral_low, free_ports, port_in_use
from jupyter_dist.plan.layout import build_layout


@pytest.mark.parametrize(("nodes", "procs"), [(1, 1), (1, 4), (2, 2), (4, 1)])
def test_ranks_to_nodes(nodes, procs):
    lay = build_layout(nodes, procs, master_port=1)
    assert lay.world_size == nodes * procs
    assert [p.node for p in lay.places()] == [r // procs for r in range(nodes * procs)]
    assert [p.local_rank for p in lay.places()] == [r % procs for r in range(nodes * procs)]
    assert lay.grid() == [list(range(n * procs, (n + 1) * procs)) for n in range(nodes)]
    assert lay.all_local and lay.master_addr == "127.0.0.1"


def test_remote_hosts_master_is_node0():
    lay = build_layout(2, 2, ("10.9.0.1", "10.9.0.2"), master_port=5)
    assert lay.master_addr == "10.9.0.1" and not lay.all_local
    assert lay.host_of(3) == "10.9.0.2"


def test_place_out_of_range():
    with pytest.raises(IndexError):
        build_layout(1, 2, master_port=1).place(2)


def test_free_ports_are_distinct_and_free():
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert not any(port_in_use(p) for p in ports)


def test_free_ports_stay_out_of_the_ephemeral_range():
    # an outgoing connection can take a port from that range before the server it was for binds
    ports = free_ports(8)
    assert all(LISTEN_PORTS_LOW <= p < ephemeral_low() for p in ports), ports


def test_port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use(s.getsockname()[1])
