"""`--backend` as the default backend of a cell's own `init_process_group()` (engine/torch_hooks.py)."""

from __future__ import annotations

import pytest

from jupyter_dist.engine.torch_hooks import with_default_backend


@pytest.mark.parametrize(
    ("chosen", "args", "kwargs", "expect_args", "expect_kwargs"),
    [
        ("gloo", (), {"init_method": "env://"}, (), {"init_method": "env://", "backend": "gloo"}),
        ("nccl", (), {}, (), {"backend": "nccl"}),
        ("gloo", ("nccl",), {}, ("nccl",), {}),  # a backend the cell names wins
        ("gloo", (), {"backend": "mpi"}, (), {"backend": "mpi"}),
        ("auto", (), {}, (), {}),  # not resolved: torch's own default
        ("", (), {}, (), {}),  # not a run of ours
    ],
)
def test_the_chosen_backend_is_the_default(monkeypatch, chosen, args, kwargs, expect_args, expect_kwargs):
    monkeypatch.setenv("JUPYTER_DIST_BACKEND", chosen)
    assert with_default_backend(args, kwargs) == (expect_args, expect_kwargs)
