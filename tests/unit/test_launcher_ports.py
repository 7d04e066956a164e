"""A rank's release never shuts its connection to the MPI daemon that started it (engine/faults.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest


@pytest.mark.timeout(60)
def test_a_parents_listening_port_is_protected():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        out = subprocess.run([sys.executable, "-c", "from jupyter_dist.engine.faults import launcher_ports\n"
                              "import json; print(json.dumps(sorted(launcher_ports())))"], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert port in json.loads(out.stdout)
