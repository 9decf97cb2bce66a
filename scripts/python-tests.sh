#!/usr/bin/env bash
# The Python package's tests: a virtual environment under target/ with PyTorch (the wheel
# PyPI serves, used on the CPU), `pip install ./python` (maturin builds the native module
# into the workspace's one target/), then pytest. scripts/test.sh runs this after `cargo
# test`; run it alone after `cargo build --release` (its tests call the `steadfast`
# binary). Extra arguments go to pytest. The binary and Fashion-MNIST are required here: a
# test that lacks one fails instead of skipping (python/tests/conftest.py), so that CI never
# skips silently; a user's plain `pytest python/tests` skips them and says how to get them.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-env
scripts/python-env.sh
export PATH="$PWD/$venv/bin:$PATH"   # the build backend runs `maturin` by name
# No build isolation: maturin comes from the environment, and cargo shares target/.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps ./python
# After `cargo test --release --workspace` the binary is built, and newer than every source:
# building `-p steadfast` alone would build it again with other features for its shared
# dependencies (minutes in CI for nothing).
bin=target/release/steadfast
if [ ! -x "$bin" ] || [ -n "$(find crates python Cargo.toml Cargo.lock -newer "$bin" \( -name '*.rs' -o -name 'Cargo.*' \) -print -quit)" ]; then
  cargo build --release --locked -p steadfast
fi
export STEADFAST_REQUIRE_BINARY=1 STEADFAST_REQUIRE_DATA=1
# The slowest tests are named at the end, so that the suite's time can be kept in check.
STEADFAST_BIN="$PWD/target/release/steadfast" "$venv/bin/python" -m pytest -q --durations=12 python/tests "$@"
