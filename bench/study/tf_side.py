"""TensorFlow/Keras side of the checkpoint/restart study (bench/study/study.py runs it in
its own virtual environment).

The MLP (784-W-W/2-10, ReLU) or LeNet-5 on Fashion-MNIST, batch 128, AdamW, in Keras
with a custom training loop (`tf.function` and `GradientTape`), checkpointed the way
TensorFlow's users do:

  tf.train.Checkpoint  a `tf.train.Checkpoint` of the step, the model, the optimizer and
                       the data iterator, saved by a `CheckpointManager` (TensorFlow's
                       checkpoint guide saves the iterator too);
  keras                `model.save("...keras")`: the model, its compiled optimizer's
                       variables and the configuration, in one ZIP;
  h5                   `model.save("...h5")`: the legacy HDF5 form, weights and optimizer.

`scale` runs one worker of a `MultiWorkerMirroredStrategy` job (TF_CONFIG in the
environment) and checkpoints as TensorFlow's multi-worker guide does: every worker calls
`tf.train.Checkpoint.write`, the chief into the checkpoint's directory and the others into
scratch directories that they remove.

The data order is TensorFlow's own (`Dataset.shuffle` of the whole set, seeded, reshuffled
each epoch) or, with `--order`, Steadfast's. Commands and flags as the other sides
(workload.py); each prints one JSON object.
"""
import hashlib, io, os, shutil, time, zipfile

import workload

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
import h5py  # noqa: E402

from damage import KINDS, damaged_copy  # noqa: E402

SAVERS = ["tf.train.Checkpoint", "keras", "h5"]
# The cost table's extra row: the same checkpoint without the data iterator, to show
# what saving the iterator costs.
NO_ITERATOR = "tf.train.Checkpoint-no-iterator"


def build(a):
    if a.model == "mlp":
        layers = [keras.layers.Dense(a.width, activation="relu", name="fc1"),
                  keras.layers.Dense(a.width // 2, activation="relu", name="fc2"),
                  keras.layers.Dense(10, name="fc3")]
    else:
        layers = [keras.layers.Reshape((28, 28, 1)),
                  keras.layers.Conv2D(6, 5, padding="same", activation="relu", name="conv1"),
                  keras.layers.MaxPooling2D(2),
                  keras.layers.Conv2D(16, 5, activation="relu", name="conv2"),
                  keras.layers.MaxPooling2D(2),
                  keras.layers.Flatten(),
                  keras.layers.Dense(120, activation="relu", name="fc1"),
                  keras.layers.Dense(84, activation="relu", name="fc2"),
                  keras.layers.Dense(10, name="fc3")]
    return keras.Sequential([keras.Input((784,)), *layers])


def to_keras(name, w, model):
    """Steadfast's layout to Keras's: convolutions [out, in, kh, kw] -> [kh, kw, in, out];
    LeNet's first dense layer takes Keras's channels-last flattening (h, w, c) where
    Steadfast's is (c, h, w)."""
    if w.ndim == 4:
        return w.transpose(2, 3, 1, 0)
    if model == "cnn" and name == "model.fc1.weight":
        return w.reshape(16, 5, 5, 120).transpose(1, 2, 0, 3).reshape(400, 120)
    return w


def from_keras(name, w, model):
    if w.ndim == 4:
        return w.transpose(3, 2, 0, 1)
    if model == "cnn" and name == "model.fc1.weight":
        return w.reshape(5, 5, 16, 120).transpose(2, 0, 1, 3).reshape(400, 120)
    return w


def named_weights(model):
    """(Steadfast name, variable) for each weight."""
    out = []
    for layer in model.layers:
        for v, kind in zip(layer.weights, ["weight", "bias"]):
            out.append((f"model.{layer.name}.{kind}", v))
    return out


def setup(a):
    keras.utils.set_random_seed(0)
    model = build(a)
    if a.init:
        init = workload.read_tensors(a.init)
        for name, v in named_weights(model):
            v.assign(to_keras(name, init[name], a.model))
    lr = 1e-3 if a.model == "mlp" else 2e-3
    opt = keras.optimizers.AdamW(learning_rate=lr, weight_decay=0.0, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    opt.build(model.trainable_variables)
    return model, opt


def make_step(model, opt):
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return step


def dataset(n):
    """TensorFlow's own order: the whole set shuffled, seeded, reshuffled each epoch."""
    return (tf.data.Dataset.range(n).shuffle(n, seed=0, reshuffle_each_iteration=True)
            .batch(workload.BATCH, drop_remainder=True).repeat())


def data(a):
    """Images, labels and the batch iterator (TensorFlow's own, checkpointable; or
    Steadfast's order from step 0, for which a resumed run skips ahead)."""
    x, y = workload.load_images(a.data_dir)
    it = iter(dataset(len(y))) if not a.order else None
    return tf.constant(x), tf.constant(y), it


def weights_hash(model, opt=None):
    h = hashlib.sha256()
    for v in model.weights:
        h.update(v.numpy().tobytes())
    for v in (opt.variables if opt else []):
        h.update(v.numpy().tobytes())
    return h.hexdigest()[:16]


def checkpoint(model, opt, step, it):
    """The object `tf.train.Checkpoint` saves: step, model, optimizer and iterator."""
    parts = {"step": step, "model": model, "optimizer": opt}
    if it is not None:
        parts["iterator"] = it
    return tf.train.Checkpoint(**parts)


def save(saver, model, opt, step, it, path):
    if saver == NO_ITERATOR:
        saver, it = SAVERS[0], None
    if saver == "tf.train.Checkpoint":
        ckpt = checkpoint(model, opt, tf.Variable(step, dtype=tf.int64), it)
        return ckpt.write(os.path.join(path, "ckpt"))
    model.save(path)


def load(saver, a, path, it):
    """Returns (model, optimizer, step) loaded from `path`."""
    if saver == NO_ITERATOR:
        saver, it = SAVERS[0], None
    if saver == "tf.train.Checkpoint":
        model, opt = setup(a)
        step = tf.Variable(0, dtype=tf.int64)
        checkpoint(model, opt, step, it).read(os.path.join(path, "ckpt")).assert_consumed()
        return model, opt, int(step.numpy())
    model = keras.models.load_model(path)
    return model, model.optimizer, int(model.optimizer.iterations.numpy())


def path_for(saver, d):
    return {"tf.train.Checkpoint": os.path.join(d, "tfckpt"), NO_ITERATOR: os.path.join(d, "tfckpt"), "keras": os.path.join(d, "ckpt.keras"),
            "h5": os.path.join(d, "ckpt.h5")}[saver]


def batch_source(a, it, start):
    if a.order:
        return (tf.constant(i) for i in workload.steadfast_batches(a.order, start))
    return it


def cost(a):
    model, opt = setup(a)
    x, y, it = data(a)
    step_fn = make_step(model, opt)
    order = batch_source(a, it, 0)
    path = path_for(a.saver, a.dir)
    steps, saves, profiler = [], [], workload.Profiler(a.profile)
    for step in range(1, a.steps + 1):
        t = time.perf_counter()
        idx = next(order)
        step_fn(tf.gather(x, idx), tf.gather(y, idx)).numpy()
        steps.append(time.perf_counter() - t)
        if step % a.every == 0:
            shutil.rmtree(path, ignore_errors=True)
            t = time.perf_counter()
            with profiler:
                save(a.saver, model, opt, step, it, path)
            saves.append(time.perf_counter() - t)
    loaded = None
    if saves:
        t = time.perf_counter()
        load(a.saver, a, path, iter(dataset(len(y))) if it is not None else None)
        loaded = time.perf_counter() - t
    return {"step_seconds": steps, "save_seconds": saves, "load_seconds": loaded,
            "bytes": workload.size_on_disk(path) if saves else 0,
            "state_bytes": workload.state_bytes([v.numpy() for v in model.weights]), "version": tf.__version__,
            "profile": profiler.top()}


def run(a):
    x, y, it = data(a)
    start = 0
    if a.resume:
        model, opt, start = load(a.saver, a, a.resume, it)
    else:
        model, opt = setup(a)
    step_fn = make_step(model, opt)
    order = batch_source(a, it, start)
    for step in range(start + 1, a.steps + 1):
        idx = next(order)
        step_fn(tf.gather(x, idx), tf.gather(y, idx))
        if step == a.save_at:
            save(a.saver, model, opt, step, it, a.dir)
    if a.dump:
        workload.write_tensors(a.dump, {n: from_keras(n, v.numpy(), a.model) for n, v in named_weights(model)})
    return {"weights_sha256": weights_hash(model)}


def h5_names(f):
    names = []
    f.visit(names.append)
    return names


def trained(a, steps):
    """Model, optimizer and TensorFlow's data iterator after `steps` steps."""
    os.makedirs(a.dir, exist_ok=True)
    model, opt = setup(a)
    x, y, it = data(a)
    step_fn = make_step(model, opt)
    for _ in range(steps):
        idx = next(it)
        step_fn(tf.gather(x, idx), tf.gather(y, idx))
    return model, opt, it


def contents(a):
    """What each saver's files hold, read back."""
    model, opt, it = trained(a, 1)
    out = {}
    for saver in SAVERS:
        path = path_for(saver, a.dir)
        save(saver, model, opt, 1, it, path)
        if saver == "tf.train.Checkpoint":
            names = [n for n, _ in tf.train.list_variables(os.path.join(path, "ckpt"))]
        elif saver == "keras":
            with zipfile.ZipFile(path) as z, h5py.File(io.BytesIO(z.read("model.weights.h5"))) as f:
                names = h5_names(f)
        else:
            with h5py.File(path) as f:
                names = h5_names(f)
        text = " ".join(names).lower()
        if saver == "keras":
            # A `.keras` file numbers its variables: `layers/<name>/vars/<i>` and
            # `optimizer/vars/<i>`, where the optimizer's first two are its iteration
            # count and learning rate and the rest its slots.
            slots = [n for n in names if n.startswith("optimizer/vars/")]
            out[saver] = {"weights": any(n.startswith("layers/") and "/vars/" in n for n in names),
                          "optimizer state": len(slots) > 2, "RNG": "seed_generator" in text,
                          "data position": False, "step": "optimizer/vars/0" in names}
            continue
        # Keras 3 models are not tracked by `tf.train.Checkpoint` under `model/`: the
        # weights are saved as the optimizer's `_trainable_variables`.
        out[saver] = {"weights": "kernel" in text or "trainable_variables" in text,
                      "optimizer state": any(w in text for w in ("momentum", "velocity", "optimizer/_variables")),
                      "RNG": "rng" in text or "seed_generator" in text,
                      "data position": "iterator" in text,
                      "step": "step" in text or "iteration" in text}
    return out


def integrity(a):
    model, opt, it = trained(a, 3)
    clean = path_for(a.saver, os.path.join(a.dir, "clean"))
    os.makedirs(os.path.dirname(clean), exist_ok=True)
    save(a.saver, model, opt, 3, it, clean)
    want = weights_hash(model, opt)
    out = {}
    for damage in KINDS:
        bad = path_for(a.saver, os.path.join(a.dir, damage.replace(" ", "-")))
        os.makedirs(os.path.dirname(bad), exist_ok=True)
        damaged_copy(clean, bad, damage)

        def reload():
            m2, o2, _ = load(a.saver, a, bad, iter(dataset(workload.TRAIN_EXAMPLES)))
            return weights_hash(m2, o2)
        out[damage] = workload.load_outcome(reload, want)
    return out


def export(a):
    """After 3 steps, saves with each saver into `--dir` and writes the weights beside them."""
    model, opt, it = trained(a, 3)
    weights = os.path.join(a.dir, "weights.safetensors")
    workload.write_tensors(weights, {n: from_keras(n, v.numpy(), a.model) for n, v in named_weights(model)})
    out = {}
    for saver in SAVERS:
        path = path_for(saver, a.dir)
        save(saver, model, opt, 3, it, path)
        out[saver] = {"path": os.path.join(path, "ckpt.data-00000-of-00001") if saver == SAVERS[0] else path,
                      "weights": weights}
    return out


def scale(a):
    import json
    cluster = json.loads(os.environ["TF_CONFIG"])
    rank, world = cluster["task"]["index"], len(cluster["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model, opt = setup(a)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = loss_fn(y, model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=workload.BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        # Under the strategy the optimizer combines the workers' gradients before updating
        # the mirrored variables: the workers train on different examples and still end
        # with the same weights (the driver compares their hashes).
        opt.apply_gradients(zip(grads, model.trainable_variables))

    def barrier():
        return tf.distribute.get_replica_context().all_reduce("sum", tf.ones(()))

    step_fn = tf.function(lambda x, y: strategy.run(replica_step, args=(x, y)))
    sync = tf.function(lambda: strategy.run(barrier))
    x, y = (tf.constant(v) for v in workload.load_images(a.data_dir))
    path = os.path.join(a.dir, "tfckpt")
    target = path if rank == 0 else os.path.join(a.dir, f"scratch-{rank}")
    ckpt = tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), model=model, optimizer=opt)
    saves = []
    sync()
    start = time.perf_counter()
    for step in range(1, a.steps + 1):
        idx = tf.constant(workload.rank_slice(step, rank, world))
        step_fn(tf.gather(x, idx), tf.gather(y, idx))
        if step % a.every == 0:
            t = time.perf_counter()
            ckpt.step.assign(step)
            ckpt.write(os.path.join(target, "ckpt"))
            if rank != 0:
                shutil.rmtree(target, ignore_errors=True)
            saves.append(time.perf_counter() - t)
    sync()
    seconds = time.perf_counter() - start
    return workload.scale_result(a, rank, seconds, saves, [path], weights_hash(model))


def main():
    a = workload.arguments(SAVERS + [NO_ITERATOR]).parse_args()
    # Thread counts can only be set before TensorFlow's first operation.
    tf.config.threading.set_intra_op_parallelism_threads(1 if a.command in ("contents", "integrity", "export") else a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    workload.emit({"cost": cost, "run": run, "contents": contents, "integrity": integrity, "export": export,
                   "scale": scale}[a.command](a))


if __name__ == "__main__":
    main()
