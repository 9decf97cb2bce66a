"""Shared fixtures: the `steadfast` binary (for the CLI's view of what Python wrote) and
Fashion-MNIST (the study's MLP workload)."""
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def steadfast_bin():
    env = os.environ.get("STEADFAST_BIN")
    if env:
        return env
    built = ROOT / "target" / "release" / "steadfast"
    return str(built) if built.exists() else shutil.which("steadfast")


@pytest.fixture(scope="session")
def cli():
    path = steadfast_bin()
    if path is None:
        pytest.fail("no steadfast binary: build it (cargo build --release) or set STEADFAST_BIN")
    return path


DATA = pathlib.Path(os.environ.get("STEADFAST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="session")
def fashion_mnist():
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        pytest.fail(f"Fashion-MNIST is missing from {DATA} (scripts/install-deps.sh tests installs it)")
    return DATA
