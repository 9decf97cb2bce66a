#!/usr/bin/env bash
# Every test, on a fresh machine: install what the tests use when missing (scripts/install-deps.sh
# tests: the data sets, libhdf5, Open MPI, Slurm and munge, etcd, Python's safetensors, NumPy and h5py,
# a headless Chromium, qemu-user), then run the whole suite with those peers required, so that a test that
# needs one fails rather than skips; then the Python package's pytest suite with PyTorch
# (scripts/python-tests.sh). The Rust tests run as `cargo test --release --workspace` would,
# two test binaries at a time (scripts/rust-tests.py); extra arguments go to `cargo test`
# instead (e.g. `scripts/test.sh -p steadfast-ckpt`), and then the Python suite is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh tests

export STEADFAST_REQUIRE_DATA=1
export STEADFAST_REQUIRE_PYTHON=1
export STEADFAST_REQUIRE_BROWSER=1
export STEADFAST_REQUIRE_MPI=1
export STEADFAST_REQUIRE_SLURM=1
export STEADFAST_REQUIRE_ETCD=1
export STEADFAST_REQUIRE_QEMU=1
if [ $# -eq 0 ]; then
  # The Python tests' packages download while the Rust tests build and run.
  mkdir -p target
  scripts/python-env.sh > target/python-env.log 2>&1 &
  env_job=$!
fi
if [ $# -eq 0 ]; then
  # `cargo test --release --workspace`, two test binaries at a time (scripts/rust-tests.py).
  python3 scripts/rust-tests.py
else
  cargo test --release --locked --workspace "$@"
fi
if [ $# -eq 0 ]; then
  if ! wait "$env_job"; then
    cat target/python-env.log >&2
    echo "the Python tests' environment could not be installed (above)" >&2
    exit 1
  fi
  echo "== the Python package's tests (at ${SECONDS} s)"
  scripts/python-tests.sh
fi
