"""`%%distrun`, `%distrun` and `%dist`: parse the line, call the session. Nothing else."""

from __future__ import annotations

import shlex
from typing import Any

import IPython.display
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class, no_var_expand

from jupyter_dist.azureml import config_to_flags
from jupyter_dist.plan import spec as specmod
from jupyter_dist.run.session import DistSession
from jupyter_dist.tools import export
from jupyter_dist.tools.diagnostics import doctor_report, run_allreduce_bench, show_bench, show_doctor
from jupyter_dist.tools.logs import logs_report
from jupyter_dist.views.panel import panel
from jupyter_dist.views.status import show_status


@magics_class
class DistMagics(Magics):
    def __init__(self, shell: Any, session: DistSession) -> None:
        super().__init__(shell)
        self.session = session
        self._last_spec: tuple[str, Any, specmod.RunSpec] | None = None  # (line, defaults, spec)

    def parse(self, line: str) -> specmod.RunSpec:
        """The line's RunSpec. A re-run of the same line over the same defaults gives the same spec
        (resolving is pure), kept from last time, unless the line reads something that can change
        between runs (`--config` a notebook variable, `--hostfile` a file)."""
        defaults = self.session.store.value
        last = self._last_spec
        if last is not None and last[0] == line and last[1] is defaults:
            return last[2]
        ns = specmod.parse_args(line)
        spec = self._resolve(ns, defaults)
        self._last_spec = None if (ns.config is not None or ns.hostfile is not None) else (line, defaults, spec)
        return spec

    def _resolve(self, ns: Any, defaults: Any) -> specmod.RunSpec:
        config = None
        if ns.config is not None:
            if ns.config not in self.shell.user_ns:
                raise UsageError(f"--config {ns.config}: there is no variable named {ns.config!r} in the notebook.")
            config = config_to_flags(ns.config, self.shell.user_ns[ns.config])
        node = self.session.local_node()
        return specmod.resolve(
            ns,
            defaults,
            config=config,
            gpus_per_node=node.gpu_count,
            mpiexec_found=self.session.mpiexec_found(),
        )

    @no_var_expand
    @line_cell_magic
    def distrun(self, line: str, cell: str | None = None) -> None:
        """Run the cell (or, as a line magic, a script) on every rank. See `%dist help`."""
        spec = self.parse(line)
        if cell is None and spec.script is None:
            raise UsageError("%distrun as a line magic needs a script: %distrun [flags] script.py [args].")
        if cell is not None and spec.script is not None:
            raise UsageError(f"%%distrun runs the cell; {spec.script!r} after the flags is not a flag.")
        self.session.run(spec, cell, self.shell)

    @line_magic
    def dist(self, line: str) -> Any:
        """`%dist status|stop|restart [--rank R]|stacks|logs|doctor|bench allreduce|export|panel`."""
        args = shlex.split(line)
        if not args:
            raise UsageError("%dist needs a command: status, stop, restart, stacks, logs, doctor, bench, export or panel.")
        command, rest = args[0], args[1:]
        handler = getattr(self, f"_dist_{command}", None)
        if handler is None:
            raise UsageError(f"%dist {command}: unknown command; use status, stop, restart, stacks, logs, doctor, bench, "
                             "export or panel.")
        return handler(rest)

    def _dist_status(self, rest: list[str]) -> None:
        show_status(self.session.status())

    def _dist_stacks(self, rest: list[str]) -> None:
        """`%dist stacks`: every rank's stack and collective now (it answers while a cell runs, from a
        subshell or the sidebar), or the last ones taken when the ranks are idle or gone."""
        if rest:
            raise UsageError(f"%dist stacks takes no arguments, not {' '.join(rest)!r}.")
        print(self.session.reports.text(self.session.cluster.agents), flush=True)

    def _dist_panel(self, rest: list[str]) -> None:
        """`%dist panel`: the configuration panel, the same as `jupyter_dist.panel()`."""
        if rest:
            raise UsageError(f"%dist panel takes no arguments, not {' '.join(rest)!r}.")
        IPython.display.display(panel(self.session))

    def _spec_from(self, rest: list[str]) -> specmod.RunSpec:
        """`%dist doctor/bench` take the layout flags of `%%distrun`; none means the last run's."""
        if not rest and self.session.last is not None:
            return self.session.last.spec
        return self.parse(" ".join(shlex.quote(a) for a in rest))

    def _dist_doctor(self, rest: list[str]) -> None:
        show_doctor(doctor_report(self.session, self._spec_from(rest)))

    def _dist_bench(self, rest: list[str]) -> None:
        if not rest or rest[0] != "allreduce":
            raise UsageError("%dist bench needs what to measure: %dist bench allreduce [-N NODES -n PROCS ...].")
        show_bench(run_allreduce_bench(self.session, self._spec_from(rest[1:])))

    def _dist_stop(self, rest: list[str]) -> None:
        self.session.cluster.stop()
        print("jupyter-dist: cluster stopped")

    def _dist_restart(self, rest: list[str]) -> None:
        if self.session.cluster.shape is None:
            if rest:
                raise UsageError("%dist restart --rank: no cluster is running; %%distrun starts one.")
            self._start_afresh()
            return
        if rest:
            ranks = parse_restart_ranks(rest, self.session.cluster.shape.world_size)
            try:
                self.session.cluster.replace_ranks(ranks, say=lambda text: print(f"jupyter-dist: {text}", flush=True))
            except RuntimeError as e:
                raise UsageError(f"%dist restart --rank: {e}.") from None
            return
        self.session.cluster.restart()
        print(f"jupyter-dist: cluster restarted ({self.session.cluster.shape.world_size} engines)")

    def _start_afresh(self) -> None:
        """`%dist restart` with no engines up (stopped, or given up after a rank would not stop): start
        them afresh in the last run's shape (else the defaults'), as the restart was asked to."""
        last = self.session.last
        shape = self.session.shape_of(last.spec) if last else self.session.default_shape()
        self.session.cluster.ensure(shape)
        print(f"jupyter-dist: no cluster was running: started one ({shape.world_size} engines)")

    def _dist_logs(self, rest: list[str]) -> None:
        """`%dist logs`: where recent runs' per-rank logs are, and what the retention keeps."""
        if rest:
            raise UsageError(f"%dist logs takes no arguments, not {' '.join(rest)!r}.")
        print("\n".join(logs_report()))

    def _dist_export(self, rest: list[str]) -> None:
        """`%dist export [--format torchrun|mpirun|sbatch|azureml] [FILE]`: the last run as a script and its launcher."""
        options = export.parse_options(rest)
        last = self.session.last
        if last is None:
            raise UsageError("%dist export: there is no %%distrun run to export yet: run a cell with %%distrun first.")
        exp = export.build(last.spec, last.code, options)
        export.write(exp)
        print(exp.summary(), flush=True)


def parse_restart_ranks(rest: list[str], world_size: int) -> list[int]:
    """`--rank 1,3` (or `--rank=1,3`) -> [1, 3], each a rank of the running world."""
    text = " ".join(rest)
    value = rest[1] if len(rest) == 2 and rest[0] == "--rank" else text.removeprefix("--rank=") if len(rest) == 1 else None
    if value is None or value == text:
        raise UsageError(f"%dist restart takes --rank R[,R...] or nothing, not {text!r}.")
    try:
        ranks = sorted({int(r) for r in value.split(",")})
    except ValueError:
        raise UsageError(f"%dist restart --rank {value}: ranks are numbers separated by commas, such as 1,3.") from None
    if not ranks or any(r < 0 or r >= world_size for r in ranks):
        raise UsageError(f"%dist restart --rank {value}: the running world has ranks 0-{world_size - 1}.")
    return ranks
