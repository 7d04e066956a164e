"""Horovod in Gloo mode: each rank gets what `horovodrun --gloo` would give it.

The run's layout decides ranks, local ranks and nodes (under `mpirun` Horovod would take nodes
from host names, so virtual nodes on one host would look like one). Rank 0's engine serves
Horovod's own HTTP rendezvous, started by an engine hook (`jupyter_dist.engine.frameworks.horovod`),
at `Layout.task_ports[0]`.
Open MPI's per-rank variables (for the run's layout) are set too, for code written for MPI jobs.

Horovod has no wheels: `python -m jupyter_dist.frameworks.horovod` (or `make horovod`) builds its last
release against the torch installed here (see `install`); `--if-missing` builds only where `horovod.torch`
does not import (what `make test` runs before the tests, so `make demo` never compiles it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

from jupyter_dist.engine.frameworks.horovod import NODES_VAR, serve_rendezvous
from jupyter_dist.frameworks.base import Framework, RunContext, mpi_rank_env, omp_threads

RELEASE = "horovod==0.28.1"
INSTALL = (f"python -m jupyter_dist.frameworks.horovod builds {RELEASE} against the torch installed here, in "
           "several minutes (as make horovod does; a plain pip install of it fails on torch 2.x, whose headers need C++17)")


def node_names(ctx: RunContext) -> list[str]:
    """Horovod's host name of each node: the host, made distinct where nodes share one."""
    hosts = list(ctx.layout.hosts)
    if len(set(hosts)) == len(hosts):
        return hosts
    return [f"{h}-node{n}" for n, h in enumerate(hosts)]


def rendezvous_port(ctx: RunContext) -> int:
    lay = ctx.layout
    return lay.task_ports[0] if lay.task_ports else lay.master_port + 1


def horovod_env(ctx: RunContext, rank: int) -> dict[str, str]:
    lay = ctx.layout
    node = lay.node_of(rank)
    env = {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(lay.world_size),
        "HOROVOD_LOCAL_RANK": str(lay.local_rank_of(rank)),
        "HOROVOD_LOCAL_SIZE": str(lay.procs_per_node),
        "HOROVOD_CROSS_RANK": str(node),
        "HOROVOD_CROSS_SIZE": str(lay.nodes),
        "HOROVOD_HOSTNAME": node_names(ctx)[node],
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": lay.master_addr,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(rendezvous_port(ctx)),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
    }
    if lay.all_local:
        env["HOROVOD_GLOO_IFACE"] = "lo"
    if rank == 0:
        env[NODES_VAR] = ",".join(node_names(ctx))
    return env


class Horovod(Framework):
    name = "horovod"
    family = "mpi"
    title = "Horovod (Gloo)"
    order = 40  # place in the choices (flags, panel, sidebar)
    module = "horovod"
    extra = None
    engine_hooks = (serve_rendezvous,)

    def rank_env(self, ctx: RunContext, rank: int) -> dict[str, str]:
        return {**mpi_rank_env(ctx, rank), **horovod_env(ctx, rank), **omp_threads(ctx)}

    def install_hint(self) -> str:
        return INSTALL


# -- building Horovod -------------------------------------------------------------------------
# Horovod 0.28.1's CMakeLists sets CMAKE_CXX_STANDARD 14 and strips any -std= from CXXFLAGS, so
# CXXFLAGS cannot help; torch 2.x headers need C++17. CMake's own C++14 switch is redirected to
# C++17 by a file CMake includes after `project()` (CMAKE_PROJECT_INCLUDE), passed through
# Horovod's HOROVOD_CMAKE hook. Horovod's sources are not touched.
CXX17 = 'set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")\nset(CMAKE_CXX14_EXTENSION_COMPILE_OPTION "-std=gnu++17")\n'


def build_env(workdir: str, cmake: str, jobs: int) -> dict[str, str]:
    """The environment for `pip install horovod`: PyTorch and Gloo, nothing else, `jobs` compilers at once;
    the user's values win (a MAKEFLAGS only where it says -j)."""
    include = os.path.join(workdir, "cxx17.cmake")
    wrapper = os.path.join(workdir, "cmake")
    with open(include, "w") as f:
        f.write(CXX17)
    with open(wrapper, "w") as f:  # configure steps get the include; build and tool modes pass through
        f.write(f'#!/bin/sh\ncase "$1" in --build|--version|-E) exec {cmake} "$@" ;; '
                f'*) exec {cmake} -DCMAKE_PROJECT_INCLUDE={include} "$@" ;; esac\n')
    os.chmod(wrapper, 0o755)
    env = {"HOROVOD_CMAKE": wrapper, "HOROVOD_WITH_PYTORCH": "1", "HOROVOD_WITH_GLOO": "1",
           "HOROVOD_WITHOUT_TENSORFLOW": "1", "HOROVOD_WITHOUT_MXNET": "1", "HOROVOD_WITHOUT_MPI": "1"}
    env.update((k, v) for k, v in os.environ.items() if v)
    if "-j" not in env.get("MAKEFLAGS", ""):  # Horovod's own default is -j8, whatever the cores
        env["MAKEFLAGS"] = f"-j{jobs}"
    return env


def built() -> bool:
    """Whether Horovod's torch extension imports here (built against this torch), in a child process:
    importing it here would load torch into this one."""
    probe = [sys.executable, "-c", "import horovod.torch"]
    return subprocess.call(probe, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0


def install(pip_args: list[str]) -> int:
    """Build and install Horovod for this Python's torch (several minutes: it compiles)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", "cmake>=3.13"])
        cmake = shutil.which("cmake", path=os.path.dirname(sys.executable)) or "cmake"
    print(f"jupyter-dist: building {RELEASE} against this torch; it compiles for several minutes", flush=True)
    with tempfile.TemporaryDirectory(prefix="jupyter-dist-horovod-") as workdir:
        env = build_env(workdir, cmake, os.cpu_count() or 1)
        cmd = [sys.executable, "-m", "pip", "install", "--no-build-isolation", RELEASE, *pip_args]
        return subprocess.call(cmd, env=env)


def main(argv: list[str]) -> int:
    """`[--if-missing] [pip args...]`: with `--if-missing`, nothing to do where Horovod already imports."""
    if "--if-missing" in argv:
        argv = [a for a in argv if a != "--if-missing"]
        if built():
            print("jupyter-dist: Horovod is built for this torch (`import horovod.torch` works); not building it", flush=True)
            return 0
    t0 = time.monotonic()
    rc = install(argv)
    print(f"jupyter-dist: {RELEASE} {'installed' if rc == 0 else 'failed to build'} in {time.monotonic() - t0:.0f} s", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
