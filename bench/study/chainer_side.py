"""Chainer side of the checkpoint/restart study (bench/study/study.py runs it in its own
virtual environment).

The MLP (784-W-W/2-10, ReLU) or LeNet-5 on Fashion-MNIST, batch 128, AdamW, trained by a
Chainer `Trainer` (a `StandardUpdater` over a `SerialIterator`) and checkpointed the way
Chainer's users do: the trainer (model, optimizer, updater, iterator) serialized with

  npz   `chainer.serializers.save_npz(path, trainer)`, what `extensions.snapshot()` writes;
  hdf5  `chainer.serializers.save_hdf5(path, trainer)`.

`scale` runs one rank of a ChainerMN job (started by `mpiexec`): a multi-node optimizer
that all-reduces the gradients, and ChainerMN's multi-node checkpointer, which every rank
runs to write its own snapshot of the trainer.

The data order is Chainer's own (`SerialIterator(shuffle=True)`, which draws each epoch's
permutation from NumPy's global generator, seeded at start) or, with `--order`,
Steadfast's. Commands and flags as the other sides (workload.py); each prints one JSON
object.
"""
import hashlib, os, sys, tempfile, time

import workload

a = workload.arguments(["npz", "hdf5"]).parse_args()
# NumPy's BLAS reads its thread count when it is loaded.
os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = str(
    1 if a.command in ("contents", "integrity", "export") else a.threads)

import numpy as np  # noqa: E402
import chainer  # noqa: E402
import chainer.functions as F  # noqa: E402
import chainer.links as L  # noqa: E402
from chainer import training  # noqa: E402

from damage import KINDS, damaged_copy  # noqa: E402


class Mlp(chainer.Chain):
    def __init__(self, width):
        super().__init__()
        with self.init_scope():
            self.fc1, self.fc2, self.fc3 = L.Linear(784, width), L.Linear(width, width // 2), L.Linear(width // 2, 10)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class LeNet(chainer.Chain):
    def __init__(self):
        super().__init__()
        with self.init_scope():
            self.conv1, self.conv2 = L.Convolution2D(1, 6, 5, pad=2), L.Convolution2D(6, 16, 5)
            self.fc1, self.fc2, self.fc3 = L.Linear(400, 120), L.Linear(120, 84), L.Linear(84, 10)

    def forward(self, x):
        x = F.max_pooling_2d(F.relu(self.conv1(x.reshape(-1, 1, 28, 28))), 2)
        x = F.max_pooling_2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.reshape(len(x), 400))))))


def named_params(model):
    """(Steadfast name, parameter): Chainer's `W` and `b` are `weight` and `bias`."""
    return [("model" + p.replace("/", ".").replace(".W", ".weight").replace(".b", ".bias"), v)
            for p, v in sorted(model.namedparams())]


# Steadfast keeps a linear layer's weight as [in, out]; Chainer as [out, in].
def flip(w):
    return w.T if w.ndim == 2 else w


class Order(chainer.dataset.iterator.Iterator):
    """Steadfast's order as a Chainer iterator (used with `--order`; not checkpointed)."""

    def __init__(self, dataset, order_file):
        self.dataset, self.batches = dataset, workload.steadfast_batches(order_file, 0)
        self.epoch, self.is_new_epoch = 0, False

    def __next__(self):
        return [self.dataset[int(i)] for i in next(self.batches)]


def setup(a, steps=0):
    """Model, optimizer and a trainer that stops after `steps` iterations in all."""
    np.random.seed(0)
    model = Mlp(a.width) if a.model == "mlp" else LeNet()
    if a.init:
        init = workload.read_tensors(a.init)
        for name, p in named_params(model):
            p.array[...] = flip(init[name])
    lr = 1e-3 if a.model == "mlp" else 2e-3
    opt = chainer.optimizers.AdamW(alpha=lr, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay_rate=0.0)
    opt.setup(L.Classifier(model))
    x, y = workload.load_images(a.data_dir)
    train = chainer.datasets.TupleDataset(x, y.astype(np.int32))
    it = Order(train, a.order) if a.order else chainer.iterators.SerialIterator(train, workload.BATCH, shuffle=True)
    updater = training.StandardUpdater(it, opt)
    trainer = training.Trainer(updater, (steps, "iteration"), out=tempfile.gettempdir())
    return model, opt, trainer


def saving(saver, path, trigger, record=None, profiler=None):
    """An extension that serializes the trainer to `path` when `trigger` fires (as
    `extensions.snapshot` does), recording each save's seconds in `record`."""
    @training.make_extension(trigger=trigger, priority=training.PRIORITY_WRITER)
    def snapshot(trainer):
        t = time.perf_counter()
        with profiler or workload.Profiler(False):
            save(saver, trainer, path)
        if record is not None:
            record.append(time.perf_counter() - t)
    return snapshot


def save(saver, trainer, path):
    (chainer.serializers.save_npz if saver == "npz" else chainer.serializers.save_hdf5)(path, trainer)


def load(saver, trainer, path):
    (chainer.serializers.load_npz if saver == "npz" else chainer.serializers.load_hdf5)(path, trainer)


def weights_hash(model, opt=None):
    h = hashlib.sha256()
    for _, p in named_params(model):
        h.update(p.array.tobytes())
    if opt is not None:
        for _, p in sorted(opt.target.namedparams()):
            for k in sorted(p.update_rule.state or {}):
                h.update(p.update_rule.state[k].tobytes())
    return h.hexdigest()[:16]


def cost(a):
    model, opt, trainer = setup(a, a.steps)
    path = os.path.join(a.dir, "snapshot." + a.saver)
    saves, profiler = [], workload.Profiler(a.profile)
    trainer.extend(saving(a.saver, path, (a.every, "iteration"), saves, profiler))
    t = time.perf_counter()
    trainer.run()
    total = time.perf_counter() - t
    loaded = None
    if saves:
        _, _, fresh = setup(a)
        t = time.perf_counter()
        load(a.saver, fresh, path)
        loaded = time.perf_counter() - t
    return {"step_seconds": [total - sum(saves)], "save_seconds": saves, "load_seconds": loaded,
            "bytes": workload.size_on_disk(path) if saves else 0,
            "state_bytes": workload.state_bytes([p.array for _, p in named_params(model)]),
            "version": chainer.__version__, "profile": profiler.top()}


def run(a):
    model, opt, trainer = setup(a, a.steps)
    if a.resume:
        load(a.saver, trainer, a.resume)
    if a.save_at > 0:
        trainer.extend(saving(a.saver, a.dir, training.triggers.ManualScheduleTrigger([a.save_at], "iteration")))
    if a.steps > 0:
        trainer.run()
    if a.dump:
        workload.write_tensors(a.dump, {n: flip(p.array) for n, p in named_params(model)})
    return {"weights_sha256": weights_hash(model)}


def contents(a):
    """What a trainer snapshot holds, read back from the npz."""
    os.makedirs(a.dir, exist_ok=True)
    _, _, trainer = setup(a, 1)
    path = os.path.join(a.dir, "snapshot.npz")
    trainer.extend(saving("npz", path, (1, "iteration")))
    trainer.run()
    names = list(np.load(path).keys())
    text = " ".join(names).lower()
    return {"weights": any(n.endswith("/W") for n in names),
            "optimizer state": any(n.endswith("/m") or n.endswith("/v") for n in names),
            "RNG": "random" in text or "rng" in text,
            "data position": "current_position" in text,
            "step": "iteration" in text}


def integrity(a):
    os.makedirs(a.dir, exist_ok=True)
    model, opt, trainer = setup(a, 3)
    clean = os.path.join(a.dir, "clean." + a.saver)
    trainer.extend(saving(a.saver, clean, (3, "iteration")))
    trainer.run()
    want = weights_hash(model, opt)
    out = {}
    for damage in KINDS:
        bad = os.path.join(a.dir, damage.replace(" ", "-") + "." + a.saver)
        damaged_copy(clean, bad, damage)

        def reload():
            m2, o2, t2 = setup(a)
            load(a.saver, t2, bad)
            return weights_hash(m2, o2)
        out[damage] = workload.load_outcome(reload, want)
    return out


def export(a):
    """After 3 steps, saves with each saver into `--dir` and writes the weights beside them."""
    os.makedirs(a.dir, exist_ok=True)
    model, _, trainer = setup(a, 3)
    for saver in ("npz", "hdf5"):
        trainer.extend(saving(saver, os.path.join(a.dir, "snapshot." + saver), (3, "iteration")), name=saver)
    trainer.run()
    weights = os.path.join(a.dir, "weights.safetensors")
    workload.write_tensors(weights, {n: flip(p.array) for n, p in named_params(model)})
    return {saver: {"path": os.path.join(a.dir, "snapshot." + saver), "weights": weights} for saver in ("npz", "hdf5")}


class RankSlices(chainer.dataset.iterator.Iterator):
    """This rank's share of each global batch (workload.rank_slice)."""

    def __init__(self, dataset, rank, world):
        self.dataset, self.rank, self.world, self.step = dataset, rank, world, 0
        self.epoch, self.is_new_epoch = 0, False

    def __next__(self):
        self.step += 1
        return [self.dataset[int(i)] for i in workload.rank_slice(self.step, self.rank, self.world)]


def scale(a):
    import chainermn
    comm = chainermn.create_communicator("naive")
    np.random.seed(0)
    model = Mlp(a.width) if a.model == "mlp" else LeNet()
    classifier = L.Classifier(model)
    comm.bcast_data(classifier)
    opt = chainermn.create_multi_node_optimizer(
        chainer.optimizers.AdamW(alpha=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay_rate=0.0), comm)
    opt.setup(classifier)
    x, y = workload.load_images(a.data_dir)
    it = RankSlices(chainer.datasets.TupleDataset(x, y.astype(np.int32)), comm.rank, comm.size)
    trainer = training.Trainer(training.StandardUpdater(it, opt), (a.steps, "iteration"), out=a.dir)
    checkpointer = chainermn.create_multi_node_checkpointer("study", comm, cp_interval=a.every, gc_interval=a.every)
    saves = []

    @training.make_extension(trigger=(a.every, "iteration"), priority=training.PRIORITY_WRITER)
    def timed(trainer):
        t = time.perf_counter()
        checkpointer(trainer)
        saves.append(time.perf_counter() - t)

    trainer.extend(timed)
    comm.mpi_comm.Barrier()
    t = time.perf_counter()
    trainer.run()
    comm.mpi_comm.Barrier()
    seconds = time.perf_counter() - t
    # The checkpointer writes `<name>.<rank>.<iteration>` in the trainer's directory (and
    # collects older ones only every few saves); the checkpoint is the last iteration's files.
    last = a.steps - a.steps % a.every
    files = [os.path.join(a.dir, f) for f in sorted(os.listdir(a.dir)) if f.startswith("study.") and f.endswith(f".{last}")]
    return workload.scale_result(a, comm.rank, seconds, saves, files, weights_hash(model))


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    workload.emit({"cost": cost, "run": run, "contents": contents, "integrity": integrity, "export": export,
                   "scale": scale}[a.command](a))
