#!/usr/bin/env bash
# Multi-host test on one machine: three hosts as network namespaces joined by veth pairs
# to a bridge, one data-parallel training job across them (a standalone coordinator on
# host 0, one worker per host), then host 2's link is cut in the middle of training.
# Passes when both survivors fail on their own, naming the lost peer (as the coordinator's
# heartbeats found it), within the bound.
#
# Needs root and iproute2. Usage: scripts/netns-cut-test.sh path/to/steadfast
# Exit status: 0 pass, 1 fail, 77 cannot run here (no namespaces).
set -uo pipefail
bin=${1:?usage: netns-cut-test.sh path/to/steadfast}
. "$(dirname "$0")/netns-hosts.sh"
make_hosts 3

export STEADFAST_SECRET=netns-test-secret
coord="$net.10:29500"
on_host 0 "$bin" coordinator --bind "$coord" --world-size 3 --timeout 60 --heartbeat-timeout 1.5 \
  >"$work/coord.log" 2>&1 &
args=(train --model mlp --data synthetic --steps 1000000 --batch 96 --micro-batch 32 --reduce reproducible
      --eval-every 0 --comm-timeout 3 --coordinator "$coord" --world-size 3)
for i in 0 1 2; do
  on_host "$i" "$bin" "${args[@]}" --rank "$i" --bind "$net.$((10 + i))" --out "$work/out$i" \
    >"$work/w$i.log" 2>&1 &
  eval "pid$i=$!"
done

steps_logged() { if [ -f "$work/out0/metrics.jsonl" ]; then wc -l <"$work/out0/metrics.jsonl"; else echo 0; fi; }
# Wait (bounded) until training is under way: rank 0 has logged 50 steps.
for _ in $(seq 1 600); do
  [ "$(steps_logged)" -ge 50 ] && break
  sleep 0.1
done
[ "$(steps_logged)" -ge 50 ] || { echo "FAIL: training did not start"; cat "$work"/*.log; exit 1; }

cut_at=$(date +%s%N)
cut_host 2
status=0
for i in 0 1; do
  pid_var="pid$i"
  # Each survivor must exit by itself within the bound (3 s timeout, plus slack).
  for _ in $(seq 1 150); do kill -0 "${!pid_var}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${!pid_var}" 2>/dev/null; then
    echo "FAIL: rank $i still running 15 s after the cut"; status=1; continue
  fi
  wait "${!pid_var}"; rc=$?
  elapsed_ms=$(( ($(date +%s%N) - cut_at) / 1000000 ))
  if [ "$rc" = 0 ]; then echo "FAIL: rank $i exited 0 after the cut"; status=1; continue; fi
  # The coordinator misses host 2's heartbeats (1.5 s) before any collective times out
  # (3 s), so both survivors must name rank 2.
  if grep -qE "rank 2 was lost" "$work/w$i.log"; then
    echo "ok: rank $i failed ${elapsed_ms} ms after the cut: $(grep -E 'error' "$work/w$i.log" | head -1)"
  else
    echo "FAIL: rank $i did not name the lost peer:"; cat "$work/w$i.log"; status=1
  fi
done
exit $status
