"""What the panel's choices imply: the plan of a flag-less `%%distrun` with these defaults.

Pure. The spec is what `%%distrun` without flags resolves to (`spec.resolve`), the rest is the
run's own `plan`: layout, backend, the framework's checks, every rank's environment. Until
engines of this shape run, the ports are torchrun's defaults (`Ports.unchosen`), shown as such;
then the running cluster's real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.cluster.shape import ClusterShape
from jupyter_dist.common.node import NodeFabric
from jupyter_dist.plan import spec as specmod
from jupyter_dist.plan.defaults import RunDefaults
from jupyter_dist.plan.layout import Layout
from jupyter_dist.plan.plan import Ports, install_problem, layout_of, plan

PREVIEW_LIMIT = 8192  # ranks: above this the environment preview is not computed


@dataclass(frozen=True)
class Preview:
    """A flag-less `%%distrun` with these defaults: its spec, layout, backend and environments."""

    spec: specmod.RunSpec | None = None
    layout: Layout | None = None
    backend: str | None = None
    envs: dict[int, dict[str, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    problem: str | None = None  # the sentence the run would fail with
    ports: Ports | None = None

    @property
    def world_size(self) -> int:
        return self.layout.world_size if self.layout else 0

    @property
    def real_port(self) -> bool:
        """MASTER_PORT is the running cluster's, not torchrun's default standing in for it."""
        return self.ports is not None and self.ports.chosen


Running = tuple[ClusterShape | None, int, tuple[int, ...]]


def preview(
    d: RunDefaults,
    node: NodeFabric,
    *,
    mpiexec_found: bool,
    inherited: frozenset[str] = frozenset(),
    running: Running = (None, 0, ()),
) -> Preview:
    """`running` is the cluster's (shape, master_port, task_ports), used when it matches."""
    try:
        spec = specmod.resolve(specmod.parse_args(""), d, gpus_per_node=node.gpu_count, mpiexec_found=mpiexec_found)
    except UsageError as e:
        return Preview(problem=str(e))
    shape, port, task_ports = running
    if shape == ClusterShape(spec.launcher, spec.world_size, spec.hosts) and port > 0:
        ports = Ports(port, task_ports)
    else:
        ports = Ports.unchosen(spec, task_limit=PREVIEW_LIMIT)
    problem = install_problem(frameworks.get(spec.framework))
    notes = (problem,) if problem else ()
    try:
        p = plan(spec, node, ports=ports, inherited=inherited, env_limit=PREVIEW_LIMIT)
    except UsageError as e:
        return Preview(spec, layout_of(spec, ports), notes=notes, problem=str(e), ports=ports)
    if p.layout.world_size > PREVIEW_LIMIT:
        notes += (f"the environment preview is shown for world sizes up to {PREVIEW_LIMIT}",)
    return Preview(spec, p.layout, p.backend, p.envs, p.notes + notes, ports=ports)
