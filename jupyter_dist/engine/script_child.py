"""The child process of `%distrun --fresh` (engine.script_fresh): `python -m` this, script, args.

Records its torch.distributed collectives for the engine to ask (engine.worker_collectives), sets
torch's step hooks when torch is imported (engine.metrics sends the counted steps as metric
lines, flushed at exit) and, on rank 0, `input()` asking the notebook (engine.stdin_relay), then runs
the script as `__main__`; `SystemExit` ends the process as usual.
"""

from __future__ import annotations

import sys
from types import ModuleType

from jupyter_dist.engine import gloo_loop, metrics, stdin_relay, worker_collectives
from jupyter_dist.engine.frameworks.patch import when_imported
from jupyter_dist.engine.script import run_script


def _hook_torch(torch: ModuleType) -> None:
    metrics.hook_torch(load=True)


def main(argv: list[str]) -> None:
    script, *args = argv
    when_imported("torch", _hook_torch)
    worker_collectives.serve()  # its collectives recorded, and answered for on the engine's asking
    gloo_loop.install()  # as in the engine: gloo's loop threads behind the training on a crowded node
    stdin_relay.install_in_child()
    run_script(script, args)


if __name__ == "__main__":
    main(sys.argv[1:])
