"""What `steadfast train` wrote, in a torch.nn module as it is: `steadfast.torch.load(...,
layout="torch")` and `steadfast ckpt export --layout torch` give the MLP's weights under
torch's names and layouts, and the module scores what the trainer scored."""
import gzip
import re
import subprocess

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import steadfast.torch as st


class Mlp(torch.nn.Module):
    """Steadfast's MLP (784-256-128-10, ReLU) with its layer names."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = torch.nn.Linear(784, 256), torch.nn.Linear(256, 128), torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def held_out(data):
    with gzip.open(data / "t10k-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255
    # The trainer's normalisation (Fashion-MNIST's mean and standard deviation).
    x = (x - np.float32(0.2860)) / np.float32(0.3530)
    with gzip.open(data / "t10k-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


@pytest.fixture(scope="module")
def trained(cli, fashion_mnist, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    run = subprocess.run([cli, "train", "--model", "mlp", "--data", "fashion-mnist", "--steps", "60", "--batch", "128",
                          "--eval-every", "0", "--checkpoint-dir", str(tmp / "ckpt"), "--checkpoint-every", "60",
                          "--out", str(tmp / "run")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)%", run.stdout).group(1))
    return tmp / "ckpt", accuracy


def test_a_trained_mlp_loads_into_a_torch_module_and_scores_the_same(trained, fashion_mnist):
    root, accuracy = trained
    state = st.load(root, layout="torch")
    assert list(state) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
    assert state["fc1.weight"].shape == (256, 784)
    model = Mlp()
    model.load_state_dict(state)           # strict: every name and shape fits
    x, y = held_out(fashion_mnist)
    with torch.no_grad():
        ours = (model(x).argmax(1) == y).double().mean().item() * 100
    # The trainer's sums round differently from torch's: at most a few of the 10,000
    # predictions may change, never the model.
    assert abs(ours - accuracy) <= 0.05, (ours, accuracy)
    # The registry layout is the transpose.
    raw = st.load(root)
    assert torch.equal(raw["model.fc1.weight"].t(), state["fc1.weight"])
    assert "optim" not in " ".join(state)


def test_the_exported_file_holds_the_same_tensors(trained, cli, tmp_path):
    root, _ = trained
    out = tmp_path / "mlp.safetensors"
    run = subprocess.run([cli, "ckpt", "export", str(root), "--to", str(out), "--layout", "torch"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    exported = load_file(str(out))
    loaded = st.load(root, layout="torch")
    assert exported.keys() == loaded.keys()
    assert all(torch.equal(exported[k], loaded[k]) for k in loaded)
    Mlp().load_state_dict(exported)


def test_a_torch_layout_of_a_checkpoint_saved_from_python_is_refused(cli, tmp_path):
    st.save({"model": Mlp().state_dict()}, tmp_path / "ckpt", step=0)
    with pytest.raises(st.CheckpointError, match="already in that framework's layout"):
        st.load(tmp_path / "ckpt", layout="torch")
    run = subprocess.run([cli, "ckpt", "export", str(tmp_path / "ckpt"), "--to", str(tmp_path / "o.safetensors"),
                          "--layout", "torch"], capture_output=True, text=True)
    assert run.returncode == 2 and "already in that framework's layout" in run.stderr, run.stderr


def test_a_torch_layout_of_a_foreign_file_is_refused(cli, tmp_path):
    torch.save({"w": torch.zeros(2, 2)}, tmp_path / "m.pt")
    run = subprocess.run([cli, "ckpt", "export", str(tmp_path / "m.pt"), "--to", str(tmp_path / "o.safetensors"),
                          "--layout", "torch"], capture_output=True, text=True)
    assert run.returncode == 2 and "--layout torch" in run.stderr, run.stderr
    assert not (tmp_path / "o.safetensors").exists()
