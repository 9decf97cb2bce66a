#!/usr/bin/env bash
# A PyTorch job across hosts: two hosts as network namespaces, etcd on host 0, and on each
# host `steadfast launch --nnodes 2 --node-rank I --nproc-per-node 1 --rendezvous
# etcd://HOST0:PORT/JOB --max-restarts 1 -- python elastic_ddp.py` (the launchers elect the
# coordinator in etcd; the gradients' reproducible sum crosses the hosts over TCP). Host 1's
# launcher and worker are killed with SIGKILL in the middle of training and started again
# at once with the same command; host 0's worker goes on alone while the new one starts,
# which then joins the running job and fetches the state from host 0's. Both workers end with the
# weights' SHA-256 of the undisturbed single-process run.
#
# Needs root, iproute2 and etcd (Debian: etcd-server). Usage:
#   scripts/netns-python-test.sh path/to/steadfast path/to/python FASHION_MNIST_DIR [SHA256]
# SHA256: the single process's weights for the job below, when known (else it is run here).
# Exit status: 0 pass, 1 fail, 77 cannot run here (no namespaces).
set -uo pipefail
bin=${1:?usage: netns-python-test.sh path/to/steadfast path/to/python DATA}
python=${2:?usage: netns-python-test.sh path/to/steadfast path/to/python DATA}
data=${3:?usage: netns-python-test.sh path/to/steadfast path/to/python DATA}
example="$(cd "$(dirname "$0")/.." && pwd)/python/examples/elastic_ddp.py"
command -v etcd >/dev/null || { echo "FAIL: etcd (Debian: etcd-server) is not installed"; exit 1; }
. "$(dirname "$0")/netns-hosts.sh"
make_hosts 2

export STEADFAST_SECRET=netns-python-secret
# (Steps long enough that a Python started again, with PyTorch and the data set, finds the
# job still running.)
job=("$python" "$example" --data "$data" --width 1024 --steps 400 --batch 96 --micro-batches 6)
reference=${4:-$("${job[@]}" 2>"$work/single.log" | sed -n 's/^weights sha256: \([0-9a-f]*\)$/\1/p')}
[ -n "$reference" ] || { echo "FAIL: the single process printed no weights' SHA-256"; cat "$work/single.log"; exit 1; }
status=0

on_host 0 etcd --name h0 --data-dir "$work/etcd" --listen-client-urls "http://$net.10:2379" \
  --advertise-client-urls "http://$net.10:2379" --listen-peer-urls "http://127.0.0.1:2380" \
  --initial-advertise-peer-urls "http://127.0.0.1:2380" --initial-cluster "h0=http://127.0.0.1:2380" \
  >"$work/etcd.log" 2>&1 &
for _ in $(seq 1 100); do
  on_host 0 etcdctl --endpoints "http://$net.10:2379" endpoint health >/dev/null 2>&1 && break
  sleep 0.1
done

# Starts host i's launcher; its output goes to $work/node$i.log.
start_node() {
  local i=$1
  on_host "$i" "$bin" launch --nnodes 2 --node-rank "$i" --nproc-per-node 1 --local-addr "$net.$((10 + i))" \
    --rendezvous "etcd://$net.10:2379/pyjob?ttl=2" --max-restarts 1 --min-nproc 1 --rendezvous-timeout 60 \
    --heartbeat-timeout 2 --quorum-timeout 60 -- "${job[@]}" >>"$work/node$i.log" 2>&1 &
  eval "pid$i=$!"
}

# Waits (bounded) until host i's worker has printed step $2's progress line.
wait_step() {
  for _ in $(seq 1 1200); do
    grep -qE "step +$2 +loss" "$work/node$1.log" && return 0
    sleep 0.1
  done
  echo "FAIL: host $1's worker did not reach step $2"; cat "$work"/node*.log; exit 1
}

start_node 0
start_node 1
wait_step 0 50
kill_host 1
wait "$pid1" 2>/dev/null
echo "ok: killed host 1 (its launcher and worker) after step 50"
start_node 1
wait "$pid0"; rc0=$?
wait "$pid1"; rc1=$?
for i in 0 1; do
  rc_var="rc$i"
  [ "${!rc_var}" = 0 ] || { echo "FAIL: host $i's launcher exited with ${!rc_var}"; status=1; }
done
# Whichever launcher held the coordinator role (elected in etcd; host 0's takes it over when
# host 1's was killed with it) says whether host 0's worker went on alone for a while (not
# when host 1 was back before the next epoch began).
alone=$(grep -hoE "epoch [0-9.]+: workers \[0\] from step [0-9]+" "$work"/node*.log | head -1)
[ -n "$alone" ] || alone="host 1 was back before the next epoch: no epoch of worker 0 alone"
echo "ok: $alone"
if grep -qE "\[steadfast\] fetched the state of step [0-9]+" "$work/node1.log"; then
  echo "ok: host 1's new worker $(grep -oE "fetched the state of step [0-9]+[^;]*" "$work/node1.log" | head -1)"
else
  echo "FAIL: host 1's new worker did not fetch the state from host 0's"; status=1
fi
for i in 0 1; do
  got=$(sed -n 's/.*weights sha256: \([0-9a-f]*\)$/\1/p' "$work/node$i.log" | tail -1)
  if [ "$got" = "$reference" ]; then
    echo "ok: host $i's worker ended with the single process's weights ($reference)"
  else
    echo "FAIL: host $i's worker ended with weights '${got}', the single process's are $reference"; status=1
  fi
done
[ "$status" = 0 ] || cat "$work"/node*.log
exit "$status"
