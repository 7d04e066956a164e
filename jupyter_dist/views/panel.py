"""The configuration panel (ipywidgets): `%dist panel` and `jupyter_dist.panel()`.

The panel keeps no copy of the run defaults. Every control writes the session's defaults
store, checked as the sidebar's writes are (`views.controls.check_defaults`), and every change
of the store (a `%%distrun` with flags, the sidebar, another panel) redraws the controls. What
the choices imply is the run's own plan of a flag-less `%%distrun` (`views.preview`).

The panel follows the cluster's status through the fan-out of `jupyter_dist.cluster.status`,
beside the sidebar's.
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from jupyter_dist.cluster.status import add_status_listener
from jupyter_dist.common.node import NodeFabric
from jupyter_dist.plan import validate
from jupyter_dist.plan.defaults import BACKENDS, IB_MODES, RunDefaults, launcher_names
from jupyter_dist.views.controls import (
    CLUSTER_ACTIONS,
    ClusterControl,
    check_defaults,
    framework_choices,
    stopped_status,
)
from jupyter_dist.views.panel_html import env_html, grid_html, port_note, status_html, summary_html
from jupyter_dist.views.preview import Preview, preview

if TYPE_CHECKING:
    from jupyter_dist.run.session import DistSession

__all__ = ["Panel", "panel"]

AUTO = "auto"  # the launcher dropdown's value for "mpi when mpiexec is found, else local"
STYLE = {"description_width": "110px"}


class Panel:
    """The widgets, bound to `session.store` (both ways) and to `control` (the cluster)."""

    def __init__(self, session: DistSession, control: ClusterControl | None = None, *,
                 node: NodeFabric | None = None, mpiexec_found: bool | None = None) -> None:
        import ipywidgets as w  # optional and heavy: loaded when a panel is first shown

        self.session = session
        self.store = session.store
        self.control = control if control is not None else session.control()
        self.node = node if node is not None else session.local_node()
        self.mpiexec_found = session.mpiexec_found() if mpiexec_found is None else mpiexec_found
        self.auto_procs = self.node.gpu_count or 2
        self.closed = False
        self.preview = Preview()
        self._syncing = 0
        self._message = ""
        self._states: dict[int, str] = {}
        self._status: dict[str, Any] = stopped_status()

        def dropdown(label: str, options: Any) -> Any:
            return w.Dropdown(options=options, description=label, style=STYLE)

        self.framework = dropdown("framework", [(title, name) for name, title in framework_choices()])
        self.backend = dropdown("backend", list(BACKENDS))
        self.launcher = dropdown("launcher", [(f"auto ({'mpi' if self.mpiexec_found else 'local'})", AUTO),
                                              *((name, name) for name in launcher_names())])
        self.ib = dropdown("InfiniBand", list(IB_MODES))
        self.nodes = w.BoundedIntText(min=1, max=validate.MAX_NODES, description="nodes", style=STYLE)
        self.procs = w.BoundedIntText(min=1, max=validate.MAX_PROCS_PER_NODE, description="procs per node", style=STYLE)
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
            clean = check_defaults(changes)
        except validate.InvalidValue as e:
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
            clean = check_defaults(changes)
        except validate.InvalidValue as e:
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
        self.env.value = env_html(env) + port_note(p)

    # -- the cluster -------------------------------------------------------------------

    def refresh_status(self) -> None:
        """Redraw the status line (called by the cluster on every status change)."""
        if self.closed:
            return
        try:
            st = dict(self.control.status())
        except Exception as e:  # noqa: BLE001 - a status that fails is shown, not raised
            st = {**stopped_status(), "state": "error", "message": f"cluster status failed: {e}"}
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
        if action not in CLUSTER_ACTIONS:
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
