#!/usr/bin/env bash
# Long-running checks that do not belong in CI:
#   1. the SIGKILL crash test of the checkpoint writer with many more trials;
#   2. cargo fuzz on every reader of untrusted bytes (docs/fuzzing.md).
#
#   scripts/soak.sh                         # 2000 crash trials, 60 s per fuzz target
#   TRIALS=10000 FUZZ_SECONDS=600 scripts/soak.sh
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== crash soak: ${TRIALS:-2000} SIGKILL trials"
CKPT_CRASH_TRIALS=${TRIALS:-2000} cargo test --release --locked -p steadfast-ckpt --test crash -- --nocapture

echo "== fuzzing"
command -v cargo-fuzz >/dev/null || cargo install --locked cargo-fuzz
# cargo-fuzz passes -Z flags; the stable toolchain accepts them with RUSTC_BOOTSTRAP.
for target in manifest safetensors_header pickle zip npy_header idx frame handshake; do
  mkdir -p "fuzz/corpus/$target"
  seeds=()
  [ -d "fuzz/seeds/$target" ] && seeds=("fuzz/seeds/$target")
  RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz "$target" "fuzz/corpus/$target" "${seeds[@]}" \
    -- -max_total_time="${FUZZ_SECONDS:-60}" -timeout=10
done
