"""allreduce_bench across real gloo processes on this host (no ipyparallel, no MPI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jupyter_dist.common.ports import free_ports

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch.distributed as dist
    from jupyter_dist.engine.probes import allreduce_bench, local_copy_bandwidth

    mode, out = sys.argv[1], sys.argv[2]
    kw = json.loads(sys.argv[3])
    if mode == "preinit":
        dist.init_process_group("gloo", init_method="env://")
    t = time.perf_counter()
    rows = allreduce_bench(**kw)
    seconds = time.perf_counter() - t
    result = {"rows": rows, "seconds": seconds, "initialized_after": dist.is_initialized()}
    if mode == "preinit":
        result["copy_gbps"] = local_copy_bandwidth(1 << 20)
        dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(result, f)
    """
)


def run_ranks(tmp_path: Path, world: int, mode: str, **kw) -> list[dict]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = free_ports(1)[0]  # below the ephemeral range: no outgoing socket takes it first
    procs = []
    for rank in range(world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE=str(world),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            JUPYTER_DIST_BACKEND="gloo",
            PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        )
        out = tmp_path / f"rank{rank}.json"
        cmd = [sys.executable, str(script), mode, str(out), json.dumps(kw)]
        procs.append(
            (subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out)
        )
    results = []
    try:
        for proc, out in procs:
            log, _ = proc.communicate(timeout=110)
            assert proc.returncode == 0, log
            results.append(json.loads(out.read_text()))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    return results


def check_rows(rows: list[dict], world: int, sizes: list[int]) -> None:
    assert [r["size_bytes"] for r in rows] == sizes
    factor = 2 * (world - 1) / world
    for r in rows:
        assert r["count"] == r["size_bytes"] // 4
        assert r["wrong"] == 0
        assert r["time_us"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * factor)


@pytest.mark.timeout(120)
def test_four_ranks_default_sizes_from_env(tmp_path):
    """The `%dist bench allreduce` configuration: default sizes, group made from env:// and dropped."""
    from jupyter_dist.engine.probes import DEFAULT_SIZES

    results = run_ranks(tmp_path, 4, "env")
    rows0 = results[0]["rows"]
    check_rows(rows0, 4, list(DEFAULT_SIZES))
    for res in results:
        assert res["rows"] == rows0  # max over ranks: every rank returns the same table
        assert res["initialized_after"] is False  # the bench destroyed the group it made
    print(f"\n4 gloo ranks, default sizes: {max(r['seconds'] for r in results):.1f} s")


@pytest.mark.timeout(120)
def test_two_ranks_existing_group_kept(tmp_path):
    sizes = [8, 4096, 1 << 20]
    results = run_ranks(tmp_path, 2, "preinit", sizes=sizes, iters=2, warmup=1)
    for res in results:
        check_rows(res["rows"], 2, sizes)
        assert res["initialized_after"] is True  # a group the caller made stays
        assert res["copy_gbps"] > 0
    assert results[0]["rows"] == results[1]["rows"]


@pytest.mark.timeout(120)
def test_gpu_nccl_check_script_without_gpu(tmp_path):
    """benchmarks/gpu_nccl_check.py: with no GPU it exits 0; --cpu-ranks runs its rank path over gloo."""
    import torch

    if torch.cuda.device_count() > 0:
        pytest.skip("this host has CUDA GPUs: run the script itself")
    script = str(REPO / "benchmarks" / "gpu_nccl_check.py")
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    env.pop("OUT", None)
    res = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no CUDA GPU found" in res.stdout and "CUDA initialised by it: False" in res.stdout
    args = ["--cpu-ranks", "2", "--iters", "1", "--warmup", "0", "--max-size", "4096", "--out", str(tmp_path)]
    res = subprocess.run(
        [sys.executable, script, *args], env=env, capture_output=True, text=True, timeout=100
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all_reduce check: 2 ranks, expected 3: 0 wrong elements" in res.stdout
    assert res.stdout.rstrip().endswith("OK")
    data = json.loads((tmp_path / "gpu_nccl_check.json").read_text())
    assert data["backend"] == "gloo" and [r["size_bytes"] for r in data["rows"]] == [8, 32, 128, 512, 2048]
    assert (tmp_path / "gpu_nccl_check.png").read_bytes()[:4] == b"\x89PNG"
