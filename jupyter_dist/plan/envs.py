"""Each rank's environment: fabric defaults < framework values < what the user gave.

Pure. What the engines inherited sits below all three; the engine side (`engine.apply_env`)
restores it for keys a later run no longer sets, so one run never leaks into the next.
"""

from __future__ import annotations

from collections.abc import Mapping

from jupyter_dist.frameworks import Framework, RunContext


def compose(fabric: Mapping[str, str], framework: Mapping[str, str], user: Mapping[str, str]) -> dict[str, str]:
    env = dict(fabric)
    env.update(framework)
    env.update(user)
    return env


def rank_environments(
    ctx: RunContext,
    fw: Framework,
    fabric_by_node: Mapping[int, Mapping[str, str]],
) -> dict[int, dict[str, str]]:
    """rank -> the full set of variables the run sets on that rank."""
    user = ctx.spec.user_env
    envs: dict[int, dict[str, str]] = {}
    for rank in range(ctx.layout.world_size):
        node = ctx.layout.node_of(rank)
        framework_env = fw.rank_env(ctx, rank)
        framework_env["JUPYTER_DIST_FRAMEWORK"] = fw.name
        framework_env["JUPYTER_DIST_BACKEND"] = ctx.backend
        envs[rank] = horovod_gloo_iface(compose(fabric_by_node.get(node, {}), framework_env, user))
    return envs


def horovod_gloo_iface(env: dict[str, str]) -> dict[str, str]:
    """Horovod in Gloo mode binds to HOROVOD_GLOO_IFACE, never reading GLOO_SOCKET_IFNAME; unset, it binds to
    the address of the node's host name, which need not resolve on the node (Slurm nodes in their own
    namespaces: "Unable to find address for: <node>"). It gets the rank's Gloo interface when that is one name."""
    iface = env.get("GLOO_SOCKET_IFNAME", "").removeprefix("=")
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env and "HOROVOD_GLOO_IFACE" not in env and iface and not set(iface) & set("^,"):
        env["HOROVOD_GLOO_IFACE"] = iface
    return env
