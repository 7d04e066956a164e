"""How long `%dist stacks` takes while a cell runs: every rank's stack and collective, at N ranks.

    .venv/bin/python benchmarks/stacks_latency.py [--ranks 4] [--asks 10] [--framework mpi]

Starts a cluster of N ranks on this host (mpi launcher), runs a cell that sleeps in a function on
every rank, and meanwhile, from another thread (as the sidebar's subshell does), takes the report
`%dist stacks` prints `--asks` times. Prints the median and worst answer times (goal: under 1 s at 4
and at 32 ranks) and the report's first lines. Asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from IPython.testing.globalipapp import start_ipython

import jupyter_dist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--asks", type=int, default=10)
    ap.add_argument("--framework", default="mpi")
    args = ap.parse_args()
    ip = start_ipython()
    jupyter_dist.load_ipython_extension(ip)
    session = jupyter_dist.get_session()
    flags = f"-f {args.framework} -N 1 -n {args.ranks}"
    t0 = time.monotonic()
    ip.run_cell_magic("distrun", flags, "x = 1")
    print(f"{args.ranks} ranks up in {time.monotonic() - t0:.1f} s", flush=True)
    control = session.control()
    times: list[float] = []
    texts: list[str] = []
    sleep_s = 4 + args.asks * 0.5 + args.ranks * 0.1

    def ask() -> None:
        time.sleep(2.0)
        for _ in range(args.asks):
            t = time.monotonic()
            texts.append(control.stacks())
            times.append(time.monotonic() - t)
            time.sleep(0.2)

    asker = threading.Thread(target=ask)
    asker.start()
    ip.run_cell_magic("distrun", f"{flags} --ranks 0", f"import time\ndef waiting():\n    time.sleep({sleep_s:.0f})\nwaiting()")
    asker.join()
    last = texts[-1].splitlines()
    print(f"%dist stacks at {args.ranks} ranks while a cell ran: median {statistics.median(times) * 1000:.0f} ms, "
          f"worst {max(times) * 1000:.0f} ms over {len(times)} asks")
    print("\n".join(last[:3]))
    session.shutdown()


if __name__ == "__main__":
    main()
