#!/usr/bin/env bash
# The failure-rate sweep across hosts: three network-namespace hosts (scripts/netns-hosts.sh),
# one worker each, every link shaped to RATE Mbit/s both ways; the MLP on Fashion-MNIST in
# `reproducible` mode for STEPS steps, each worker process crashing at a random moment drawn
# from an exponential distribution of mean MTBF seconds (`--fault crash:mtbf=S,seed=N`; every
# process draws its own), recovered three ways:
#
#   live        an elastic job of three nodes (`--max-restarts`): each node's launcher
#               replaces its worker, which fetches the state from the live replicas;
#   memory      the same with `--recovery memory --save-every 100`: every survivor goes back
#               to its in-memory copy and the replacement fetches that copy;
#   checkpoint  a static job of three nodes with a checkpoint every 100 steps, started again
#               whole after each failure with `--resume auto` (as a scheduler requeues a
#               job), each start's processes drawing new moments.
#
# For each MTBF (0: no failures), method and seed it writes one line of JSON to OUT/runs.jsonl:
# wall seconds, failures, and the fingerprints printed. bench/recovery_hosts.py reads it.
#
# Needs root, iproute2 and tc (exit status 77 without them). Usage:
#   bench/recovery_sweep_hosts.sh path/to/steadfast OUT [RATE_MBIT] [MTBFS] [SEEDS] [STEPS]
set -uo pipefail
bin=${1:?usage: recovery_sweep_hosts.sh path/to/steadfast OUT [RATE_MBIT] [MTBFS] [SEEDS] [STEPS]}
out=${2:?usage: recovery_sweep_hosts.sh path/to/steadfast OUT [RATE_MBIT] [MTBFS] [SEEDS] [STEPS]}
rate=${3:-1000}
mtbfs=${4:-0 120 60 30}
seeds=${5:-1 2}
steps=${6:-1500}
mkdir -p "$out"
. "$(dirname "$0")/shaped_hosts.sh" "$rate"
export STEADFAST_SECRET=recovery-sweep
job=(train --model mlp --data fashion-mnist --micro-batch 32 --reduce reproducible --eval-every 0 --steps "$steps"
     --comm-timeout 60)
port=29500

# Runs the three nodes' launchers with launch flags $1 (a string) and training flags $2;
# returns 0 when all three succeeded. Each node's output goes to $out/node$i.log.
three_nodes() {
  port=$((port + 1))
  local pids=() i ok=0
  for i in 0 1 2; do
    # shellcheck disable=SC2086
    on_host "$i" "$bin" launch --nnodes 3 --node-rank "$i" --nproc-per-node 1 --coordinator "$net.10:$port" \
      --rendezvous-timeout 60 --heartbeat-timeout 2 $1 -- "${job[@]}" $2 >"$out/node$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || ok=1; done
  return $ok
}

record() {  # method mtbf seed seconds failures
  local prints
  prints=$(cat "$out"/node*.log | grep -o 'fingerprint: [0-9a-f]*' | awk '{print $2}' | sort | uniq -c |
           awk '{printf "%s\"%s\": %s", (NR > 1 ? ", " : ""), $2, $1}')
  echo "{\"method\": \"$1\", \"mtbf\": $2, \"seed\": $3, \"seconds\": $4, \"failures\": $5, \"fingerprints\": {$prints}}" \
    >>"$out/runs.jsonl"
  cat "$out/runs.jsonl" | tail -n 1 >&2
}

for mtbf in $mtbfs; do
  for seed in $seeds; do
    [ "$mtbf" = 0 ] && [ "$seed" != "${seeds%% *}" ] && continue
    fault=""
    [ "$mtbf" != 0 ] && fault="--fault crash:mtbf=$mtbf,seed=$seed"
    for method in live memory; do
      flags="--max-restarts 100 --min-nproc 2"
      [ "$method" = memory ] && flags="$flags --recovery memory --save-every 100"
      start=$(date +%s.%N)
      three_nodes "$flags" "$fault" || { echo "$method at mtbf $mtbf seed $seed failed" >&2; cat "$out"/node*.log >&2; exit 1; }
      seconds=$(echo "$(date +%s.%N) - $start" | bc)
      record "$method" "$mtbf" "$seed" "$seconds" "$(cat "$out"/node*.log | grep -c 'replacing worker')"
    done
    # Checkpoint restart: the whole job again from its newest checkpoint after each failure.
    ckpt="$out/ckpt-$mtbf-$seed"
    rm -rf "$ckpt"
    start=$(date +%s.%N)
    failures=0
    until STEADFAST_INCARNATION=$failures three_nodes "" \
          "$fault --checkpoint-dir $ckpt --checkpoint-every 100 --keep-last 2 --resume auto"; do
      failures=$((failures + 1))
      [ "$failures" -gt 50 ] && { echo "checkpoint at mtbf $mtbf seed $seed: too many failures" >&2; exit 1; }
      sleep 0.2
    done
    seconds=$(echo "$(date +%s.%N) - $start" | bc)
    record checkpoint "$mtbf" "$seed" "$seconds" "$failures"
  done
done
