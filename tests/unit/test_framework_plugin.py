"""A framework added through the entry point is offered everywhere the built-in ones are: by `-f`,
the plan, the panel and the sidebar's `welcome`, with no edit to jupyter-dist (docs/architecture.md)."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from nodes import HERE

from jupyter_dist import frameworks
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.plan import plan
from jupyter_dist.plan.spec import parse_args, resolve


def test_registered_framework_is_in_the_registry_after_the_built_ins(rpc_framework):
    names = list(frameworks.registry())
    assert names[:8] == ["pytorch", "torchrun", "mpi", "horovod", "deepspeed", "lightning", "huggingface",
                         "tensorflow"]
    assert names[8:] == ["rpc"]
    assert rpc_framework.title == "PyTorch RPC"


def test_dash_f_accepts_it_and_the_plan_gives_its_environment(rpc_framework):
    spec = resolve(parse_args("-f rpc -n 3"), RunDefaults(), mpiexec_found=False)
    p = plan(spec, HERE)
    assert p.framework is rpc_framework and p.backend == "gloo"
    assert [p.envs[r]["RPC_WORKER_NAME"] for r in range(3)] == ["worker0", "worker1", "worker2"]
    assert p.envs[2]["RANK"] == "2" and p.envs[2]["JUPYTER_DIST_FRAMEWORK"] == "rpc"


def test_an_unknown_framework_names_the_choices_including_it(rpc_framework):
    with pytest.raises(UsageError, match=r"-f/--framework must be one of pytorch, .*tensorflow, rpc, not 'jax'"):
        resolve(parse_args("-f jax"), RunDefaults(), mpiexec_found=False)
