#!/usr/bin/env bash
# The main job on a fresh machine: install the data sets and libhdf5 if missing, build, and train the MLP on
# Fashion-MNIST twice, with the order-independent (`reproducible`) gradient sum:
#   1. undisturbed, in one process;
#   2. as a 3-worker elastic job on the embedded coordinator, in which worker 1 crashes in the update of
#      step 700 (the launcher starts a replacement, which fetches the state from the live replicas) and an
#      exponent bit of one of worker 2's parameters flips before step 1400 (the worker sees that its state
#      changed at rest and repairs it from the other two).
# It ends by printing both fingerprints, and fails unless they are equal.
# Extra arguments go to both `steadfast train` runs (faults at steps beyond --steps do not fire).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh

cargo build --release --locked
bin=./target/release/steadfast
out=runs/demo
mkdir -p "$out"
common=(--model mlp --data fashion-mnist --micro-batch 32 --reduce reproducible "$@")

echo "== undisturbed, one process"
"$bin" train "${common[@]}" --out "$out/undisturbed" | tee "$out/undisturbed.txt"

echo
echo "== 3 workers: worker 1 crashes at step 700, a parameter of worker 2 flips before step 1400"
"$bin" launch --nproc 3 --max-restarts 1 -- train "${common[@]}" --out "$out/job" \
    --on-divergence repair \
    --fault 'crash:rank=1,step=700,phase=update' \
    --inject 'step=1400,rank=2,state=param,bits=exponent,count=1,seed=7' | tee "$out/job.txt"

undisturbed=$(sed -n 's/^fingerprint: \([0-9a-f]*\).*/\1/p' "$out/undisturbed.txt")
recovered=$(sed -n 's/^\[0\] fingerprint: \([0-9a-f]*\).*/\1/p' "$out/job.txt")
echo
echo "undisturbed run:                        fingerprint: $undisturbed"
echo "the job that lost a worker and a bit:   fingerprint: $recovered"
if [ -n "$undisturbed" ] && [ "$undisturbed" = "$recovered" ]; then
    echo "equal: the same bits"
else
    echo "NOT EQUAL" >&2
    exit 1
fi
