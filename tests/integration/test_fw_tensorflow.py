"""-f tensorflow on real engines (2 nodes x 2 processes): TF_CONFIG, MultiWorkerMirroredStrategy, --ps."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("tensorflow")
pytestmark = [pytest.mark.engines, pytest.mark.timeout(360)]

# TF_USE_LEGACY_KERAS=1 (set before TensorFlow is imported): tf.keras is Keras 2 (tf-keras), whose
# fit supports MultiWorkerMirroredStrategy; Keras 3's does not (see docs/frameworks-notes.md)
FLAGS = "-f tensorflow -N 2 -n 2 --env TF_CPP_MIN_LOG_LEVEL=3 --env TF_USE_LEGACY_KERAS=1"

MWMS = textwrap.dedent(
    """
    import json, os
    import numpy as np
    import tensorflow as tf
    import jupyter_dist

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    with strategy.scope():
        w = tf.Variable(tf.zeros([4, 1]))

    @tf.function
    def step(x):
        def replica(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((tf.matmul(x, w) - tf.reduce_sum(x, 1, keepdims=True)) ** 2)
            grad = tf.distribute.get_replica_context().all_reduce("mean", tape.gradient(loss, w))
            w.assign_sub(0.1 * grad)
            return loss
        return strategy.run(replica, args=(x,))

    rng = np.random.default_rng(task["index"])   # each worker its own data
    for i in range(3):
        loss = step(tf.constant(rng.normal(size=(8, 4)), tf.float32))
        jupyter_dist.report(step=i, samples=8, loss=float(strategy.reduce("MEAN", loss, axis=None)))
    result = dict(task=task, replicas=strategy.num_replicas_in_sync, w=w.numpy())
    print(f"worker {task['index']} of {strategy.num_replicas_in_sync}")
    """
)

KERAS_FIT = textwrap.dedent(
    """
    keras = tf.keras   # Keras 2 (tf-keras) under TF_USE_LEGACY_KERAS=1: its fit supports this strategy
    keras_package = keras.Sequential.__module__.split(".")[0]

    class Report(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            jupyter_dist.report(step=batch, samples=16, loss=logs["loss"])

    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,))])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x = rng.normal(size=(64, 4)).astype("float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).batch(16).with_options(options)
    history = model.fit(data, epochs=2, verbose=0, callbacks=[Report()])
    fitted = dict(package=keras_package, weights=[v.numpy() for v in model.weights], loss=history.history["loss"])
    """
)


def test_tf_config_and_mirrored_training(distrun, shell):
    out = distrun(f"{FLAGS} -o result --timeout 300", MWMS).out
    results = shell.user_ns["result"]
    for r, res in enumerate(results):
        assert res["task"] == {"type": "worker", "index": r}
        assert res["replicas"] == 4
        assert (res["w"] == results[0]["w"]).all()  # all-reduced gradients: replicas agree
        assert f"[rank {r}|node {r // 2}] worker {r} of 4" in out
    assert "run summary: samples/s from report(), 4 rank(s)" in out
    distrun(f"{FLAGS} -o config", "import os, json\nconfig = json.loads(os.environ['TF_CONFIG'])")
    cluster = shell.user_ns["config"][0]["cluster"]["worker"]
    assert len(set(cluster)) == 4 and all(a.startswith("127.0.0.1:") for a in cluster)


def test_rerun_reuses_the_strategy(distrun, shell):
    out = distrun(f"{FLAGS} -o result --timeout 120", MWMS).out
    assert "reusing this rank's MultiWorkerMirroredStrategy" in out
    results = shell.user_ns["result"]
    assert [res["replicas"] for res in results] == [4] * 4
    assert all((res["w"] == results[0]["w"]).all() for res in results)


def test_tf_keras_fit_under_the_strategy(distrun, shell):
    out = distrun(f"{FLAGS} -o fitted --timeout 180", KERAS_FIT).out
    fitted = shell.user_ns["fitted"]
    assert all(f["package"] == "tf_keras" for f in fitted)  # tf.keras is Keras 2
    first = fitted[0]["weights"]
    assert len(first) == 2  # kernel and bias
    assert all(all((a == b).all() for a, b in zip(f["weights"], first, strict=True)) for f in fitted)
    assert all(len(f["loss"]) == 2 for f in fitted)  # two epochs ran
    assert "run summary: samples/s from report(), 4 rank(s)" in out


PS_CELL = textwrap.dedent(
    """
    import json, os
    import tensorflow as tf
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        counter = tf.Variable(0.0)

    @tf.function
    def step():
        counter.assign_add(1.0)
        return counter.read_value()

    for _ in range(6):
        coordinator.schedule(step)
    coordinator.join()
    result = dict(task=resolver.task_type, workers=resolver.cluster_spec().num_tasks("worker"),
                  ps=resolver.cluster_spec().num_tasks("ps"), counter=float(counter.numpy()),
                  on=counter.device)
    print("steps on the workers:", result["counter"])
    """
)


def test_parameter_servers(distrun, shell):
    out = distrun(f"{FLAGS} --ps 1 -o result --timeout 240", PS_CELL).out
    # the engines joined the mirrored cluster above: the session restarts them, saying why
    assert ("this run's TensorFlow cluster (a chief, 2 worker(s) and 1 parameter server(s)) is not the one the "
            "engines joined (4 workers)") in out
    res, *serving = shell.user_ns["result"]
    assert serving == [None, None, None]  # only the chief ran the cell
    assert res["task"] == "chief" and res["workers"] == 2 and res["ps"] == 1
    assert res["counter"] == 6.0 and "/job:ps" in res["on"]
    assert "[rank 0|node 0] steps on the workers: 6.0" in out
    again = distrun(f"{FLAGS} --ps 1 -o result --timeout 240", PS_CELL).out  # the cell re-runs as it is
    assert "restarting the engines" not in again
    assert shell.user_ns["result"][0]["counter"] == 6.0
    distrun(f"{FLAGS} --ps 1 -o config", "import os, json\nconfig = json.loads(os.environ['TF_CONFIG'])")
    config = shell.user_ns["config"][0]
    assert config["task"] == {"type": "chief", "index": 0}
    assert {k: len(v) for k, v in config["cluster"].items()} == {"chief": 1, "worker": 2, "ps": 1}
