# Sourced by the multi-host tests: N hosts as network namespaces on one machine, joined
# by veth pairs to a bridge. After `make_hosts N`, host i is the namespace "$tag-h$i" with
# the address "$net.$((10 + i))", `on_host i CMD...` runs a command there, and `cut_host i`
# takes its link down. Everything is removed on exit. Needs root and iproute2; a script
# that sources this exits 77 (cannot run here) when namespaces cannot be made.
tag=sf$$
net=10.213.$(( $$ % 200 + 20 ))
work=$(mktemp -d)
hosts=0
cleanup() {
  for ((i = 0; i < hosts; i++)); do ip netns del "$tag-h$i" 2>/dev/null; ip link del "$tag-v$i" 2>/dev/null; done
  ip link del "$tag-br" 2>/dev/null
  jobs -p | xargs -r kill 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

make_hosts() {
  hosts=$1
  ip netns add "$tag-h0" 2>/dev/null || { echo "network namespaces are not available here"; exit 77; }
  ip link add "$tag-br" type bridge && ip link set "$tag-br" up || exit 77
  for ((i = 0; i < hosts; i++)); do
    [ "$i" = 0 ] || ip netns add "$tag-h$i"
    ip link add "$tag-v$i" type veth peer name "$tag-p$i"
    ip link set "$tag-p$i" netns "$tag-h$i"
    ip link set "$tag-v$i" master "$tag-br" up
    ip netns exec "$tag-h$i" ip addr add "$net.$((10 + i))/24" dev "$tag-p$i"
    ip netns exec "$tag-h$i" ip link set "$tag-p$i" up
    ip netns exec "$tag-h$i" ip link set lo up
  done
}

on_host() { local i=$1; shift; ip netns exec "$tag-h$i" "$@"; }
cut_host() { ip link set "$tag-v$1" down; }

# What the job tests share: a host killed, a launcher waited for, the workers' fingerprints
# checked (each host runs two workers, 2i and 2i+1, whose launcher writes $work/RUN-nodeI.log;
# $reference is the single process's fingerprint; a failure sets status=1).

# The steps logged in run $1 by the worker that writes its metrics, on host ${2:-0}.
run_steps() {
  local f="$work/$1-out${2:-0}/metrics.jsonl"
  if [ -f "$f" ]; then grep -c '"kind":"train"' "$f"; else echo 0; fi
}

# Waits (bounded, 60 s) until run $1 has logged $2 steps (on host ${3:-0}).
wait_run_steps() {
  for _ in $(seq 1 600); do
    [ "$(run_steps "$1" "${3:-0}")" -ge "$2" ] && return 0
    sleep 0.1
  done
  echo "FAIL: run $1 did not reach step $2"; cat "$work/$1"-node*.log; exit 1
}

# Kills every process in host i's namespace with SIGKILL: its launcher and its workers.
kill_host() { ip netns pids "$tag-h$1" | xargs -r kill -9; }

# Checks that each of run $1's workers on the hosts given printed the reference.
check_workers() {
  local run=$1; shift
  for i in "$@"; do
    for rank in $((2 * i)) $((2 * i + 1)); do
      got=$(sed -n "s/^\[$rank\] fingerprint: \([0-9a-f]*\).*/\1/p" "$work/$run-node$i.log" | tail -1)
      if [ "$got" = "$reference" ]; then
        echo "ok: $run: worker $rank on host $i ended with the single-process fingerprint $got"
      else
        echo "FAIL: $run: worker $rank on host $i printed '$got', single-process train $reference"; status=1
      fi
    done
  done
}

# Waits (bounded, 120 s) for host i's launcher; its exit status in rc$i.
wait_node() {
  local i=$1 pid_var="pid$1"
  for _ in $(seq 1 1200); do kill -0 "${!pid_var}" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "${!pid_var}" 2>/dev/null; then
    echo "FAIL: host $i's launcher still runs 120 s on"; kill -9 "${!pid_var}"; status=1
  fi
  wait "${!pid_var}"; eval "rc$i=$?"
}
