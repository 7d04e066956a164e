"""Engine side of `-f tensorflow`: background servers for parameter-server training, and one
MultiWorkerMirroredStrategy per process, handed back when a cell makes it again."""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType
from typing import Any

from jupyter_dist.engine.frameworks import horovod
from jupyter_dist.engine.frameworks.patch import when_imported

_state: dict[str, Any] = {}  # "server": (cluster key, Server); "mwms": (TF_CONFIG, strategy)

RESTART = "TensorFlow cannot leave a cluster it joined: run %dist restart, then the cell again"


def cluster_key(config: str) -> str:
    """What must stay the same for a process to stay in its TensorFlow cluster."""
    data = json.loads(config)
    return json.dumps({"cluster": data.get("cluster"), "task": data.get("task")}, sort_keys=True)


def imported() -> bool:
    """Whether this engine imported TensorFlow (before that it joined no TensorFlow cluster)."""
    return "tensorflow" in sys.modules


def setup_tensorflow() -> None:
    """Engine hook: reuse of MultiWorkerMirroredStrategy; `worker` and `ps` tasks of a
    parameter-server cluster start serving (a `tf.distribute.Server`, in TensorFlow's threads)."""
    when_imported("tensorflow", _patch_mwms)
    config = os.environ.get("TF_CONFIG")
    if config:  # a -f horovod run before on these engines: its rendezvous holds a port TF_CONFIG may name
        horovod.stop_rendezvous()
    if os.environ.get("JUPYTER_DIST_FRAMEWORK") != "tensorflow" or not config:
        return
    data = json.loads(config)
    kind = data.get("task", {}).get("type")
    if "ps" not in data.get("cluster", {}) or kind not in ("worker", "ps"):
        return
    key = cluster_key(config)
    have = _state.get("server")
    if have is not None:
        if have[0] != key:
            raise RuntimeError(f"this engine already serves another TensorFlow cluster; {RESTART}.")
        return
    if "mwms" in _state:
        raise RuntimeError(f"this engine already joined a MultiWorkerMirroredStrategy cluster; {RESTART}.")
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol=resolver.rpc_layer or "grpc", start=True)
    _state["server"] = (key, server)
    print(f"jupyter-dist: {kind} {resolver.task_id} serving at {server.target}", flush=True)


def _patch_mwms(tf: ModuleType) -> None:
    from tensorflow.python.distribute import collective_all_reduce_strategy as mod

    base = mod.CollectiveAllReduceStrategy
    if getattr(base, "_jupyter_dist_reuse", None) is not None:
        reuse = base._jupyter_dist_reuse
    else:
        reuse = _reusing_class(base)
        base._jupyter_dist_reuse = reuse
    for name, module in list(sys.modules.items()):
        if name.startswith("tensorflow._api") and getattr(module, "MultiWorkerMirroredStrategy", None) is base:
            module.MultiWorkerMirroredStrategy = reuse


def _reusing_class(base: type) -> type:
    class _Reuse(type(base)):  # type: ignore[misc]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            key = cluster_key(os.environ.get("TF_CONFIG") or "{}")
            have = _state.get("mwms")
            if have is not None:
                if have[0] != key:
                    raise RuntimeError(
                        "TensorFlow makes one MultiWorkerMirroredStrategy per process and this engine's was "
                        f"made for another cluster (TF_CONFIG); {RESTART}."
                    )
                if not _state.get("said_reuse"):
                    _state["said_reuse"] = True
                    print("jupyter-dist: reusing this rank's MultiWorkerMirroredStrategy "
                          "(TensorFlow makes one per process)", flush=True)
                return have[1]
            if "server" in _state:
                raise RuntimeError(f"this engine serves a parameter-server cluster; {RESTART}.")
            strategy = super().__call__(*args, **kwargs)
            _state["mwms"] = (key, strategy)
            return strategy

    return _Reuse("MultiWorkerMirroredStrategy", (base,), {"__doc__": base.__doc__, "__module__": base.__module__})
