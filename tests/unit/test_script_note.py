"""engine.script_note's reasons (pure checks of the engine's own state; the thread case is tested on
real engines in tests/integration/test_scripts.py)."""

from __future__ import annotations

import threading

from jupyter_dist.engine import script_note


def test_a_changed_compiled_extension_is_named():
    reasons = script_note.before_run({"fastops": "/work/proj/fastops.cpython-311-x86_64-linux-gnu.so",
                                      "helper": "/work/proj/helper.py"})
    assert reasons == ["the compiled extension fastops changed, and a process cannot load an extension twice"]


def test_threads_left_running_are_named_once(capsys):
    stop = threading.Event()
    with script_note.noted({}):
        threading.Thread(target=stop.wait, name="feeder").start()
        threading.Thread(target=stop.wait, name="daemonic", daemon=True).start()
    stop.set()
    err = capsys.readouterr().err.splitlines()
    assert err == [script_note.PREFIX + "the script left 1 thread(s) running (feeder), which live on in the engine"
                   + script_note.HINT]


def test_nothing_to_say_for_a_clean_run(capsys):
    with script_note.noted({"helper": "/work/proj/helper.py"}):
        pass
    assert capsys.readouterr().err == ""
