"""Shared fixtures: the `steadfast` binary (for the CLI's view of what Python wrote) and
Fashion-MNIST (the study's MLP workload).

A test that needs one of them is skipped, with the reason and how to get it, when it is
missing: a user's `pip install "./python[test]"` and `pytest python/tests` run green or
clearly skipped. STEADFAST_REQUIRE_BINARY=1 and STEADFAST_REQUIRE_DATA=1 make a missing one
a failure instead (scripts/python-tests.sh sets both: CI never skips silently)."""
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


def missing(what, variable):
    """Skips the test for lack of ``what``, or fails it when ``variable`` is set to 1."""
    if os.environ.get(variable) == "1":
        pytest.fail(f"{what} ({variable}=1 requires it)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def cli():
    env = os.environ.get("STEADFAST_BIN")
    if env and not os.access(env, os.X_OK):
        pytest.fail(f"STEADFAST_BIN={env} is not an executable file")
    path = steadfast_bin()
    if path is None:
        missing(f"no steadfast binary: build it with `cargo build --release` from the repository root ({ROOT}), "
                "or set STEADFAST_BIN to one", "STEADFAST_REQUIRE_BINARY")
    return path


DATA = pathlib.Path(os.environ.get("STEADFAST_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))


@pytest.fixture(scope="session")
def fashion_mnist():
    if not (DATA / "train-images-idx3-ubyte.gz").exists():
        missing(f"Fashion-MNIST is missing from {DATA}: install it with `scripts/install-deps.sh tests`, or set "
                "STEADFAST_FASHION_MNIST to a directory holding train-images-idx3-ubyte.gz", "STEADFAST_REQUIRE_DATA")
    return DATA
