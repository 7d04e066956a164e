"""Phases of a `%%distrun` cell timed inside the kernel (benchmarks only).

`INSTALL` is cell code: it wraps the methods a run goes through (class attributes, so every
instance is timed) and sums their seconds into `_jd_phases`, which `TAKE` returns and clears.
The wrappers cost about a microsecond a call. Nested phases overlap: each is its own total.
"""

from __future__ import annotations

# (module, owner, attribute, label), in the order of a cold run
PHASES = (
    ("jupyter_dist.run.session", "DistSession", "run", "run: all of %%distrun in the kernel"),
    ("jupyter_dist.run.session", "DistSession", "warm_plan", "warm: reuse the checked plan"),
    ("jupyter_dist.run.session", "DistSession", "prepare", "cold: flags, checks, plan (pure)"),
    ("jupyter_dist.run.session", "DistSession", "local_node", "cold: this host probed (or waited for: %load_ext's thread)"),
    ("jupyter_dist.run.session", "DistSession", "bring_up", "cold: bring_up (engines + set-up)"),
    ("jupyter_dist.cluster.background", None, "wait", "cold:   waited for the engines started at %load_ext"),
    ("jupyter_dist.cluster.engines", "EngineCluster", "start", "cold:   engines started, all of it"),
    ("ipyparallel", "Cluster", "start_controller", "cold:     controller (ipcontroller up)"),
    ("ipyparallel", "Cluster", "start_engines", "cold:     mpiexec launched"),
    ("jupyter_dist.cluster.watchdog", None, "start", "cold:     watchdog process"),
    ("ipyparallel", "Cluster", "connect_client", "cold:     client connected"),
    ("jupyter_dist.cluster.engines", "EngineCluster", "_wait_for_engines",
     "cold:     engines registering (python, imports, MPI init)"),
    ("jupyter_dist.cluster.engines", "EngineCluster", "_map_ranks", "cold:     ranks mapped (identify, assign_rank)"),
    ("jupyter_dist.run.session", "DistSession", "_engine_plan", "cold:   plan on the engines (ports, envs)"),
    ("jupyter_dist.run.runner", "Runner", "setup", "per-rank set-up (env, framework hooks, cwd)"),
    ("jupyter_dist.run.runner", "Runner", "execute", "execute: cell, output, view"),
    ("jupyter_dist.cluster.replacement", None, "tend", "after the cell: warm spare engine tended"),
    ("ipyparallel.client.view", "DirectView", "execute", "execute:   send the cell"),
    ("jupyter_dist.views.live_output", "LiveTextSink", "__init__", "execute:   view: sink made"),
    ("jupyter_dist.views.live_output", "LiveTextSink", "start", "execute:   view: sink started"),
    ("jupyter_dist.views.live_output", "LiveTextSink", "_show", "execute:   view: widgets made and shown"),
    ("jupyter_dist.run.runner", "Runner", "_drain", "execute:   output: taken, cut into lines, logged, handed on"),
    ("jupyter_dist.views.live_output", "LiveTextSink", "lines", "execute:     of it, lines into the view's model"),
    ("jupyter_dist.run.output", "RankLogs", "write", "execute:     of it, lines into the log files"),
    ("jupyter_dist.views.live_output", "LiveTextSink", "finish", "execute:   view: closed, transcript printed"),
    ("jupyter_dist.run.streams", "RunStreams", "__init__", "execute:   streams: callbacks queued"),
    ("jupyter_dist.run.streams", "RunStreams", "detach", "execute:   streams: settled, callbacks removed"),
    ("ipyparallel.client.asyncresult", "AsyncResult", "wait_for_output", "execute:   the ranks' last output waited for"),
    ("jupyter_dist.cluster.engines", "EngineCluster", "set_busy", "execute:   cluster busy/idle (status, spares)"),
    ("jupyter_dist.cluster.replacement", None, "tend", "execute:     of it, the warm spares tended"),
    ("jupyter_dist.run.session", "DistSession", "_remember", "run: the flags remembered"),
    ("jupyter_dist.run.resources", "ResourcePoller", "__enter__", "run: resources poller entered"),
    ("jupyter_dist.views.live_output", "LiveTextSink", "print_transcript", "execute:     of it, the transcript printed"),
)

INSTALL = f"""
import contextlib as _cl, functools as _ft, importlib as _il, inspect as _insp, time as _tm
_jd_phases = {{}}
@_cl.contextmanager
def _jd_timed(label):
    t = _tm.perf_counter()
    try:
        yield
    finally:
        _jd_phases[label] = _jd_phases.get(label, 0.0) + _tm.perf_counter() - t
def _jd_wrap(mod, owner, name, label):
    target = _il.import_module(mod)
    if owner is not None:
        target = getattr(target, owner)
    fn = getattr(target, name, None)
    if fn is None:  # a phase of another version of the code
        return
    if _insp.iscoroutinefunction(fn):
        async def w(*a, **k):
            with _jd_timed(label):
                return await fn(*a, **k)
    else:
        def w(*a, **k):
            with _jd_timed(label):
                return fn(*a, **k)
    setattr(target, name, _ft.wraps(fn)(w))
for _p in {PHASES!r}:
    _jd_wrap(*_p)
"""

TAKE = "dict(_jd_phases)"
CLEAR = "_jd_phases.clear()"


def table(runs: list[dict[str, float]], title: str) -> str:
    """Median seconds of each phase over `runs` (phases in PHASES order), as aligned text, in ms."""
    import statistics

    lines = [title]
    for *_, label in PHASES:
        got = [r.get(label, 0.0) for r in runs]
        if any(got):
            lines.append(f"  {label:<58} {statistics.median(got) * 1e3:>10.1f} ms")
    return "\n".join(lines)
