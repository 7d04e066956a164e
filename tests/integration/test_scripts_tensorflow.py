"""A Keras multi-worker training script run twice in warm engines with equal results (-f tensorflow,
1 node x 2 ranks, engines of its own: see test_scripts_frameworks.py). Written in the style of the
multi-worker tutorial (no upstream code): its backup folder is in the temporary folder, which each run
has anew (engine.script_reset), so the second run restores nothing of the first."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest
from script_runs import twice

import jupyter_dist

pytestmark = [pytest.mark.engines, pytest.mark.timeout(300)]

TENSORFLOW = textwrap.dedent(
    """
    import argparse
    import json
    import os
    import tempfile

    import numpy as np
    import tensorflow as tf

    parser = argparse.ArgumentParser(description="Keras multi-worker toy regression")
    parser.add_argument("--out", required=True, help="prefix of each rank's result file")
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    tf.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(16).with_options(options)
    # as the multi-worker tutorial does: a backup in a temporary folder, restored if the job restarts
    backup = tf.keras.callbacks.BackupAndRestore(backup_dir=os.path.join(tempfile.gettempdir(), "backup"))
    history = model.fit(data, epochs=2, verbose=0, callbacks=[backup])
    with open(f"{args.out}_{task['index']}.json", "w") as f:
        json.dump({"index": task["index"], "epochs": len(history.history["loss"]),
                   "weights": [w.numpy().flatten().tolist() for w in model.weights]}, f)
    """
)



@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    d = tmp_path_factory.mktemp("tf_scripts")
    (d / "keras_mw.py").write_text(TENSORFLOW)
    return d


HOROVOD = "import horovod.torch as hvd\nhvd.init()\nprint('horovod rank', hvd.rank(), flush=True)\nhvd.shutdown()\n"


def test_tensorflow_twice(distrun, scripts):
    """After a -f horovod run on the same engines (its rendezvous on rank 0 held TensorFlow's first task
    port until a TF_CONFIG script stopped it), then twice."""
    pytest.importorskip("tensorflow")
    if importlib.util.find_spec("horovod") is not None:
        (scripts / "hvd_hello.py").write_text(HOROVOD)
        out = distrun(f"-f horovod -N 1 -n 2 --timeout 120 {scripts / 'hvd_hello.py'}")
        assert "horovod rank 1" in out.out
        pids = {e.pid for e in jupyter_dist.get_session().cluster.engines}
        # a cell, not a script, after Horovod: the tensorflow hook frees the rendezvous's port
        out = distrun("-f tensorflow --env TF_USE_LEGACY_KERAS=1 -N 1 -n 2 --timeout 120", CELL)
        assert out.out.count("replicas 2 sum 3.0") == 2, out.out
    first, second = twice(distrun, scripts, "-f tensorflow --env TF_USE_LEGACY_KERAS=1", "keras_mw.py", "tf")
    assert first == second and first[0]["weights"] == first[1]["weights"]
    assert [r["epochs"] for r in first] == [2, 2]  # the second run restored no backup of the first
    if importlib.util.find_spec("horovod") is not None:
        print("engines kept from the horovod run:", pids == {e.pid for e in jupyter_dist.get_session().cluster.engines})
        # Horovod after TensorFlow on the same engines: TensorFlow's server keeps the port; one clear line
        with pytest.raises(Exception, match="held by this engine's TensorFlow server"):
            distrun(f"-f horovod -N 1 -n 2 --timeout 120 {scripts / 'hvd_hello.py'}")


CELL = """
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(strategy.cluster_resolver.task_id + 1))), axis=None)
print("replicas", strategy.num_replicas_in_sync, "sum", float(total))
"""
