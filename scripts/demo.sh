#!/usr/bin/env bash
# The main job on a fresh machine: install the data sets and libhdf5 if missing, build, train the MLP
# on Fashion-MNIST and print the summary (ending with its fingerprint line).
# Extra arguments go to `steadfast train`.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
[ -d /usr/share/games/fortunes ] || need+=(fortunes)
dpkg -s libhdf5-dev >/dev/null 2>&1 || need+=(libhdf5-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi

cargo build --release --locked
exec ./target/release/steadfast train --model mlp --data fashion-mnist "$@"
