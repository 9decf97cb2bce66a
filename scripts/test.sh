#!/usr/bin/env bash
# Every test, on a fresh machine: install what the tests use (the data sets, libhdf5, Python's
# safetensors, NumPy and h5py, a headless Chromium) when missing, then run the whole suite with
# those peers required, so that a test that needs one fails rather than skips.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p steadfast-ckpt`).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
[ -d /usr/share/games/fortunes ] || need+=(fortunes)
# libhdf5 for `steadfast inject` on .h5 files (the hdf5 feature, on by default).
dpkg -s libhdf5-dev >/dev/null 2>&1 || need+=(libhdf5-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
# A headless browser, in which a test renders `steadfast report`'s page.
command -v chromium >/dev/null || need+=(chromium)
# iproute2 for the multi-host test's network namespaces (it runs when root).
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi
python3 -c 'import safetensors.numpy, numpy, h5py' 2>/dev/null \
  || python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore safetensors numpy h5py

export STEADFAST_REQUIRE_DATA=1
export STEADFAST_REQUIRE_PYTHON=1
export STEADFAST_REQUIRE_BROWSER=1
exec cargo test --release --locked --workspace "$@"
