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
export STEADFAST_REQUIRE_BINARY=1 STEADFAST_REQUIRE_DATA=1 STEADFAST_BIN="$PWD/target/release/steadfast"
# The slowest tests are named at the end, so that the suite's time can be kept in check.
pytest=("$venv/bin/python" -m pytest -q --durations=12)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" python/tests "$@"
fi
# The whole suite as two pytest processes side by side: the elastic jobs (half the suite's
# time, much of it waiting for a lost worker to be noticed) and the rest. One alone left a
# 2-core machine's cores idle for 40% of the run.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${pytest[@]}" --basetemp="$tmp/elastic" python/tests/test_elastic.py > "$tmp/elastic.log" 2>&1 &
elastic=$!
status=0
"${pytest[@]}" --basetemp="$tmp/rest" --ignore=python/tests/test_elastic.py python/tests || status=$?
wait "$elastic" || status=$?
echo "== the elastic jobs (python/tests/test_elastic.py), run beside the rest:"
cat "$tmp/elastic.log"
exit "$status"
