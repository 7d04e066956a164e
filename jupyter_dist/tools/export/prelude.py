"""The generated prelude of an exported script, as text: it turns what the launcher gave
(torchrun, Azure ML, Open MPI, MPICH, Slurm) into the variables the cell saw in the notebook.

The pieces run in the order `script.script_text` joins them; each names its own purpose. They
read `_JD`, the constants baked into the script (layout, --env, TensorFlow roles).
"""

from __future__ import annotations

PRELUDE_COMMON = '''\
# ---- jupyter-dist prelude (generated): the environment the cell saw, from this launcher ----
import os as _os
import sys as _sys


def _jd_place(known=None):
    """(rank, world, local rank, processes per node) from torchrun, Azure ML, MPI or Slurm."""
    e = _os.environ
    if known is not None:  # MPI itself, already initialised
        found = (known[0], known[1], e.get("OMPI_COMM_WORLD_LOCAL_RANK") or e.get("MPI_LOCALRANKID"),
                 e.get("OMPI_COMM_WORLD_LOCAL_SIZE") or e.get("MPI_LOCALNRANKS"))
    elif "RANK" in e and "WORLD_SIZE" in e:  # torchrun, Azure ML PyTorch jobs
        found = e["RANK"], e["WORLD_SIZE"], e.get("LOCAL_RANK"), e.get("LOCAL_WORLD_SIZE")
    elif "OMPI_COMM_WORLD_RANK" in e:  # Open MPI's mpirun, Azure ML MPI jobs
        found = (e["OMPI_COMM_WORLD_RANK"], e["OMPI_COMM_WORLD_SIZE"],
                 e.get("OMPI_COMM_WORLD_LOCAL_RANK"), e.get("OMPI_COMM_WORLD_LOCAL_SIZE"))
    elif "PMI_RANK" in e:  # MPICH, Intel MPI
        found = e["PMI_RANK"], e["PMI_SIZE"], e.get("MPI_LOCALRANKID"), e.get("MPI_LOCALNRANKS")
    elif "SLURM_PROCID" in e:  # srun
        nodes = int(e.get("SLURM_STEP_NUM_NODES") or e.get("SLURM_NNODES") or 1)
        found = e["SLURM_PROCID"], e["SLURM_NTASKS"], e.get("SLURM_LOCALID"), str(int(e["SLURM_NTASKS"]) // nodes)
    else:
        print("jupyter-dist: no launcher found (torchrun, mpirun, srun, Azure ML): running as one process",
              file=_sys.stderr, flush=True)
        found = 0, 1, 0, 1
    rank, world = int(found[0]), int(found[1])
    fixed = e.get("JUPYTER_DIST_PROCS_PER_NODE")  # the notebook's layout, set by the generated launchers
    if fixed:
        return rank, world, rank % int(fixed), int(fixed)
    per_node = int(found[3] or world)
    return rank, world, (rank % per_node if found[2] is None else int(found[2])), per_node


def _jd_master():
    """node 0's address and port: the launcher's, else Azure ML's MPI variables, else the export's."""
    e = _os.environ
    az = e.get("AZ_BATCH_MASTER_NODE", "")
    addr = e.get("MASTER_ADDR") or az.partition(":")[0] or e.get("AZ_BATCHAI_MPI_MASTER_NODE") or _JD["master_addr"]
    return addr, e.get("MASTER_PORT") or az.partition(":")[2] or str(_JD["master_port"])


def _jd_ifname(addr):
    """The interface of the most specific IPv4 route to `addr` (/proc/net/route), else None: Gloo
    and NCCL otherwise bind to what the host name resolves to, loopback where it does not resolve."""
    import socket
    import struct
    try:
        target = struct.unpack("<I", socket.inet_aton(socket.gethostbyname(addr)))[0]
        if target & 0xFF == 127:
            return None
        best = None
        with open("/proc/net/route") as f:
            for line in f.read().splitlines()[1:]:
                w = line.split()
                dest, mask = int(w[1], 16), int(w[7], 16)
                if target & mask == dest and (best is None or mask > best[0]):
                    best = (mask, w[0])
        return best[1] if best else None
    except (OSError, ValueError, IndexError):
        return None

'''

PRELUDE_MPI_INIT = '''\
try:  # MPI first, as on the notebook's engines; its rank is the rank
    from mpi4py import MPI as _jd_MPI
    _jd_known = _jd_MPI.COMM_WORLD.Get_rank(), _jd_MPI.COMM_WORLD.Get_size()
except ImportError:
    _jd_known = None
_jd_rank, _jd_world, _jd_local, _jd_per_node = _jd_place(_jd_known)
'''

PRELUDE_PLACE = "_jd_rank, _jd_world, _jd_local, _jd_per_node = _jd_place()\n"

PRELUDE_DEFAULTS = '''\
_jd_node = _jd_rank // _jd_per_node
_jd_addr, _jd_port = _jd_master()
for _jd_k, _jd_v in _JD["env"].items():  # the run's --env and the framework's constants
    _os.environ.setdefault(_jd_k, _jd_v)
_os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (_os.cpu_count() or 1) // _jd_per_node)))
_jd_if = _jd_ifname(_jd_addr)
if _jd_if:  # the interface toward node 0, as the notebook's ranks got it
    _os.environ.setdefault("GLOO_SOCKET_IFNAME", _jd_if)
    _os.environ.setdefault("NCCL_SOCKET_IFNAME", _jd_if)
'''

PRELUDE_TORCH = '''\
_os.environ.update({  # torch.distributed's env:// variables, as torchrun sets them
    "RANK": str(_jd_rank), "WORLD_SIZE": str(_jd_world), "LOCAL_RANK": str(_jd_local),
    "LOCAL_WORLD_SIZE": str(_jd_per_node), "NODE_RANK": str(_jd_node), "GROUP_RANK": str(_jd_node),
    "MASTER_ADDR": _jd_addr, "MASTER_PORT": _jd_port,
})
'''

PRELUDE_MPI = '''\
_os.environ.update({  # Open MPI's variables for the notebook's layout (its local rank wins)
    "OMPI_COMM_WORLD_RANK": str(_jd_rank), "OMPI_COMM_WORLD_SIZE": str(_jd_world),
    "OMPI_COMM_WORLD_LOCAL_RANK": str(_jd_local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(_jd_per_node),
    "NODE_RANK": str(_jd_node),
})
_os.environ.setdefault("AZ_BATCHAI_MPI_MASTER_NODE", _jd_addr)  # as Azure ML sets them
if _jd_world > _jd_per_node:
    _os.environ.setdefault("AZ_BATCH_MASTER_NODE", f"{_jd_addr}:{_jd_port}")
'''

PRELUDE_TF = '''\
import json as _jd_json

if "TF_CONFIG" not in _os.environ:  # Azure ML sets it; otherwise one task per rank
    _jd_hosts = (_os.environ.get("JUPYTER_DIST_HOSTS") or ",".join(_JD["hosts"])).split(",")
    _jd_roles = _JD["tf_roles"] if len(_JD["tf_roles"]) == _jd_world else [["worker", r] for r in range(_jd_world)]
    _jd_base = int(_os.environ.get("JUPYTER_DIST_TF_PORT") or _JD["tf_port"])
    _jd_tasks = {}
    for _jd_r, (_jd_type, _jd_index) in enumerate(_jd_roles):
        _jd_host = _jd_hosts[min(_jd_r // _jd_per_node, len(_jd_hosts) - 1)]
        _jd_tasks.setdefault(_jd_type, []).append((_jd_index, f"{_jd_host}:{_jd_base + _jd_r}"))
    _os.environ["TF_CONFIG"] = _jd_json.dumps({
        "cluster": {t: [a for _, a in sorted(v)] for t, v in _jd_tasks.items()},
        "task": {"type": _jd_roles[_jd_rank][0], "index": _jd_roles[_jd_rank][1]},
        "environment": "cloud",
    })
_jd_task = _jd_json.loads(_os.environ["TF_CONFIG"])["task"]
if _jd_task["type"] == "ps":  # parameter servers only serve, as in the notebook
    import tensorflow as _jd_tf

    _jd_resolver = _jd_tf.distribute.cluster_resolver.TFConfigClusterResolver()
    _jd_tf.distribute.Server(_jd_resolver.cluster_spec(), job_name="ps", task_index=_jd_task["index"],
                             protocol=_jd_resolver.rpc_layer or "grpc", start=True).join()
    _sys.exit(0)
'''

SHELL_SHIM = '''\


class _JdShell:
    """`!cmd` and `x = !cmd` from the cell (IPython writes them as get_ipython() calls)."""

    @staticmethod
    def system(cmd):
        import subprocess

        subprocess.call(cmd, shell=True)

    @staticmethod
    def getoutput(cmd, split=True):
        import subprocess

        out = subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout
        return out.splitlines() if split else out


def get_ipython():
    return _JdShell
'''

SCRIPT_MODE = '''\
import re as _jd_re
import runpy as _jd_runpy


def _jd_expand(arg):
    """$RANK, ${LOCAL_RANK}, ... in the arguments, per rank, as %distrun expands them."""
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        value = _os.environ.get(name)
        if value is not None:
            arg = arg.replace("${" + name + "}", value)
            arg = _jd_re.sub(r"\\$" + name + r"(?![A-Za-z0-9_])", value, arg)
    return arg


_jd_script = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), _JD["script"])
_sys.argv = [_jd_script, *(_jd_expand(a) for a in _sys.argv[1:])]
_sys.path.insert(0, _os.path.dirname(_jd_script))
_jd_globals = _jd_runpy.run_path(_jd_script, run_name="__main__")
'''

SAVE_OUT = '''\

# ---- -o {name}: this rank's value, pickled to {name}.rank<RANK>.pkl (None where undefined) ----
import pickle as _jd_pickle

_jd_out = _os.path.join(_os.environ.get("JUPYTER_DIST_OUT_DIR", "."), f"{name}.rank{{_jd_rank}}.pkl")
with open(_jd_out, "wb") as _jd_f:
    _jd_pickle.dump({lookup}.get({name!r}), _jd_f)
print(f"jupyter-dist: rank {{_jd_rank}} saved {name} to {{_jd_out}}", flush=True)
'''

TORCH_END = '''\

_jd_dist = _sys.modules.get("torch.distributed")
if _jd_dist is not None and _jd_dist.is_available() and _jd_dist.is_initialized():
    # every rank is done before any leaves: a rank that exits first closes the store and
    # connections its peers may still be reading, and their launcher reports a failed run
    _jd_dist.barrier()
    _jd_dist.destroy_process_group()
'''

# The rank variables each framework family expects.
FAMILY_PRELUDE: dict[str, str] = {
    "torch": PRELUDE_TORCH, "torchrun": PRELUDE_TORCH, "mpi": PRELUDE_MPI, "tensorflow": PRELUDE_TF,
}
