#!/usr/bin/env bash
# An elastic job across hosts on one machine: three hosts as network namespaces, one
# `steadfast launch --nnodes 3 --node-rank I --nproc-per-node 2 --coordinator HOST0:PORT
# --max-restarts 1` on each (node 0's launcher serves the coordinator), reproducible sums.
#  1. Host 2's launcher and workers are killed with SIGKILL in the middle of training; the
#     four survivors go on, then host 2's launcher is started again with the same command:
#     its workers join the running job and fetch the state from the live replicas. All six
#     workers end with single-process `train`'s fingerprint.
#  2. Host 1's link is cut in the middle of training; the workers of hosts 0 and 2 go on
#     without it and end with that fingerprint.
#  3. No launcher: a standalone coordinator on host 0 and one worker on each of hosts 1 and
#     2, told of a standby address on host 1 (`--coordinator H0:P,H1:P`). Host 0 is killed
#     in the middle of training; a coordinator started on host 1 one generation on rebuilds
#     the membership from the workers' reports, and both end with that fingerprint.
#
# Needs root and iproute2. Usage: scripts/netns-elastic-test.sh path/to/steadfast
# Exit status: 0 pass, 1 fail, 77 cannot run here (no namespaces).
set -uo pipefail
bin=${1:?usage: netns-elastic-test.sh path/to/steadfast}
. "$(dirname "$0")/netns-hosts.sh"
make_hosts 3

export STEADFAST_SECRET=netns-elastic-secret
steps=600
job=(train --model mlp --data synthetic --steps "$steps" --batch 96 --micro-batch 16 --reduce reproducible
     --eval-every 0 --comm-timeout 3)
reference=$("$bin" "${job[@]}" --out "$work/single" 2>"$work/single.log" | sed -n 's/^fingerprint: \([0-9a-f]*\).*/\1/p')
[ -n "$reference" ] || { echo "FAIL: single-process train printed no fingerprint"; exit 1; }
status=0

# Starts host i's launcher for run $1; its output goes to $work/$1-node$i.log.
start_node() {
  local run=$1 i=$2
  on_host "$i" "$bin" launch --nnodes 3 --node-rank "$i" --nproc-per-node 2 --coordinator "$net.10:29500" \
    --max-restarts 1 --min-nproc 2 --rendezvous-timeout 30 --heartbeat-timeout 1.5 --quorum-timeout 30 \
    -- "${job[@]}" --out "$work/$run-out$i" >>"$work/$run-node$i.log" 2>&1 &
  eval "pid$i=$!"
}

# 1. Host 2 killed, then started again.
for i in 0 1 2; do start_node kill "$i"; done
wait_run_steps kill 60
kill_host 2
echo "ok: killed host 2 (its launcher and workers) at step $(run_steps kill)"
before=$(run_steps kill)
wait_run_steps kill $((before + 40))
echo "ok: the survivors went on to step $(run_steps kill) without host 2"
start_node kill 2
for i in 0 1 2; do wait_node "$i"; done
for i in 0 1 2; do
  rc_var="rc$i"
  [ "${!rc_var}" = 0 ] || { echo "FAIL: kill: host $i's launcher exited with ${!rc_var}"; status=1; }
done
# The coordinator's account: host 2's workers lost, a quorum of the four survivors, then
# the returning workers fetching the state from live replicas.
grep -E "worker [45] lost|workers \[0, 1, 2, 3\] from|fetch the state" "$work/kill-node0.log" | sed 's/^/    /'
for w in 4 5; do
  if grep -qE "; \[([0-9]+, )*$w(, [0-9]+)*\] fetch the state from \[[0-9, ]+\]" "$work/kill-node0.log"; then
    echo "ok: host 2's new worker $w fetched the state from the live replicas"
  else
    echo "FAIL: host 2's new worker $w did not fetch the state from the live replicas"; status=1
  fi
done
check_workers kill 0 1 2
# Every launcher's output says the changes of membership, once per node.
for i in 0 1; do
  if [ "$(grep -c "workers \[4, 5\] left at step" "$work/kill-node$i.log")" = 1 ] &&
     grep -q "workers \[[45]\] joined at step\|workers \[4, 5\] joined at step" "$work/kill-node$i.log"; then
    echo "ok: host $i's launcher says: $(grep -m1 "left at step" "$work/kill-node$i.log")"
  else
    echo "FAIL: host $i's launcher does not say once that workers 4 and 5 left and came back"; status=1
  fi
done
[ "$status" = 0 ] || { cat "$work"/kill-node*.log; }

# 2. Host 1's link cut.
for i in 0 1 2; do start_node cut "$i"; done
wait_run_steps cut 60
cut_host 1
echo "ok: cut host 1's link at step $(run_steps cut)"
for i in 0 2; do wait_node "$i"; done
for i in 0 2; do
  rc_var="rc$i"
  [ "${!rc_var}" = 0 ] || { echo "FAIL: cut: host $i's launcher exited with ${!rc_var}"; status=1; }
done
check_workers cut 0 2
grep -E "worker [23] lost|workers \[0, 1, 4, 5\] from" "$work/cut-node0.log" | sed 's/^/    /'
kill_host 1
ip link set "$tag-v1" up # host 1's link back, for what follows
[ "$status" = 0 ] || { cat "$work"/cut-node*.log; }

# 3. The coordinator's host lost; a coordinator started again on another host.
co=(coordinator --elastic --world-size 2 --heartbeat-timeout 1.5 --quorum-timeout 30)
on_host 0 "$bin" "${co[@]}" --bind "$net.10:29500" >"$work/failover-co0.log" 2>&1 &
for i in 1 2; do
  on_host "$i" "$bin" "${job[@]}" --elastic --rank "$((i - 1))" --world-size 2 \
    --coordinator "$net.10:29500,$net.11:29501" --out "$work/failover-out$((i - 1))" >"$work/failover-w$i.log" 2>&1 &
  eval "pid$i=$!"
done
f="$work/failover-out0/metrics.jsonl"
for _ in $(seq 1 600); do [ -f "$f" ] && [ "$(grep -c '"kind":"train"' "$f")" -ge 60 ] && break; sleep 0.1; done
kill_host 0
echo "ok: killed host 0 (the coordinator) at step $(grep -c '"kind":"train"' "$f")"
on_host 1 "$bin" "${co[@]}" --bind "$net.11:29501" --generation 1 >"$work/failover-co1.log" 2>&1 &
co1=$!
for i in 1 2; do wait_node "$i"; done
for i in 1 2; do
  rc_var="rc$i"
  got=$(sed -n 's/^fingerprint: \([0-9a-f]*\).*/\1/p' "$work/failover-w$i.log")
  if [ "${!rc_var}" = 0 ] && [ "$got" = "$reference" ]; then
    echo "ok: failover: the worker on host $i ended with the single-process fingerprint $got"
  else
    echo "FAIL: failover: the worker on host $i exited with ${!rc_var}, printed '$got'"; status=1
  fi
done
if wait "$co1"; then
  echo "ok: failover: the coordinator on host 1 saw the job finish: $(grep -m1 'epoch' "$work/failover-co1.log")"
else
  echo "FAIL: failover: the coordinator on host 1 failed"; status=1
fi
[ "$status" = 0 ] || { cat "$work"/failover-*.log; }
exit $status
