"""What the panel and the sidebar accept for each run default: the registry's frameworks, validate's checks."""

from __future__ import annotations

import re

import pytest
from plugin_framework import plugin_registered

from jupyter_dist import frameworks
from jupyter_dist.plan.validate import InvalidValue
from jupyter_dist.views.controls import check_defaults, framework_choices


def test_framework_choices_are_the_registry_with_titles():
    choices = framework_choices()
    assert [name for name, _ in choices] == list(frameworks.registry())
    assert dict(choices)["pytorch"] == "PyTorch DDP" and choices[0][0] == "pytorch"


def test_a_framework_added_through_the_entry_point_can_be_chosen(monkeypatch):
    with pytest.raises(InvalidValue, match="framework must be one of"):
        check_defaults({"framework": "rpc"})
    with plugin_registered(monkeypatch):
        assert ("rpc", "PyTorch RPC") in framework_choices()
        assert check_defaults({"framework": "rpc"}) == {"framework": "rpc"}
    with pytest.raises(InvalidValue):
        check_defaults({"framework": "rpc"})


def test_values_are_cleaned_by_the_flags_checks():
    clean = check_defaults({"nodes": 2, "procs_per_node": None, "launcher": None, "timeout": 30,
                            "hosts": [" n1", "10.0.0.2"], "backend": "gloo", "ib": "off"})
    assert clean == {"nodes": 2, "procs_per_node": None, "launcher": None, "timeout": 30.0,
                     "hosts": ("n1", "10.0.0.2"), "backend": "gloo", "ib": "off"}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nodes": 0}, "nodes must be a whole number from 1 to 4096, not 0"),
        ({"nodes": None}, "nodes must be a whole number"),
        ({"procs_per_node": 1025}, "procs_per_node must be a whole number from 1 to 1024"),
        ({"backend": None}, "backend must be one of auto, nccl, gloo, mpi, not None"),
        ({"hosts": ["a b"]}, "hosts: 'a b' is not a valid host name or address"),
        ({"timeout": -1}, "timeout must be a positive number of seconds, not -1"),
        ({"color": "red"}, "defaults: unknown field(s) 'color'"),
    ],
)
def test_bad_values_name_their_field(changes, message):
    with pytest.raises(InvalidValue, match=re.escape(message)):
        check_defaults(changes)
