"""The study's workload, shared by the driver and every framework's side (NumPy is
imported only where needed, so that the driver's Steadfast side runs without it): Fashion-MNIST read with NumPy
as Steadfast reads it, the initial weights and data order exported by Steadfast
(`steadfast bench init` / `bench order`), and the command-line flags every side takes.

Weights travel under Steadfast's names and layouts (`model.fc1.weight` is [in, out], a
convolution's weight is [out, in, kh, kw]); each side converts to its own layout and back.
"""
import argparse, functools, json, math, os, sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import fashion_mnist  # noqa: E402

BATCH = 128
TRAIN_EXAMPLES = 60000  # Fashion-MNIST's training set
DATA_DIR = "/usr/share/datasets/fashion-mnist"


def load_images(dir_=DATA_DIR):
    """The training images and labels (bench/common.py)."""
    return fashion_mnist(dir_, "train")


def read_tensors(path):
    """A safetensors file as {name: array}."""
    from safetensors.numpy import load_file
    return load_file(path)


def write_tensors(path, tensors):
    from safetensors.numpy import save_file
    import numpy as np
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, path)


def steadfast_batches(order_file, start_step):
    """Batch indices in Steadfast's order from global step `start_step` on."""
    order = read_tensors(order_file)["order"]
    per_epoch = order.shape[1] // BATCH
    step = start_step
    while True:
        epoch, i = divmod(step, per_epoch)
        if epoch >= order.shape[0]:
            raise SystemExit(f"{order_file} holds {order.shape[0]} epochs; step {step} needs more")
        yield order[epoch, i * BATCH:(i + 1) * BATCH].astype("int64")
        step += 1


def arguments(savers):
    """The flags every side's commands take."""
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["cost", "run", "contents", "integrity", "export", "scale"])
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--saver", choices=savers, default=savers[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dir")
    ap.add_argument("--save-at", type=int, default=-1)
    ap.add_argument("--resume")
    ap.add_argument("--init", help="start from these weights (`steadfast bench init`)")
    ap.add_argument("--order", help="train on this data order (`steadfast bench order`) instead of the framework's own")
    ap.add_argument("--dump", help="write the final weights here, under Steadfast's names and layouts")
    ap.add_argument("--with-rng", action="store_true", help="PyTorch: also save the epoch's generator state")
    ap.add_argument("--profile", action="store_true", help="cost: profile the saves (slower; for the findings)")
    ap.add_argument("--data-dir", default=DATA_DIR)
    return ap


class Profiler:
    """Profiles the code run inside `with profiler:` blocks (the saves) with cProfile;
    `top` names the functions that took the most time of their own."""

    def __init__(self, on):
        import cProfile
        self.profile = cProfile.Profile() if on else None

    def __enter__(self):
        if self.profile:
            self.profile.enable()

    def __exit__(self, *exc):
        if self.profile:
            self.profile.disable()

    def top(self, n=5):
        if not self.profile:
            return []
        import pstats
        stats = pstats.Stats(self.profile).stats
        total = sum(own for _, _, own, _, _ in stats.values())
        rows = sorted(((own, f"{os.path.basename(f)}:{name}" if f != "~" else name)
                       for (f, _, name), (_, _, own, _, _) in stats.items()), reverse=True)[:n]
        return [{"function": label, "share": own / total} for own, label in rows]


@functools.cache
def _scale_permutation():
    import numpy as np
    return np.random.default_rng(0).permutation(TRAIN_EXAMPLES)


def rank_slice(step, rank, world):
    """Scale runs: this rank's share of the global batch of step `step` (one permutation
    of the training set, the same on every rank, split evenly over the ranks)."""
    per_epoch, per_rank = TRAIN_EXAMPLES // BATCH, BATCH // world
    start = (step % per_epoch) * BATCH + rank * per_rank
    return _scale_permutation()[start:start + per_rank]


def scale_result(a, rank, seconds, saves, paths, weights_sha256):
    """What each rank of a scale run reports: the training loop's seconds (between two
    barriers), each save's seconds, the SHA-256 of its final weights, and (rank 0) the
    files and bytes of the checkpoint, which may span several paths (a directory, files
    sharing a prefix). Written to `<dir>/rank-<rank>.json` (ranks share an output stream
    under mpiexec) and returned."""
    out = {"rank": rank, "seconds": seconds, "save_seconds": saves, "weights_sha256": weights_sha256}
    if rank == 0 and saves:
        out["bytes"] = sum(size_on_disk(p) for p in paths)
        out["files"] = sum(len(list(files_of(p))) for p in paths)
    with open(os.path.join(a.dir, f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
    return out


def files_of(path):
    if os.path.isdir(path):
        return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    if os.path.exists(path):
        return [path]
    d, base = os.path.split(path)
    return [os.path.join(d, f) for f in os.listdir(d) if f.startswith(base)]


def state_bytes(weights):
    """Bytes of state: the weights and AdamW's two slots per weight."""
    return 3 * sum(math.prod(w.shape) * 4 for w in weights)


def size_on_disk(path):
    """Bytes of a checkpoint: a file, a directory, or the files sharing a prefix (as
    `tf.train.Checkpoint` writes them)."""
    return sum(os.path.getsize(f) for f in files_of(path))


def load_outcome(reload, want):
    """What loading a damaged checkpoint did: `reload()` (which loads it into a fresh model
    and optimizer and returns their hash) raised, or gave back the saved state (`want`),
    or changed the state silently."""
    try:
        got = reload()
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - DCP raises a BaseException; the study records it
        first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
        return f"refused: {type(e).__name__}: {first}"
    return "loaded, state intact" if got == want else "loaded silently, state changed"


def emit(result):
    print(json.dumps(result))
