#!/usr/bin/env bash
# The main job on a fresh machine: install the data sets and libhdf5 if missing, build, train the MLP
# on Fashion-MNIST and print the summary (ending with its fingerprint line).
# Extra arguments go to `steadfast train`.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

cargo build --release --locked
exec ./target/release/steadfast train --model mlp --data fashion-mnist "$@"
