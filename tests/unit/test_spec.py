"""Flag parsing and validation: every bad flag gets one sentence naming it."""

from __future__ import annotations

import socket

import pytest
from IPython.core.error import UsageError

from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.spec import parse_args, parse_ranks, remembered, resolve


def make(line: str, defaults: RunDefaults | None = None, **kw):
    return resolve(parse_args(line), defaults or RunDefaults(), **kw)


def test_defaults_without_flags():
    spec = make("")
    assert (spec.framework, spec.nodes, spec.procs_per_node, spec.backend, spec.launcher) == ("pytorch", 1, 2, "auto", "mpi")
    assert spec.ranks is None and spec.timeout is None and spec.env == ()


def test_procs_default_follows_gpus_then_two():
    assert make("", gpus_per_node=8).procs_per_node == 8
    assert make("", gpus_per_node=0).procs_per_node == 2


def test_launcher_default_without_mpiexec_is_local():
    assert make("", mpiexec_found=False).launcher == "local"


def test_all_flags():
    spec = make(
        "-f mpi -N 2 -n 3 --backend gloo --launcher local --ranks 0,2-3 --timeout 1.5 "
        "--env A=1 --env B=x=y --ib off --nccl-debug -o res --scaling 4,1,2 --master-port 29500"
    )
    assert spec.framework == "mpi" and spec.world_size == 6
    assert spec.ranks == (0, 2, 3)
    assert spec.timeout == 1.5
    assert spec.user_env == {"A": "1", "B": "x=y"}
    assert spec.ib == "off" and spec.nccl_debug and spec.out == "res"
    assert spec.scaling == (1, 2, 4) and spec.master_port == 29500


def test_last_used_values_are_defaults():
    d = RunDefaults(framework="mpi", nodes=2, procs_per_node=3)
    spec = make("", d)
    assert (spec.framework, spec.nodes, spec.procs_per_node) == ("mpi", 2, 3)


def test_remembered_only_explicit_flags():
    spec = make("-N 2 --backend gloo")
    assert remembered(spec) == {"nodes": 2, "backend": "gloo"}


@pytest.mark.parametrize(
    ("line", "flag"),
    [
        ("-f caffe", "-f/--framework"),
        ("-N 0", "-N/--nodes"),
        ("-N two", "-N/--nodes"),
        ("-n 0", "-n/--procs-per-node"),
        ("-n -1", "-n/--procs-per-node"),
        ("--env 1X=y", "--env"),
        ("--env NOEQUALS", "--env"),
        ("--timeout abc", "--timeout"),
        ("--timeout -3", "--timeout"),
        ("--timeout nan", "--timeout"),
        ("-N 2 -n 2 --ranks 9", "--ranks"),
        ("--ranks x", "--ranks"),
        ("--ranks 3-1", "--ranks"),
        ("--backend tcp", "--backend"),
        ("--launcher pbs", "--launcher"),
        ("--ib maybe", "--ib"),
        ("--ps 1", "--ps"),
        ("-f tensorflow -n 2 --ps 2", "--ps"),
        ("-o 1abc", "-o/--out"),
        ("--scaling 0,2", "--scaling"),
        ("--scaling a", "--scaling"),
        ("--master-port 70000", "--master-port"),
        ("--hosts 'a;rm -rf /'", "--hosts"),
        ("-N 3 --hosts a,b", "-N/--nodes"),
        ("--partition gpu", "--partition"),
        ("--bogus", "unrecognized"),
    ],
)
def test_bad_input_is_one_sentence_naming_the_flag(line, flag):
    with pytest.raises(UsageError) as info:
        make(line)
    msg = str(info.value)
    assert flag in msg
    assert msg.endswith(".") and msg.count(". ") == 0, msg


def test_mpi_launcher_without_mpiexec_is_refused():
    with pytest.raises(UsageError, match="--launcher mpi"):
        make("--launcher mpi", mpiexec_found=False)


def test_hosts_set_nodes():
    spec = make("--hosts node1,node2 -n 4")
    assert spec.nodes == 2 and spec.hosts == ("node1", "node2")


def test_hostfile(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# cluster\nnode1 slots=4\nnode2\n\n")
    assert make(f"--hostfile {hf}").hosts == ("node1", "node2")
    with pytest.raises(UsageError, match="--hostfile"):
        make(f"--hostfile {tmp_path / 'missing'}")


def test_parse_ranks():
    assert parse_ranks("all") is None
    assert parse_ranks("0") == (0,)
    assert parse_ranks("0-3") == (0, 1, 2, 3)
    assert parse_ranks("3,0") == (0, 3)


def test_config_values_apply_and_flags_win():
    spec = make("-n 4", config={"framework": "mpi", "nodes": 2, "procs_per_node": 2})
    assert (spec.framework, spec.nodes, spec.procs_per_node) == ("mpi", 2, 4)


def test_script_mode_arguments():
    spec = make("train.py --local_rank $LOCAL_RANK --lr 0.1")
    assert spec.script == "train.py"
    assert spec.script_args == ("--local_rank", "$LOCAL_RANK", "--lr", "0.1")


def test_ipv6_and_hostname_are_valid_hosts():
    spec = make(f"--hosts {socket.gethostname()},::1")
    assert spec.nodes == 2
