"""A silent-data-corruption campaign on a PyTorch model with ``steadfast.lab``.

The study's MLP (784-256-128-10 with ReLU; ``--model cnn``: LeNet-5) trained by AdamW on
Fashion-MNIST, batch 128. A golden run trains to the last step any trial reaches; each
trial resumes from the golden state at its injection step, flips bits in the parameters,
the gradients, the optimizer's state or the activations (or, with ``--where checkpoint``,
in the golden run's checkpoint file), trains on and is classified against the golden
trajectory. The tables land in ``--out``; then:

    python examples/sdc_campaign.py --trials 1000 --out runs/sdc-torch
    steadfast report runs/sdc-torch                       # the HTML report
    python -m steadfast.lab replay runs/sdc-torch --trials 17   # trial 17, bit for bit

``--data`` (default: ``STEADFAST_FASHION_MNIST``, else Debian's directory) names the
directory holding ``train-images-idx3-ubyte.gz`` and the other three files.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import steadfast.lab as lab

BATCH = 128


def _data_dir():
    return os.environ.get("STEADFAST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist")


def _test_examples():
    return int(os.environ.get("STEADFAST_TEST_EXAMPLES", "2000"))


def _images(name):
    with gzip.open(os.path.join(_data_dir(), f"{name}-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255
    with gzip.open(os.path.join(_data_dir(), f"{name}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(784, 256), torch.nn.Linear(256, 128), torch.nn.Linear(128, 10)
        self.relu1, self.relu2 = torch.nn.ReLU(), torch.nn.ReLU()

    def forward(self, x):
        return self.fc3(self.relu2(self.fc2(self.relu1(self.fc1(x)))))


class LeNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(1, 6, 5, padding=2), torch.nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(400, 120), torch.nn.Linear(120, 84), torch.nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x.view(-1, 1, 28, 28))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def _job(model):
    x, y = _images("train")
    xt, yt = _images("t10k")
    xt, yt = xt[:_test_examples()], yt[:_test_examples()]
    # A fixed permutation: batch(step) is a function of the step alone.
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))

    def batch(step):
        start = step * BATCH % (len(x) - BATCH)
        idx = order[start:start + BATCH]
        return x[idx], y[idx]

    return lab.Job(model=model, optimizer=lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), batch=batch,
                   evaluate=lambda m: lab.accuracy(m, xt, yt), name=model.__name__.lower(), data="fashion-mnist")


def mlp_job():
    return _job(Mlp)


def cnn_job():
    return _job(LeNet)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=_data_dir(), help="Fashion-MNIST's directory")
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--out", required=True, help="directory for the tables (must not hold a campaign yet)")
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--inject-at", default="20,40", help="comma-separated steps a fault may hit")
    ap.add_argument("--steps-after", type=int, default=30)
    ap.add_argument("--state", default="param,grad,optim,activation")
    ap.add_argument("--where", choices=["live", "checkpoint"], default="live")
    ap.add_argument("--bits", default="any", help="sign | exponent | mantissa | any | N | N-M")
    ap.add_argument("--flips", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--response", choices=["observe", "stop", "repair"], default="observe")
    ap.add_argument("--test-examples", type=int, default=_test_examples(), help="held-out images scored per trial")
    ap.add_argument("--workers", type=int, default=None, help="processes [default: one per core]")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.data, "train-images-idx3-ubyte.gz")):
        sys.exit(f"Fashion-MNIST is not in {a.data}: give --data")
    # The worker processes import this file afresh and read these from their environment.
    os.environ["STEADFAST_FASHION_MNIST"] = a.data
    os.environ["STEADFAST_TEST_EXAMPLES"] = str(a.test_examples)

    started = time.perf_counter()

    def progress(done, total):
        if done == total or done % max(1, total // 20) == 0:
            print(f"  {done}/{total} trials, {time.perf_counter() - started:.0f} s", file=sys.stderr)

    try:
        summary = lab.campaign(
            {"mlp": mlp_job, "cnn": cnn_job}[a.model], a.out, trials=a.trials,
            inject_at=[int(s) for s in a.inject_at.split(",")], steps_after=a.steps_after,
            state=a.state.split(","), where=a.where, bits=a.bits, flips=a.flips, seed=a.seed,
            detect={"response": a.response}, workers=a.workers, progress=progress)
    except (lab.LabError, ValueError, OSError) as e:   # OSError: a full disk, a directory not writable
        sys.exit(f"error: {e}")
    print(summary)
    print(f"Tables in {a.out}; the report: steadfast report {a.out}")


if __name__ == "__main__":
    main()
