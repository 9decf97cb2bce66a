#!/usr/bin/env bash
# The all-reduce across hosts: W network-namespace hosts (scripts/netns-hosts.sh) joined
# by veth pairs to a bridge, one rank on each, links unshaped (or shaped to RATE Mbit/s).
# For each W in WORLDS, three measurements over the same links, written as JSON lines to
# OUT/W-<what>.jsonl:
#   ring       raw TCP streams in a ring (every host sending to the next while receiving
#              from the previous, as a ring step does): the bound of a ring all-reduce's
#              bus bandwidth;
#   steadfast  `steadfast bench collective` under one launcher per host (the mesh over
#              TCP: no two ranks share a host), in the modes MODES (default
#              fast,reproducible; add reproducible32 to time the 32-bit sum too), each
#              size and mode timed REPEATS times (default 5) after a warm-up;
#   mpi        the same command (the same modes) with `--engine mpi` under Open MPI, whose daemons reach the
#              other namespaces through an agent that stands in for ssh, with its TCP
#              transport only (`--mca btl tcp,self`). Its ranks yield the core while
#              they wait (`--mca mpi_yield_when_idle 1`): the hosts share this machine's
#              cores, but each looks to Open MPI like a machine of its own, so it would
#              not yield by itself, and ranks spinning on their receives take the core
#              from the ranks with work to do (the 1 MB float all-reduce on 4 hosts
#              took 24 ms spinning, 11 ms yielding; Steadfast's mesh, which blocks in
#              the kernel, 12 ms). STEADFAST_MPI_OWNERS, when set, is passed to the
#              ranks (docs/clusters.md: how the reproducible sum's terms travel).
# bench/engines_hosts.py reads OUT and writes the table.
#
# Needs root, iproute2 and Open MPI (exit status 77 without namespaces). Usage:
#   bench/engines_hosts.sh path/to/steadfast OUT [RATE_MBIT]
set -uo pipefail
bin=$(realpath "${1:?usage: engines_hosts.sh path/to/steadfast OUT [RATE_MBIT]}")
out=$(realpath -m "${2:?usage: engines_hosts.sh path/to/steadfast OUT [RATE_MBIT]}")
rate=${3:-0}
worlds=${WORLDS:-2,4}
mb=${MB:-1,4,16,64,256}
modes=${MODES:-fast,reproducible}
repeats=${REPEATS:-5}
mkdir -p "$out"
most=$(tr , '\n' <<<"$worlds" | sort -n | tail -1)
if [ "$rate" = 0 ]; then
  . "$(dirname "$0")/../scripts/netns-hosts.sh"
  make_hosts "$most"
else
  . "$(dirname "$0")/shaped_hosts.sh" "$rate" "$most"
fi
export STEADFAST_SECRET=engines-hosts OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Each rank has one core's worth of threads at most (the hosts share this machine's).
export RAYON_NUM_THREADS=1

# The agent Open MPI calls as it would call ssh: `agent HOST COMMAND...`.
for ((i = 0; i < most; i++)); do echo "$net.$((10 + i)) $tag-h$i"; done >"$work/hosts"
cat >"$work/agent" <<AGENT
#!/bin/sh
host=\$1; shift
ns=\$(awk -v h="\$host" '\$1 == h { print \$2 }' "$work/hosts")
[ -n "\$ns" ] || { echo "no namespace host \$host" >&2; exit 1; }
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$work/agent"

ring() { # world
  local w=$1 i
  for ((i = 0; i < w; i++)); do
    on_host "$i" python3 "$(dirname "$0")/tcp_ring.py" --rank "$i" --world "$w" --net "$net" --mb 256 \
      >"$out/$w-ring-$i.jsonl" &
  done
  wait
  mv "$out/$w-ring-0.jsonl" "$out/$w-ring.jsonl"
  rm -f "$out/$w"-ring-*.jsonl
}

steadfast() { # world
  local w=$1 i port=29650
  for ((i = 0; i < w; i++)); do
    on_host "$i" "$bin" launch --nnodes "$w" --node-rank "$i" --nproc-per-node 1 --coordinator "$net.10:$port" \
      --local-addr "$net.$((10 + i))" -- bench collective --mb "$mb" --reduce "$modes" --repeats "$repeats" \
      >"$work/sf-$i.log" 2>&1 &
  done
  wait
  grep -h '{' "$work/sf-0.log" | sed 's/^\[[0-9]*\] //' >"$out/$w-steadfast.jsonl"
}

mpi() { # world
  local w=$1 i hosts=""
  for ((i = 0; i < w; i++)); do hosts+="${hosts:+,}$net.$((10 + i))"; done
  on_host 0 mpirun -n "$w" --host "$hosts" --bind-to none \
    --mca plm_rsh_agent "$work/agent" --mca btl tcp,self --mca mpi_yield_when_idle 1 \
    ${STEADFAST_MPI_OWNERS:+-x STEADFAST_MPI_OWNERS} \
    --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
    "$bin" bench collective --mb "$mb" --reduce "$modes" --engine mpi >"$work/mpi.log" 2>&1 ||
    { cat "$work/mpi.log" >&2; return 1; }
  grep -h '^{' "$work/mpi.log" >"$out/$w-mpi.jsonl"
}

for w in ${worlds//,/ }; do
  ring "$w" && echo "ring x$w done"
  steadfast "$w" && echo "steadfast x$w done"
  mpi "$w" && echo "mpi x$w done"
done
