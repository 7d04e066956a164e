"""The configuration panel (ipywidgets): `%dist panel` and `jupyter_dist.panel()`.

The panel keeps no copy of the run defaults. Every control writes the session's defaults
store, checked by the same validation as the sidebar's writes (`comm.parse_defaults`), and
every change of the store (a `%%distrun` with flags, the sidebar, another panel) redraws the
controls. What the choices imply is computed from the store's value with the run's own
functions: `spec.resolve` of a flag-less `%%distrun`, `build_layout`, `fabric.resolve_backend`,
`fabric.fabric_env`, the framework's checks and `envs.rank_environments`.

The panel follows the cluster's status through the fan-out of `jupyter_dist.cluster.status`, beside
the sidebar's `comm.notify_status`.
"""

from __future__ import annotations

import contextlib
import html
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from jupyter_dist import frameworks
from jupyter_dist.cluster.engines import ClusterShape, find_mpiexec
from jupyter_dist.cluster.status import StatusListeners, add_status_listener
from jupyter_dist.frameworks import RunContext
from jupyter_dist.plan import fabric_env as fabric
from jupyter_dist.plan import spec as specmod
from jupyter_dist.plan.defaults import BACKENDS, FRAMEWORKS, IB_MODES, LAUNCHERS, RunDefaults
from jupyter_dist.plan.envs import rank_environments
from jupyter_dist.plan.fabric_env import NodeFabric
from jupyter_dist.plan.layout import Layout, build_layout
from jupyter_dist.ui import sidebar as comm

if TYPE_CHECKING:
    from jupyter_dist.run.session import DistSession

__all__ = ["Panel", "Preview", "StatusListeners", "add_status_listener", "panel", "preview"]

PLACEHOLDER_PORT = 29500  # shown as MASTER_PORT until engines of this shape run (then their port)
PREVIEW_LIMIT = 8192  # ranks: above this the environment preview is not computed
GRID_NODES = 8  # rows and columns the rank grid shows before it elides
GRID_RANKS = 16
BADGE_LIMIT = 64  # ranks the status line shows one by one
AUTO = "auto"  # the launcher dropdown's value for "mpi when mpiexec is found, else local"
STATE_COLORS = {"idle": "#2e7d32", "busy": "#ef6c00", "dead": "#c62828", "starting": "#757575"}
STYLE = {"description_width": "110px"}


# ---------------------------------------------------------------------------- what a choice implies


@dataclass(frozen=True)
class Preview:
    """A flag-less `%%distrun` with these defaults: its spec, layout, backend and environments."""

    spec: specmod.RunSpec | None = None
    layout: Layout | None = None
    backend: str | None = None
    envs: dict[int, dict[str, str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    problem: str | None = None  # the sentence the run would fail with
    real_port: bool = False  # MASTER_PORT is the running cluster's, not the placeholder

    @property
    def world_size(self) -> int:
        return self.layout.world_size if self.layout else 0


def preview(
    d: RunDefaults,
    node: NodeFabric,
    *,
    mpiexec_found: bool,
    inherited: frozenset[str] = frozenset(),
    running: tuple[ClusterShape | None, int, tuple[int, ...]] = (None, 0, ()),
) -> Preview:
    """Pure: `running` is the cluster's (shape, master_port, task_ports), used when it matches."""
    try:
        spec = specmod.resolve(specmod.parse_args(""), d, gpus_per_node=node.gpu_count, mpiexec_found=mpiexec_found)
    except UsageError as e:
        return Preview(problem=str(e))
    shape, port, task_ports = running
    real = shape == ClusterShape(spec.launcher, spec.world_size, spec.hosts) and port > 0
    if not real:
        port = PLACEHOLDER_PORT
        small = spec.world_size <= PREVIEW_LIMIT
        task_ports = tuple(PLACEHOLDER_PORT + 1 + r for r in range(spec.world_size)) if small else ()
    layout = build_layout(spec.nodes, spec.procs_per_node, spec.hosts, master_port=port, task_ports=task_ports)
    notes: list[str] = []
    try:
        backend, note = fabric.resolve_backend(spec.backend, node.gpu_count, spec.procs_per_node)
        notes += [note] if note else []
        fw = frameworks.get(spec.framework)
        if fw.module and importlib.util.find_spec(fw.module) is None:
            notes.append(f"-f {fw.name} needs {fw.module}, which is not installed here: {fw.install_hint()}")
        ctx = RunContext(spec, layout, backend, inherited=inherited)
        fw.check(ctx)
        fenv = fabric.fabric_env(node, backend=backend, ib=spec.ib, nccl_debug=False,
                                 master_addr=layout.master_addr, all_local=layout.all_local)
    except UsageError as e:
        return Preview(spec, layout, notes=tuple(notes), problem=str(e), real_port=real)
    envs: dict[int, dict[str, str]] = {}
    if layout.world_size <= PREVIEW_LIMIT:
        envs = rank_environments(ctx, fw, {n: fenv for n in range(layout.nodes)})
    else:
        notes.append(f"the environment preview is shown for world sizes up to {PREVIEW_LIMIT}")
    return Preview(spec, layout, backend, envs, tuple(notes), real_port=real)


# ---------------------------------------------------------------------------- HTML pieces


def _state_style(state: str | None) -> str:
    color = STATE_COLORS.get(state or "")
    return f"background:{color};color:white;" if color else ""


def grid_html(layout: Layout, states: dict[int, str] | None = None) -> str:
    """Nodes as rows, local ranks as columns, each cell the global rank (coloured by live state)."""
    states = states or {}
    cols = min(layout.procs_per_node, GRID_RANKS)
    more_cols = layout.procs_per_node - cols
    head = "".join(f"<th>{c}</th>" for c in range(cols)) + ("<th>…</th>" if more_cols else "")
    rows = []
    for n in range(min(layout.nodes, GRID_NODES)):
        first = n * layout.procs_per_node
        cells = "".join(
            f"<td style='text-align:center;padding:2px 6px;{_state_style(states.get(r))}'>{r}</td>"
            for r in range(first, first + cols)
        )
        if more_cols:
            cells += f"<td title='{more_cols} more'>…</td>"
        host = html.escape(layout.hosts[n])
        rows.append(f"<tr><th style='text-align:left'>node {n} <small>{host}</small></th>{cells}</tr>")
    if layout.nodes > GRID_NODES:
        rows.append(f"<tr><td colspan='{cols + 2}'>… {layout.nodes - GRID_NODES} more node(s)</td></tr>")
    return (
        "<table class='jupyter-dist-grid' style='border-collapse:collapse'>"
        f"<tr><th style='text-align:left'>local rank →</th>{head}</tr>{''.join(rows)}</table>"
    )


def env_html(env: dict[str, str]) -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(k)}</code></td><td><code>{html.escape(v)}</code></td></tr>"
        for k, v in env.items()
    )
    return (
        "<div style='max-height:18em;overflow:auto'><table class='jupyter-dist-env'>"
        f"<tr><th style='text-align:left'>variable</th><th style='text-align:left'>value</th></tr>{rows}</table></div>"
    )


def summary_html(p: Preview) -> str:
    parts = []
    if p.spec is not None:
        s = p.spec
        parts.append(
            f"<b>world size {s.world_size}</b> = {s.nodes} node(s) × {s.procs_per_node} process(es) per node"
            f" · backend {html.escape(p.backend or s.backend)} · launcher {html.escape(s.launcher)}"
            f" · timeout {'none' if s.timeout is None else f'{s.timeout:g} s'}"
        )
    if p.problem:
        parts.append(f"<span style='color:#c62828'>a %%distrun without flags would fail: {html.escape(p.problem)}</span>")
    parts += [f"<span style='color:#757575'>{html.escape(n)}</span>" for n in p.notes]
    return "<br>".join(parts)


def status_html(st: dict[str, Any], message: str = "") -> str:
    """The live status line: cluster state, engines up, and each rank's state."""
    state = str(st.get("state", "error"))
    head = (
        f"<b>cluster: <span style='{_state_style(state)}padding:0 4px'>{html.escape(state)}</span></b>"
        f" · {int(st.get('engines') or 0)}/{int(st.get('expected') or 0)} engines up"
    )
    if st.get("launcher"):
        head += f" · via {html.escape(str(st['launcher']))}"
    ranks = [r for r in st.get("ranks") or [] if isinstance(r, dict)]
    if ranks:
        counts: dict[str, int] = {}
        for r in ranks:
            counts[str(r.get("state"))] = counts.get(str(r.get("state")), 0) + 1
        head += " · " + ", ".join(f"{n} {html.escape(s)}" for s, n in sorted(counts.items()))
        if len(ranks) <= BADGE_LIMIT:
            head += "<br>" + " ".join(
                f"<span style='{_state_style(str(r.get('state')))}padding:0 4px;border-radius:3px'"
                f" title='{html.escape(str(r.get('host', '')))}'>rank {int(r.get('rank', -1))} "
                f"{html.escape(str(r.get('state')))}</span>"
                for r in ranks
            )
    for text in (st.get("message"), message):
        if text:
            head += f"<br><span style='color:#c62828'>{html.escape(str(text))}</span>"
    return head


# ---------------------------------------------------------------------------- the panel


class Panel:
    """The widgets, bound to `session.store` (both ways) and to `control` (the cluster)."""

    def __init__(self, session: DistSession, control: comm.ClusterControl | None = None, *,
                 node: NodeFabric | None = None, mpiexec_found: bool | None = None) -> None:
        import ipywidgets as w

        self.session = session
        self.store = session.store
        self.control = control if control is not None else session.control()
        self.node = node if node is not None else session.local_node()
        self.mpiexec_found = find_mpiexec() is not None if mpiexec_found is None else mpiexec_found
        self.auto_procs = self.node.gpu_count or 2
        self.closed = False
        self.preview = Preview()
        self._syncing = 0
        self._message = ""
        self._states: dict[int, str] = {}
        self._status: dict[str, Any] = dict(comm.STOPPED_STATUS)

        def dropdown(label: str, options: Any) -> Any:
            return w.Dropdown(options=options, description=label, style=STYLE)

        self.framework = dropdown("framework", list(FRAMEWORKS))
        self.backend = dropdown("backend", list(BACKENDS))
        self.launcher = dropdown("launcher", [(f"auto ({'mpi' if self.mpiexec_found else 'local'})", AUTO),
                                              *((name, name) for name in LAUNCHERS)])
        self.ib = dropdown("InfiniBand", list(IB_MODES))
        self.nodes = w.BoundedIntText(min=1, max=comm.MAX_NODES, description="nodes", style=STYLE)
        self.procs = w.BoundedIntText(min=1, max=comm.MAX_PROCS_PER_NODE, description="procs per node", style=STYLE)
        self.procs_auto = w.Checkbox(description=f"auto (GPUs per node, else 2: {self.auto_procs})", indent=False)
        self.hosts = w.Text(description="hosts", placeholder="this host; or host1,host2 (one per node)",
                            continuous_update=False, style=STYLE, layout=w.Layout(width="32em"))
        self.hosts_msg = w.HTML()
        self.timeout = w.BoundedFloatText(min=0.001, max=1e9, step=1, value=600.0, description="timeout (s)",
                                          style=STYLE)
        self.no_timeout = w.Checkbox(description="none", indent=False)
        self.summary = w.HTML()
        self.grid = w.HTML()
        self.rank = w.BoundedIntText(min=0, max=0, description="environment of rank", style={"description_width": "140px"})
        self.env = w.HTML()
        self.start_button = w.Button(description="Start", icon="play", tooltip="start engines for these defaults")
        self.stop_button = w.Button(description="Stop", icon="stop")
        self.restart_button = w.Button(description="Restart", icon="refresh")
        self.status = w.HTML()

        self._bind(self.framework, lambda v: self._write(framework=v))
        self._bind(self.backend, lambda v: self._write(backend=v))
        self._bind(self.launcher, lambda v: self._write(launcher=None if v == AUTO else v))
        self._bind(self.ib, lambda v: self._write(ib=v))
        self._bind(self.nodes, lambda v: self._write(nodes=v))
        self._bind(self.procs, lambda v: self._write(procs_per_node=v))
        self._bind(self.procs_auto, lambda v: self._write(procs_per_node=None if v else self.procs.value))
        self._bind(self.hosts, self._set_hosts)
        self._bind(self.timeout, lambda v: self._write(timeout=v))
        self._bind(self.no_timeout, lambda v: self._write(timeout=None if v else self.timeout.value))
        self.rank.observe(lambda _change: self._render_env(), "value")
        self.start_button.on_click(lambda _b: self.act("start"))
        self.stop_button.on_click(lambda _b: self.act("stop"))
        self.restart_button.on_click(lambda _b: self.act("restart"))

        row, box = w.HBox, w.VBox
        self.widget = box([
            w.HTML("<b>jupyter-dist</b>: defaults of the next <code>%%distrun</code> without flags"),
            row([self.framework, self.backend]),
            row([self.nodes, self.procs, self.procs_auto]),
            row([self.launcher, self.ib]),
            row([self.hosts, self.hosts_msg]),
            row([self.timeout, self.no_timeout]),
            self.summary,
            self.grid,
            self.rank,
            self.env,
            row([self.start_button, self.stop_button, self.restart_button]),
            self.status,
        ])
        self._unsubscribe = self.store.subscribe(self._on_store)
        cluster = getattr(session, "cluster", None)
        self._unlisten = add_status_listener(cluster, self.refresh_status) if cluster is not None else (lambda: None)
        self._apply(self.store.value)
        self.refresh_status()

    # -- display and lifetime ----------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Stop following the store and the cluster, and close the widgets."""
        self.closed = True
        self._unsubscribe()
        self._unlisten()
        for child in self.widget.children:
            if hasattr(child, "children"):
                for grandchild in child.children:
                    grandchild.close()
            child.close()
        self.widget.close()

    # -- widgets -> store --------------------------------------------------------------

    @contextlib.contextmanager
    def _sync(self) -> Iterator[None]:
        self._syncing += 1
        try:
            yield
        finally:
            self._syncing -= 1

    def _bind(self, widget: Any, on_value: Callable[[Any], None]) -> None:
        def observer(change: dict[str, Any]) -> None:
            if not self._syncing:  # a redraw from the store is not a user's choice
                on_value(change["new"])

        widget.observe(observer, "value")

    def _write(self, **changes: Any) -> None:
        """Validated like the sidebar's writes; an invalid value is refused and the controls redrawn."""
        try:
            clean = comm.parse_defaults(changes)
        except comm.ProtocolError as e:
            self._message = f"not saved: {e}"
            self._apply(self.store.value)
            self.refresh_status()
            return
        if self._message:
            self._message = ""
            self.refresh_status()
        self.store.update(**clean)

    def _set_hosts(self, text: str) -> None:
        names = [h.strip() for h in text.split(",") if h.strip()]
        changes: dict[str, Any] = {"hosts": names}
        if names:
            changes["nodes"] = len(names)  # one node per host
        try:
            clean = comm.parse_defaults(changes)
        except comm.ProtocolError as e:
            now = ",".join(self.store.value.hosts) or "this host"
            self.hosts_msg.value = (
                f"<span style='color:#c62828'>{html.escape(str(e))}: not saved (still {html.escape(now)})</span>"
            )
            return
        self.hosts_msg.value = ""
        self.store.update(**clean)

    # -- store -> widgets --------------------------------------------------------------

    def _on_store(self, d: RunDefaults) -> None:
        if not self.closed:
            self._apply(d)

    def _apply(self, d: RunDefaults) -> None:
        with self._sync():
            self.framework.value = d.framework
            self.backend.value = d.backend
            self.launcher.value = d.launcher or AUTO
            self.ib.value = d.ib
            self.hosts.value = ",".join(d.hosts)
            self.hosts_msg.value = ""
            self.nodes.value = len(d.hosts) if d.hosts else d.nodes
            self.nodes.disabled = bool(d.hosts)
            self.procs_auto.value = d.procs_per_node is None
            self.procs.value = d.procs_per_node or self.auto_procs
            self.procs.disabled = d.procs_per_node is None
            self.no_timeout.value = d.timeout is None
            if d.timeout is not None:
                self.timeout.value = d.timeout
            self.timeout.disabled = d.timeout is None
        self._render_preview(d)

    # -- what the choices imply --------------------------------------------------------

    def _render_preview(self, d: RunDefaults) -> None:
        cluster = getattr(self.session, "cluster", None)
        running = (cluster.shape, cluster.master_port, cluster.task_ports) if cluster is not None else (None, 0, ())
        inherited = cluster.inherited_env if cluster is not None else frozenset()
        self.preview = preview(d, self.node, mpiexec_found=self.mpiexec_found, inherited=inherited, running=running)
        self.summary.value = summary_html(self.preview)
        self._render_grid()
        with self._sync():
            self.rank.max = max(0, self.preview.world_size - 1)
        self._render_env()

    def _render_grid(self) -> None:
        layout = self.preview.layout
        live = self._states if len(self._states) == self.preview.world_size else {}
        self.grid.value = grid_html(layout, live) if layout is not None else ""

    def _render_env(self) -> None:
        p = self.preview
        env = p.envs.get(self.rank.value)
        if env is None:
            self.env.value = ""
            return
        port = "" if p.real_port else (
            f"<br><small>MASTER_PORT {PLACEHOLDER_PORT} is a placeholder: the real port is chosen "
            "when the engines start.</small>"
        )
        self.env.value = env_html(env) + port

    # -- the cluster -------------------------------------------------------------------

    def refresh_status(self) -> None:
        """Redraw the status line (called by the cluster on every status change)."""
        if self.closed:
            return
        try:
            st = dict(self.control.status())
        except Exception as e:  # noqa: BLE001 - a status that fails is shown, not raised
            st = {**comm.STOPPED_STATUS, "state": "error", "message": f"cluster status failed: {e}"}
        self._status = st
        self._states = {
            int(r["rank"]): str(r.get("state")) for r in st.get("ranks") or [] if isinstance(r, dict) and "rank" in r
        }
        if int(st.get("expected") or 0) != len(self._states):
            self._states = {}
        state = st.get("state")
        self.start_button.disabled = state == "starting"
        self.stop_button.disabled = self.restart_button.disabled = state in ("stopped", "starting")
        self.status.value = status_html(st, self._message)
        self._render_grid()

    def act(self, action: str) -> None:
        """Start, stop or restart the cluster through the control; a failure is shown in the status line."""
        if action not in comm.CLUSTER_ACTIONS:
            raise ValueError(f"unknown cluster action {action!r}")
        self._message = ""
        buttons = (self.start_button, self.stop_button, self.restart_button)
        for b in buttons:
            b.disabled = True
        try:
            getattr(self.control, action)()
        except Exception as e:  # noqa: BLE001 - shown to the user
            self._message = f"{action} failed: {e}"
        finally:
            self.refresh_status()


_panels: dict[int, Panel] = {}


def panel(session: DistSession) -> Panel:
    """The session's panel (one per session: displaying it again shows the same, synchronised widgets)."""
    current = _panels.get(id(session))
    if current is None or current.closed or current.session is not session:
        current = Panel(session)
        _panels[id(session)] = current
    return current
