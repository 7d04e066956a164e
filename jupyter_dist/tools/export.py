"""`%dist export`: the last `%%distrun` cell as a script, plus the file that launches it outside
the notebook (torchrun, mpirun, sbatch or an Azure ML v2 command job).

Pure: `build` turns a `RunSpec` and the cell into texts; only `write` touches the disk.

The script does not import jupyter-dist. A small generated prelude reads what the launcher gave
(torchrun, Azure ML, Open MPI, MPICH, Slurm) and sets the variables the cell saw in the notebook,
per framework family: torch.distributed's `env://` variables, Open MPI's and Azure ML's MPI
variables, or TensorFlow's `TF_CONFIG`. The script is the same for every format, so exporting
several formats side by side never leaves them out of step.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import os
import re
import shlex
import symtable
from dataclasses import dataclass

from IPython.core.error import UsageError

from jupyter_dist.plan.spec import RunSpec

FORMATS: tuple[str, ...] = ("torchrun", "mpirun", "sbatch", "azureml")
DEFAULT_SCRIPT = "distrun_export.py"
DEFAULT_MASTER_PORT = 29500  # torchrun's own default
TF_BASE_PORT = 2222  # task r listens on TF_BASE_PORT + r
SCHEMA = "https://azuremlschemas.azureedge.net/latest/commandJob.schema.json"

# Used when a framework module is not installed here; a registered module's `family` wins.
FAMILY_OF: dict[str, str] = {
    "pytorch": "torch", "lightning": "torch", "huggingface": "torch", "deepspeed": "torch",
    "torchrun": "torchrun", "mpi": "mpi", "horovod": "mpi", "tensorflow": "tensorflow",
}
# Variables the prelude derives from the launcher, or that belong to one launcher or host: never
# baked into the script as constants.
LAYOUT_KEYS = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
    "LOCAL_WORLD_SIZE", "GROUP_RANK", "OMP_NUM_THREADS", "TF_CONFIG",
})
LAYOUT_PREFIXES = ("OMPI_", "PMI_", "MPI_", "SLURM_", "AZ_", "HOROVOD_", "TORCHELASTIC_", "JUPYTER_DIST_")
AZURE_ENVIRONMENTS = {  # curated environments; replace with yours (--environment)
    "torch": "azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
    "mpi": "azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
    "tensorflow": "azureml:AzureML-tensorflow-2.12-cuda11@latest",
}
SCRIPT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\.py\Z")
AZURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]*\Z")
SLURM_VALUE = {"partition": re.compile(r"[A-Za-z0-9_.,+-]+\Z"), "account": re.compile(r"[A-Za-z0-9_.+-]+\Z"),
               "time": re.compile(r"[0-9][0-9:-]*\Z")}


@dataclass(frozen=True)
class ExportOptions:
    format: str | None  # None: the launcher that fits the run (see `default_format`)
    file: str = DEFAULT_SCRIPT
    compute: str | None = None
    environment: str | None = None


@dataclass(frozen=True)
class ExportedFile:
    path: str
    text: str
    executable: bool = False


@dataclass(frozen=True)
class Export:
    format: str
    script: ExportedFile
    launcher: ExportedFile
    run: tuple[str, ...]  # how to run it, one line each
    notes: tuple[str, ...] = ()

    def summary(self) -> str:
        lines = [f"jupyter-dist: wrote {self.script.path} and {self.launcher.path}", *self.run]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"%dist export: {message}; use %dist export [--format {'|'.join(FORMATS)}] [FILE].")


def parse_options(argv: list[str]) -> ExportOptions:
    p = _Parser(prog="%dist export", add_help=False, allow_abbrev=False)
    p.add_argument("--format")
    p.add_argument("--compute")
    p.add_argument("--environment")
    p.add_argument("file", nargs="?", default=DEFAULT_SCRIPT)
    ns = p.parse_args(argv)
    fmt = ns.format
    if fmt is not None:
        fmt = fmt.strip().lower()
        if fmt not in FORMATS:
            raise UsageError(f"%dist export: --format must be one of {', '.join(FORMATS)}, not {ns.format!r}.")
    for flag, value in (("--compute", ns.compute), ("--environment", ns.environment)):
        if value is not None and not AZURE_NAME.match(value):
            raise UsageError(f"%dist export: {flag} {value!r} is not an Azure ML name such as azureml:my-cluster.")
    return ExportOptions(fmt, ns.file, ns.compute, ns.environment)


# -- the framework family and what the framework module says -----------------------------


def family_of(framework: str) -> str:
    try:
        from jupyter_dist import frameworks
        return frameworks.get(framework).family
    except UsageError:
        return FAMILY_OF[framework]


def default_format(spec: RunSpec) -> str:
    if spec.launcher == "slurm":
        return "sbatch"
    return "torchrun" if family_of(spec.framework) in ("torch", "torchrun") else "mpirun"


def _framework_envs(spec: RunSpec) -> list[dict[str, str]] | None:
    """Every rank's framework environment for the layout, or None when the module is not here."""
    from jupyter_dist import frameworks
    from jupyter_dist.plan.layout import build_layout

    try:
        fw = frameworks.get(spec.framework)
    except UsageError:
        return None
    layout = build_layout(spec.nodes, spec.procs_per_node, spec.hosts,
                          master_port=spec.master_port or DEFAULT_MASTER_PORT,
                          task_ports=tuple(TF_BASE_PORT + r for r in range(spec.world_size)))
    backend = spec.backend if spec.backend != "auto" else "gloo"
    ctx = frameworks.RunContext(spec, layout, backend)
    return [fw.rank_env(ctx, r) for r in range(spec.world_size)]


def framework_constants(envs: list[dict[str, str]] | None) -> dict[str, str]:
    """Framework variables with one value on every rank that are not layout or launcher variables
    (DS_ACCELERATOR and the like): the script sets them as defaults."""
    if not envs:
        return {}
    first = envs[0]
    return {
        k: v for k, v in sorted(first.items())
        if k not in LAYOUT_KEYS and not k.startswith(LAYOUT_PREFIXES) and all(e.get(k) == v for e in envs)
    }


def tf_roles(spec: RunSpec, envs: list[dict[str, str]] | None) -> list[list[object]]:
    """(task type, index) per rank: the framework module's TF_CONFIG, else workers then `--ps` servers."""
    if envs and all("TF_CONFIG" in e for e in envs):
        tasks = [json.loads(e["TF_CONFIG"])["task"] for e in envs]
        return [[t["type"], int(t["index"])] for t in tasks]
    workers = spec.world_size - spec.ps
    return [["worker", r] for r in range(workers)] + [["ps", i] for i in range(spec.ps)]


# -- the cell ----------------------------------------------------------------------------

SHELL_CALLS = ("system", "getoutput")


def cell_source(code: str) -> tuple[str, bool]:
    """The cell as plain Python, and whether it needs the `!cmd` shim.

    IPython's own transform turns `!cmd` into `get_ipython().system(...)`; the script gets a tiny
    stand-in for those calls. Magics have no plain-Python form and are refused.
    """
    from IPython.core.inputtransformer2 import TransformerManager

    transformed = TransformerManager().transform_cell(code)
    tree = ast.parse(transformed)
    shell_used = False
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython"):
            continue
        parent = _parent_call(tree, node)
        what = parent.func.attr if parent is not None else None  # type: ignore[union-attr]
        if what in SHELL_CALLS and parent is not None:
            arg = parent.args[0] if parent.args else None
            cmd = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None
            if cmd is None or "$" in cmd or "{" in cmd:
                raise UsageError(
                    f"%dist export: the shell escape on line {node.lineno} of the cell expands Python values "
                    "($name or {expr}), which a script cannot do: write it with subprocess, then re-run the cell."
                )
            shell_used = True
            continue
        name = _magic_name(parent)
        raise UsageError(
            f"%dist export: the cell uses {name} on line {node.lineno}, which has no plain-Python form "
            "in a script: remove it or write it in Python, then re-run the cell."
        )
    return (transformed if shell_used else code), shell_used


def _parent_call(tree: ast.AST, inner: ast.Call) -> ast.Call | None:
    """The call `get_ipython().X(...)` around `inner`, if that is what it is."""
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.value is inner):
            return node
    return None


def _magic_name(call: ast.Call | None) -> str:
    if call is None or not isinstance(call.func, ast.Attribute):
        return "get_ipython()"
    kind = {"run_line_magic": "%", "run_cell_magic": "%%"}.get(call.func.attr)
    arg = call.args[0] if call.args else None
    if kind and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return "IPython help (?)" if arg.value in ("pinfo", "pinfo2") else f"the IPython magic {kind}{arg.value}"
    return f"get_ipython().{call.func.attr}"


def free_names(source: str) -> list[str]:
    """Names the cell reads but never defines: on warm engines an earlier cell defined them."""
    try:
        top = symtable.symtable(source, "<cell>", "exec")
    except SyntaxError:
        return []
    defined: set[str] = set()
    used: set[str] = set()

    def walk(table: symtable.SymbolTable) -> None:
        for s in table.get_symbols():
            name = s.get_name()
            at_top = table is top or s.is_declared_global()
            if at_top and (s.is_assigned() or s.is_imported() or s.is_namespace()):
                defined.add(name)
            if s.is_referenced() and (table is top or s.is_global()):
                used.add(name)
        for child in table.get_children():
            walk(child)

    walk(top)
    known = set(dir(builtins)) | {"__file__", "__name__", "get_ipython"}
    return sorted(used - defined - known)


# -- the script ----------------------------------------------------------------------------

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


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def describe(spec: RunSpec) -> str:
    return (f"-f {spec.framework}, {_plural(spec.nodes, 'node')} x {_plural(spec.procs_per_node, 'process')} "
            f"per node (world size {spec.world_size})")


def script_text(spec: RunSpec, code: str | None, script_dir: str = ".") -> tuple[str, list[str]]:
    """The exported script and notes about it."""
    family = family_of(spec.framework)
    notes: list[str] = []
    envs = _framework_envs(spec)
    from jupyter_dist.plan.layout import build_layout

    layout = build_layout(spec.nodes, spec.procs_per_node, spec.hosts, master_port=spec.master_port or DEFAULT_MASTER_PORT)
    constants = framework_constants(envs)
    if constants:
        shown = ", ".join(f"{k}={v}" for k, v in constants.items())
        notes.append(f"the script sets {shown} by default, as -f {spec.framework} did on this host; "
                     "change it in the script where the cluster differs (GPUs, say).")
    baked: dict[str, object] = {
        "nodes": spec.nodes,
        "procs_per_node": spec.procs_per_node,
        "hosts": list(layout.hosts),
        "master_addr": layout.master_addr,
        "master_port": layout.master_port,
        "env": {**constants, **spec.user_env},
    }
    if family == "tensorflow":
        baked["tf_roles"] = tf_roles(spec, envs)
        baked["tf_port"] = TF_BASE_PORT

    if code is not None:
        source, shell_used = cell_source(code)
        missing = free_names(source)
        if missing:
            notes.append(
                f"the cell uses {', '.join(missing)}, which it does not define (earlier cells did, on the warm "
                "ranks): add their definitions to the script, or it stops with a NameError."
            )
        what = "the %%distrun cell"
    else:
        assert spec.script is not None
        baked["script"] = _relative_script(spec.script, script_dir)
        if os.path.isabs(str(baked["script"])):
            notes.append(f"the script {spec.script} is outside {os.path.abspath(script_dir)}: copy it beside "
                         "the export for launchers that upload a folder (Azure ML's code: .).")
        shell_used = False
        source = SCRIPT_MODE
        what = f"%distrun {os.path.basename(spec.script)} (script mode)"

    parts = [
        "#!/usr/bin/env python3\n",
        f'"""Exported by jupyter-dist (%dist export) from {what}: {describe(spec)}.\n\n'
        "Run it with the launcher file written beside it, or under torchrun, mpirun, srun or an Azure ML job:\n"
        "the prelude turns what the launcher gives into the environment the cell saw in the notebook.\n"
        "Network settings (NCCL_SOCKET_IFNAME, NCCL_IB_*, UCX_*) are the cluster's: set them in its environment.\n"
        '"""\n',
        PRELUDE_COMMON,
        f"\n_JD = {baked!r}\n",
        PRELUDE_MPI_INIT if family == "mpi" else PRELUDE_PLACE,
        PRELUDE_DEFAULTS,
        {"torch": PRELUDE_TORCH, "torchrun": PRELUDE_TORCH, "mpi": PRELUDE_MPI, "tensorflow": PRELUDE_TF}[family],
        SHELL_SHIM if shell_used else "",
        "\n# ---- end of the prelude ----\n\n",
        source.rstrip("\n") + "\n",
    ]
    if spec.out:
        parts.append(SAVE_OUT.format(name=spec.out, lookup="globals()" if code is not None else "_jd_globals"))
    if family in ("torch", "torchrun"):
        parts.append(TORCH_END)
    text = "".join(parts)
    compile(text, "<exported script>", "exec")  # a bug here must not become a file
    return text, notes


def _relative_script(script: str, script_dir: str) -> str:
    path = os.path.abspath(script)
    base = os.path.abspath(script_dir)
    rel = os.path.relpath(path, base)
    return path if rel.startswith(os.pardir) else rel


# -- the launchers ------------------------------------------------------------------------


def _check_family(fmt: str, spec: RunSpec, family: str) -> None:
    if fmt == "torchrun" and family == "mpi":
        raise UsageError(f"%dist export: -f {spec.framework} needs an MPI launcher, and torchrun is none: "
                         "use --format mpirun, sbatch or azureml.")
    if fmt == "torchrun" and family == "tensorflow":
        raise UsageError("%dist export: -f tensorflow reads TF_CONFIG, which torchrun does not give: "
                         "use --format mpirun, sbatch or azureml.")


def _args(spec: RunSpec) -> str:
    """The script's arguments as shell words (kept literal: the script expands $RANK itself)."""
    words = [shlex.quote(a) for a in spec.script_args] + ['"$@"']
    return " ".join(words)


def _default(var: str, value: object, export: bool = False) -> str:
    """`VAR="${VAR:-value}"`, the value shell-quoted (through a helper variable when it needs quotes)."""
    text = str(value)
    word = "export " if export else ""
    if shlex.quote(text) == text:
        return f'{word}{var}="${{{var}:-{text}}}"'
    return f'JD_{var}={shlex.quote(text)}\n{word}{var}="${{{var}:-$JD_{var}}}"'


def _exports(spec: RunSpec, master_addr: str, master_port: int) -> str:
    p = spec.procs_per_node
    return "\n".join([
        _default("MASTER_ADDR", master_addr, export=True),
        _default("MASTER_PORT", master_port, export=True),
        f"export JUPYTER_DIST_PROCS_PER_NODE={p}  # the notebook's layout: local rank = rank % {p}, node = rank // {p}",
    ])


def torchrun_text(spec: RunSpec, script: str, master_addr: str, master_port: int) -> tuple[str, str]:
    n, p = spec.nodes, spec.procs_per_node
    name = shlex.quote(script)
    body = f"""#!/usr/bin/env bash
# jupyter-dist export (torchrun): {describe(spec)}.
# Start it on every node at about the same time, each with its node rank (0..{n - 1}) and node 0's address:
#   NODE_RANK=0 MASTER_ADDR=<address of node 0> bash {shlex.quote(_launcher_name(script, 'torchrun'))}
# torchrun starts {p} new worker processes per node, each with RANK, LOCAL_RANK, WORLD_SIZE, ...;
# nothing from the notebook's warm ranks carries over. PYTHON picks the interpreter.
# Arguments after the file name go to the script.
set -euo pipefail
cd "$(dirname "$0")"
NODE_RANK="${{NODE_RANK:-0}}"
{_default("MASTER_ADDR", master_addr)}
{_default("MASTER_PORT", master_port)}
# python -m torch.distributed.run is torchrun
exec "${{PYTHON:-python}}" -m torch.distributed.run --nnodes {n} --nproc_per_node {p} \\
  --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\
  {name} {_args(spec)}
"""
    shown = " ".join([f"torchrun --nnodes {n} --nproc_per_node {p} --node_rank $NODE_RANK",
                      f"--master_addr {master_addr} --master_port {master_port} {name}",
                      *[shlex.quote(a) for a in spec.script_args]])
    return body, shown


def mpirun_text(spec: RunSpec, script: str, family: str, master_addr: str, master_port: int,
                hosts: tuple[str, ...], all_local: bool) -> tuple[str, str]:
    p, w = spec.procs_per_node, spec.world_size
    name = shlex.quote(script)
    host_arg = "" if all_local else " --host " + shlex.quote(",".join(f"{h}:{p}" for h in hosts))
    xs = ["MASTER_ADDR", "MASTER_PORT", "JUPYTER_DIST_PROCS_PER_NODE"]
    extra = ""
    if family == "tensorflow":
        xs.append("JUPYTER_DIST_HOSTS")
        extra = "# TF_CONFIG: one host per node\n" + _default("JUPYTER_DIST_HOSTS", ",".join(hosts), export=True) + "\n"
    xflags = " ".join(f"-x {x}" for x in xs)
    if all_local and spec.nodes > 1:
        extra = (f"# The notebook's {spec.nodes} nodes were this host; on a cluster add --host node0:{p},node1:{p},... "
                 "(or --hostfile) and set MASTER_ADDR to node 0.\n") + extra
    body = f"""#!/usr/bin/env bash
# jupyter-dist export (mpirun): {describe(spec)}.
# Run it once, on node 0: bash {shlex.quote(_launcher_name(script, 'mpirun'))}
# As root, Open MPI needs: export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# More ranks than cores needs: export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe (or --oversubscribe)
# MPIRUN and PYTHON pick the launcher and the interpreter. Arguments after the file name go to the script.
set -euo pipefail
cd "$(dirname "$0")"
{_exports(spec, master_addr, master_port)}
{extra}exec "${{MPIRUN:-mpirun}}" -np {w}{host_arg} {xflags} \\
  "${{PYTHON:-python}}" {name} {_args(spec)}
"""
    shown = f"mpirun -np {w}{host_arg} {xflags} python {name}"
    if spec.script_args:
        shown += " " + " ".join(shlex.quote(a) for a in spec.script_args)
    return body, shown


def sbatch_text(spec: RunSpec, script: str, family: str, master_port: int) -> str:
    n, p, w = spec.nodes, spec.procs_per_node, spec.world_size
    name = shlex.quote(script)
    stem = script[:-3]
    header = [f"#SBATCH --job-name={stem}", f"#SBATCH --nodes={n}", f"#SBATCH --ntasks-per-node={p}"]
    for key, value in spec.slurm:
        pattern = SLURM_VALUE.get(key)
        if pattern is None or not pattern.match(value):
            raise UsageError(f"%dist export: --{key} {value!r} is not a valid Slurm {key}.")
        header.append(f"#SBATCH --{key}={value}")
    header.append(f"#SBATCH --output={stem}-%j.out")
    if family == "torchrun":
        launch = (f'srun --nodes={n} --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n'
                  f'  "${{PYTHON:-python}}" -m torch.distributed.run --nnodes {n} --nproc_per_node {p} \\\n'
                  f'  --rdzv_id "$SLURM_JOB_ID" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \\\n'
                  f'  {name} {_args(spec)}')
        how = "one torchrun per node (srun), which starts the node's workers"
    elif family == "mpi":
        launch = (f'"${{MPIRUN:-mpirun}}" -np {w} -x MASTER_ADDR -x MASTER_PORT -x JUPYTER_DIST_PROCS_PER_NODE \\\n'
                  f'  "${{PYTHON:-python}}" {name} {_args(spec)}')
        how = "Open MPI's mpirun, which reads the Slurm allocation (or: srun --mpi=pmix with a Slurm-aware MPI)"
    else:
        launch = (f'srun --nodes={n} --ntasks-per-node={p} --kill-on-bad-exit=1 \\\n'
                  f'  "${{PYTHON:-python}}" {name} {_args(spec)}')
        how = "srun, one task per rank; the script maps SLURM_PROCID and friends to the rank's variables"
    return f"""#!/bin/bash
{chr(10).join(header)}
# jupyter-dist export (sbatch): {describe(spec)}.
# Submit it from the folder that holds {name}: sbatch {shlex.quote(_launcher_name(script, 'sbatch'))}
# Launch: {how}.
set -euo pipefail
cd "${{SLURM_SUBMIT_DIR:-.}}"
mapfile -t JD_NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
export MASTER_ADDR="${{JD_NODES[0]}}"
{_default("MASTER_PORT", master_port, export=True)}
JUPYTER_DIST_HOSTS="$(IFS=,; echo "${{JD_NODES[*]}}")"
export JUPYTER_DIST_HOSTS
export JUPYTER_DIST_PROCS_PER_NODE={p}
{launch}
"""


def azureml_data(spec: RunSpec, script: str, family: str, compute: str | None, environment: str | None) -> dict[str, object]:
    """The Azure ML v2 command job as a mapping (emitted as YAML by `to_yaml`)."""
    command = " ".join(["python", shlex.quote(script), *(shlex.quote(a) for a in spec.script_args)])
    if family == "tensorflow":
        distribution: dict[str, object] = {"type": "tensorflow", "worker_count": spec.world_size - spec.ps,
                                           "parameter_server_count": spec.ps}
    else:
        distribution = {"type": "mpi" if family == "mpi" else "pytorch",
                        "process_count_per_instance": spec.procs_per_node}
    default_compute = "azureml:gpu-cluster" if spec.backend == "nccl" else "azureml:cpu-cluster"
    return {
        "$schema": SCHEMA,
        "type": "command",
        "display_name": script[:-3],
        "experiment_name": "jupyter-dist",
        "code": ".",
        "command": command,
        "environment": _azure_ref(environment) or AZURE_ENVIRONMENTS[family if family != "torchrun" else "torch"],
        "compute": _azure_ref(compute) or default_compute,
        "resources": {"instance_count": spec.nodes},
        "distribution": distribution,
    }


def _azure_ref(value: str | None) -> str | None:
    if value is None:
        return None
    return value if value.startswith("azureml:") or value == "local" else f"azureml:{value}"


PLAIN = re.compile(r"[A-Za-z$.][A-Za-z0-9_./:@+ $-]*\Z")
YAML_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"})


def _yaml_scalar(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    text = str(value)
    plain = (PLAIN.match(text) and ": " not in text and " #" not in text and text.lower() not in YAML_WORDS
             and not _numeric(text))
    return text if plain and not text.endswith(" ") else json.dumps(text)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.lower() in (".inf", ".nan", "-.inf")
    return True


def to_yaml(data: dict[str, object], indent: int = 0) -> str:
    """Block-style YAML for nested mappings of strings and numbers (no PyYAML needed)."""
    pad = " " * indent
    out = []
    for key, value in data.items():
        if isinstance(value, dict):
            out.append(f"{pad}{key}:\n{to_yaml(value, indent + 2)}")
        else:
            out.append(f"{pad}{key}: {_yaml_scalar(value)}\n")
    return "".join(out)


def azureml_text(spec: RunSpec, script: str, family: str, compute: str | None, environment: str | None) -> str:
    data = azureml_data(spec, script, family, compute, environment)
    placeholders = [flag for flag, given in (("--compute", compute), ("--environment", environment)) if given is None]
    lines = [
        f"# jupyter-dist export (Azure ML v2 command job): {describe(spec)}.",
        f"# Submit: az ml job create --file {_launcher_name(script, 'azureml')} --resource-group <group> --workspace-name <workspace>",
    ]
    if placeholders:
        fields = " and ".join(flag[2:] for flag in placeholders)
        lines.append(f"# {' and '.join(placeholders)} not given to %dist export: the {fields} below "
                     f"{'are examples' if len(placeholders) > 1 else 'is an example'}; name yours.")
    if family == "tensorflow":
        lines.append("# Azure ML sets TF_CONFIG for each task; the script uses it as it is.")
    else:
        lines.append(f"# Azure ML starts {_plural(spec.procs_per_node, 'process')} on each of "
                     f"{_plural(spec.nodes, 'instance')} and sets their rank variables.")
    return "\n".join(lines) + "\n" + to_yaml(data)


# -- putting it together ------------------------------------------------------------------


def _launcher_name(script: str, fmt: str) -> str:
    stem = script[:-3]
    return f"{stem}.{fmt}.yml" if fmt == "azureml" else f"{stem}.{fmt}.sh"


def check_file(path: str) -> tuple[str, str]:
    """(directory, file name) of FILE; the name goes into shell lines and job files, so it is plain."""
    if "\n" in path or "\r" in path:
        raise UsageError("%dist export: FILE must not contain a line break.")
    directory, name = os.path.split(path)
    if not SCRIPT_NAME.match(name):
        raise UsageError(f"%dist export: FILE {path!r} must end in a .py file name of letters, digits and ._+- "
                         "(it is written into shell lines and job files).")
    if directory and not os.path.isdir(directory):
        raise UsageError(f"%dist export: the folder {directory!r} for FILE does not exist.")
    return directory, name


def build(spec: RunSpec, code: str | None, options: ExportOptions) -> Export:
    """The script and the launcher file for `options.format`, without writing anything."""
    fmt = options.format or default_format(spec)
    family = family_of(spec.framework)
    _check_family(fmt, spec, family)
    directory, name = check_file(options.file)
    text, notes = script_text(spec, code, directory or ".")
    from jupyter_dist.plan.layout import build_layout

    port = spec.master_port or DEFAULT_MASTER_PORT
    layout = build_layout(spec.nodes, spec.procs_per_node, spec.hosts, master_port=port)
    launcher_path = os.path.join(directory, _launcher_name(name, fmt))
    shown_launcher = shlex.quote(launcher_path)
    cd = f"cd {shlex.quote(directory)} && " if directory else ""
    if fmt == "torchrun":
        body, shown = torchrun_text(spec, name, layout.master_addr, port)
        run = (f"run on every node n = 0..{spec.nodes - 1}: NODE_RANK=n MASTER_ADDR=<address of node 0> bash {shown_launcher}",
               f"which runs: {shown}")
    elif fmt == "mpirun":
        body, shown = mpirun_text(spec, name, family, layout.master_addr, port, layout.hosts, layout.all_local)
        run = (f"run on node 0: bash {shown_launcher}", f"which runs: {shown}")
    elif fmt == "sbatch":
        body = sbatch_text(spec, name, family, port)
        run = (f"submit: {cd}sbatch {shlex.quote(_launcher_name(name, fmt))}",)
    else:
        body = azureml_text(spec, name, family, options.compute, options.environment)
        run = (f"submit: az ml job create --file {shown_launcher} --resource-group <group> --workspace-name <workspace>",)
    if spec.out:
        run += (f"each rank saves -o {spec.out} to {spec.out}.rank<RANK>.pkl in the script's folder "
                "(JUPYTER_DIST_OUT_DIR to change it)",)
    return Export(
        format=fmt,
        script=ExportedFile(os.path.join(directory, name), text),
        launcher=ExportedFile(launcher_path, body, executable=fmt != "azureml"),
        run=run,
        notes=tuple(notes),
    )


def write(exp: Export) -> list[str]:
    """Write both files (launchers executable); returns their paths."""
    paths = []
    for f in (exp.script, exp.launcher):
        with open(f.path, "w") as fh:
            fh.write(f.text)
        if f.executable:
            os.chmod(f.path, 0o755)
        paths.append(f.path)
    return paths
