#!/usr/bin/env bash
# The recovery of an elastic job across hosts whose links are shaped with `tc`: three hosts
# as network namespaces (scripts/netns-hosts.sh), one worker each, every link limited to
# RATE Mbit/s both ways. First one raw TCP stream from host 1 to host 0 measures what the
# shaped link carries (OUT/link.json); then, for each MLP width, the worker on host 0
# crashes in the update of the middle step, its launcher starts a replacement, and that
# fetches the state from the live replicas on hosts 1 and 2 through host 0's link. Each
# job leaves node 0's output in OUT/node0-WIDTH.log and worker 0's metrics in
# OUT/out-WIDTH/metrics.jsonl; bench/recovery_hosts.py reads them.
#
# Needs root, iproute2 and tc (exit status 77 without them). Usage:
#   bench/recovery_hosts.sh path/to/steadfast OUT [RATE_MBIT] [WIDTHS]
set -uo pipefail
bin=${1:?usage: recovery_hosts.sh path/to/steadfast OUT [RATE_MBIT] [WIDTHS]}
out=${2:?usage: recovery_hosts.sh path/to/steadfast OUT [RATE_MBIT] [WIDTHS]}
rate=${3:-1000}
widths=${4:-800 3300 12000}
mkdir -p "$out"
. "$(dirname "$0")/shaped_hosts.sh" "$rate"
export STEADFAST_SECRET=recovery-hosts

# The peer of the fetch: one raw TCP stream of 200 MB through the same shaped links.
on_host 0 python3 - "$net.10" "$out/link.json" <<'PY' &
import json, socket, sys, time
s = socket.create_server((sys.argv[1], 29600))
c, _ = s.accept()
got, start = 0, None
while True:
    b = c.recv(1 << 20)
    if not b:
        break
    start = start or time.perf_counter()
    got += len(b)
seconds = time.perf_counter() - start
json.dump({"bytes": got, "seconds": seconds, "mbit_s": got * 8 / 1e6 / seconds}, open(sys.argv[2], "w"))
PY
sink=$!
sleep 0.5
on_host 1 python3 -c "
import socket, sys
c = socket.create_connection(('$net.10', 29600))
chunk = bytes(1 << 20)
for _ in range(200):
    c.sendall(chunk)
c.close()"
wait "$sink"

for width in $widths; do
  steps=$([ "$width" -le 800 ] && echo 200 || echo 8)
  crash=$((steps / 2))
  job=(train --model mlp --data synthetic --width "$width" --batch 48 --micro-batch 16 --eval-every 0
       --reduce reproducible --steps "$steps" --comm-timeout 120)
  for i in 0 1 2; do
    extra=()
    [ "$i" = 0 ] && extra=(--fault "crash:rank=0,step=$crash,phase=update")
    on_host "$i" "$bin" launch --nnodes 3 --node-rank "$i" --nproc-per-node 1 --coordinator "$net.10:29500" \
      --max-restarts 1 --min-nproc 2 --rendezvous-timeout 120 --heartbeat-timeout 2 --quorum-timeout 300 \
      -- "${job[@]}" --out "$out/out-$width" "${extra[@]}" >"$out/node$i-$width.log" 2>&1 &
    eval "pid$i=$!"
  done
  wait "$pid0" "$pid1" "$pid2" || exit 1
done
