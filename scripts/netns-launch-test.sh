#!/usr/bin/env bash
# Multi-node launch on one machine: two hosts as network namespaces, one `steadfast launch
# --nnodes 2 --node-rank I --nproc-per-node 2 --coordinator HOST0:PORT` on each (as
# torchrun is run), workers listening on the address that reaches the coordinator.
#  1. The four ranks print the fingerprint of single-process `train` (reproducible mode).
#  2. Rank 3 (on host 1) crashes at step 15: both launchers fail, and host 0's names it.
#
# Needs root and iproute2. Usage: scripts/netns-launch-test.sh path/to/steadfast
# Exit status: 0 pass, 1 fail, 77 cannot run here (no namespaces).
set -uo pipefail
bin=${1:?usage: netns-launch-test.sh path/to/steadfast}
. "$(dirname "$0")/netns-hosts.sh"
make_hosts 2

export STEADFAST_SECRET=netns-launch-secret
job=(train --model mlp --data synthetic --steps 30 --batch 64 --micro-batch 16 --reduce reproducible --eval-every 0)
reference=$("$bin" "${job[@]}" --out "$work/single" 2>"$work/single.log" | sed -n 's/^fingerprint: \([0-9a-f]*\).*/\1/p')
[ -n "$reference" ] || { echo "FAIL: single-process train printed no fingerprint"; exit 1; }

# Runs the job on both hosts with extra train arguments; leaves host i's output in
# $work/node$i.log and its exit status in rc$i.
run_job() {
  for i in 0 1; do
    on_host "$i" "$bin" launch --nnodes 2 --node-rank "$i" --nproc-per-node 2 --coordinator "$net.10:29500" \
      --rendezvous-timeout 30 --heartbeat-timeout 2 -- "${job[@]}" --out "$work/out$i" "$@" >"$work/node$i.log" 2>&1 &
    eval "pid$i=$!"
  done
  wait "$pid0"; rc0=$?
  wait "$pid1"; rc1=$?
}

status=0
run_job
if [ "$rc0" != 0 ] || [ "$rc1" != 0 ]; then
  echo "FAIL: the two-node job failed ($rc0, $rc1)"; cat "$work"/node*.log; exit 1
fi
for rank in 0 1 2 3; do
  node=$(( rank / 2 ))
  got=$(sed -n "s/^\[$rank\] fingerprint: \([0-9a-f]*\).*/\1/p" "$work/node$node.log")
  if [ "$got" = "$reference" ]; then
    echo "ok: rank $rank on host $node printed the single-process fingerprint $got"
  else
    echo "FAIL: rank $rank on host $node printed '$got', single-process train $reference"; status=1
  fi
done
# (Agreement needs every link of the mesh: host 1's workers listened on host 1's address,
# since host 0's workers could not have reached them on loopback.)

run_job --fault 'crash:rank=3,step=15'
if [ "$rc0" = 0 ] || [ "$rc1" = 0 ]; then
  echo "FAIL: a crashed worker did not fail both nodes ($rc0, $rc1)"; cat "$work"/node*.log; status=1
elif grep -q "rank 3" "$work/node0.log"; then
  echo "ok: rank 3's crash failed both nodes: $(grep -m1 'rank 3' "$work/node0.log")"
else
  echo "FAIL: host 0 did not name rank 3"; cat "$work/node0.log"; status=1
fi
exit $status
