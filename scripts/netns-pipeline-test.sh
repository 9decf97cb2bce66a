#!/usr/bin/env bash
# A pipeline job across hosts on one machine: two hosts as network namespaces, each one
# replica of a two-stage pipeline (`steadfast launch --nnodes 2 --node-rank I
# --nproc-per-node 2 --coordinator HOST0:PORT --max-restarts 1 -- train --pipeline-stages
# 2`: host I runs slots 2I and 2I+1, stages 0 and 1 of replica I), reproducible sums.
#  1. Host 1's launcher and workers are killed with SIGKILL at a step drawn at random; host
#     0's workers go on alone, each computing replica 1's micro-batches of its stage too,
#     then host 1's launcher is started again with the same command: its workers join the
#     running job and fetch their stages' states from host 0's. All four workers end with
#     single-process `train`'s fingerprint.
#  2. The same job with `--on-failure shrink` loses host 1 for good at a drawn step, and
#     host 0's workers finish it alone with that fingerprint.
#  3. Two replicas of the pipeline laid stage by stage (`--place stages`): host 0 runs
#     stage 0 of both replicas (slots 0 and 2), host 1 stage 1 (slots 1 and 3),
#     checkpointing every 20 steps and logging the boundary to a directory both hosts see.
#     Host 1 is killed at a drawn step, so stage 1's state is lost in every replica; its
#     launcher is started again, and its workers replay stage 1 from its checkpoint on
#     stage 0's logs (with a helper of stage 0) while stage 0 keeps its state. All four
#     workers end with that fingerprint.
#
# Needs root and iproute2. Usage: scripts/netns-pipeline-test.sh path/to/steadfast
# Exit status: 0 pass, 1 fail, 77 cannot run here (no namespaces).
set -uo pipefail
bin=${1:?usage: netns-pipeline-test.sh path/to/steadfast}
. "$(dirname "$0")/netns-hosts.sh"
make_hosts 2

export STEADFAST_SECRET=netns-pipeline-secret
steps=1000
model=(--model mlp --data synthetic --steps "$steps" --batch 64 --micro-batch 8 --reduce reproducible --eval-every 0)
job=(train "${model[@]}" --comm-timeout 3 --pipeline-stages 2)
reference=$("$bin" train "${model[@]}" --out "$work/single" 2>"$work/single.log" |
  sed -n 's/^fingerprint: \([0-9a-f]*\).*/\1/p')
[ -n "$reference" ] || { echo "FAIL: single-process train printed no fingerprint"; exit 1; }
status=0

# Starts host i's launcher for run $1 (its launcher flags in $2, the worker's extra flags
# in $3); its output goes to $work/$1-node$i.log.
start_node() {
  local run=$1 flags=$2 extra=$3 i=$4
  # shellcheck disable=SC2086 # $flags and $extra are flags
  on_host "$i" "$bin" launch --nnodes 2 --node-rank "$i" --coordinator "$net.10:29500" \
    $flags --rendezvous-timeout 30 --heartbeat-timeout 1.5 --quorum-timeout 30 \
    -- "${job[@]}" --out "$work/$run-out$i" $extra >>"$work/$run-node$i.log" 2>&1 &
  eval "pid$i=$!"
}

# Checks that host i's launcher of run $1 exited well.
check_exit() {
  local run=$1 i=$2 rc_var="rc$2"
  [ "${!rc_var}" = 0 ] || { echo "FAIL: $run: host $i's launcher exited with ${!rc_var}"; status=1; }
}

# 1. Host 1 killed at a drawn step, then started again.
at=$((30 + RANDOM % 150))
replicas="--nproc-per-node 2 --min-nproc 2"
for i in 0 1; do start_node kill "$replicas --max-restarts 1" "" "$i"; done
wait_run_steps kill "$at"
kill_host 1
echo "ok: killed host 1 (its launcher and workers) at step $(run_steps kill)"
before=$(run_steps kill)
wait_run_steps kill $((before + 20))
echo "ok: host 0's workers went on to step $(run_steps kill) without host 1"
start_node kill "$replicas --max-restarts 1" "" 1
for i in 0 1; do wait_node "$i"; check_exit kill "$i"; done
# The coordinator's account: host 1's workers lost, host 0's going on, then the returning
# workers fetching their stages' states.
grep -E "worker [23] lost|workers \[0, 1\] from|fetch their stages' states" "$work/kill-node0.log" | sed 's/^/    /'
# (Together, or in two epochs when one of them joins a moment after the other.)
if grep -qE "\[2(, 3)?\] fetch their stages' states \(stage 0 from \[0\]" "$work/kill-node0.log" &&
   grep -qE "\[(2, )?3\] fetch their stages' states \((stage 0 from \[0\], )?stage 1 from \[1\]\)" "$work/kill-node0.log"; then
  echo "ok: host 1's new workers fetched their stages' states from host 0's"
else
  echo "FAIL: host 1's new workers did not fetch their stages' states from host 0's"; status=1
fi
check_workers kill 0 1
[ "$status" = 0 ] || { cat "$work"/kill-node*.log; }

# 2. Host 1 lost for good: its micro-batches rerouted to host 0's workers.
at=$((30 + RANDOM % 150))
for i in 0 1; do start_node shrink "$replicas --on-failure shrink" "" "$i"; done
wait_run_steps shrink "$at"
kill_host 1
echo "ok: killed host 1 for good at step $(run_steps shrink)"
wait_node 0
check_exit shrink 0
check_workers shrink 0
[ "$status" = 0 ] || { cat "$work"/shrink-node*.log; }

# 3. A stage on each host, of both replicas; host 1 killed at a drawn step, with stage 1.
at=$((30 + RANDOM % 150))
stages="--nproc-per-node 2 --place stages --min-nproc 4 --max-restarts 2 --replay-helpers 3"
saving="--checkpoint-every 20 --checkpoint-dir $work/stage-ck --log-boundaries all --log-dir $work/stage-logs"
for i in 0 1; do start_node stage "$stages" "$saving" "$i"; done
wait_run_steps stage "$at" 1
kill_host 1
echo "ok: killed host 1 (stage 1 of both replicas) at step $(run_steps stage 1)"
sleep 1
start_node stage "$stages" "$saving" 1
for i in 0 1; do wait_node "$i"; check_exit stage "$i"; done
replayed=$(grep -oE "its workers \[[0-9, ]*\] replay it from its checkpoint of step [0-9]+[^;]*" "$work/stage-node0.log" | head -1)
if [ -n "$replayed" ] && ! grep -q "every stage goes back" "$work/stage-node0.log"; then
  echo "ok: stage 1's state was lost with host 1: $replayed"
else
  echo "FAIL: stage 1 was not replayed alone"; status=1
fi
for at_host in "0 0" "2 0" "1 1" "3 1"; do
  read -r rank i <<<"$at_host"
  got=$(sed -n "s/^\[$rank\] fingerprint: \([0-9a-f]*\).*/\1/p" "$work/stage-node$i.log" | tail -1)
  if [ "$got" = "$reference" ]; then
    echo "ok: stage: worker $rank (stage $((rank % 2))) on host $i ended with the single-process fingerprint $got"
  else
    echo "FAIL: stage: worker $rank on host $i printed '$got', single-process train $reference"; status=1
  fi
done
[ "$status" = 0 ] || { cat "$work"/stage-node*.log; }
exit $status
