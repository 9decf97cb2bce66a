#!/usr/bin/env bash
# The recovery timeline of an elastic job across hosts whose links are shaped with `tc`:
# three hosts as network namespaces (scripts/netns-hosts.sh), one worker each, every link
# limited to RATE both ways; the worker on host 0 crashes in the update of the middle step,
# its launcher starts a replacement, which fetches the state from the two live replicas on
# hosts 1 and 2 through host 0's shaped link. Prints one JSON line per state size: the
# seconds from the crash to the loss being seen, to the quorum, to the state fetched, and to
# stepping again; the bytes fetched and the fetch's rate against the link's; and the steps
# computed twice (the job's steps against the steps it recorded).
#
# Needs root, iproute2 and tc. Usage (bench/recovery.py runs it):
#   bench/recovery_hosts.sh path/to/steadfast [RATE_MBIT] [WIDTHS]
set -uo pipefail
bin=${1:?usage: recovery_hosts.sh path/to/steadfast [RATE_MBIT] [WIDTHS]}
rate=${2:-1000}
widths=${3:-800 3300 12000}
. "$(dirname "$0")/../scripts/netns-hosts.sh"
make_hosts 3
for i in 0 1 2; do
  # Both directions: the host's end (what it sends) and the bridge's end (what it receives).
  on_host "$i" tc qdisc add dev "$tag-p$i" root tbf rate "${rate}mbit" burst 1mb latency 100ms || exit 77
  tc qdisc add dev "$tag-v$i" root tbf rate "${rate}mbit" burst 1mb latency 100ms || exit 77
done
export STEADFAST_SECRET=recovery-hosts

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
      -- "${job[@]}" --out "$work/out-$width" "${extra[@]}" >"$work/node$i-$width.log" 2>&1 &
    eval "pid$i=$!"
  done
  wait "$pid0" "$pid1" "$pid2"
  python3 - "$work/node0-$width.log" "$work/out-$width/metrics.jsonl" "$width" "$steps" "$rate" <<'PY'
import json, re, sys
log, metrics, width, steps, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
stamps = {}
for line in open(log):
    m = re.match(r"\[(coordinator|launcher)\]\s+([\d.]+) s\s+(.*)", line)
    if not m:
        continue
    t, what = float(m.group(2)), m.group(3)
    if what.startswith("worker 0 (process 1) exited") and "crash" not in stamps:
        stamps["crash"] = t
    elif what.startswith("worker 0 lost") and "lost" not in stamps:
        stamps["lost"] = t
    elif "[0] fetch the state" in what and "quorum" not in stamps:
        stamps["quorum"] = t
    elif what.endswith(" steps") and "quorum" in stamps and "stepping" not in stamps:
        stamps["stepping"] = t
lines = [json.loads(l) for l in open(metrics) if l.strip()]
fetch = next((l for l in lines if l.get("kind") == "fetch"), {})
recorded = [l["step"] for l in lines if l.get("kind") == "train"]
start = min(stamps.get("crash", 1e9), stamps.get("lost", 1e9))
row = {
    "width": width,
    "state_mb": round(fetch.get("bytes", 0) / 1e6, 1),
    "link_mbit": rate,
    "to_lost_s": round(stamps.get("lost", float("nan")) - start, 3),
    "to_quorum_s": round(stamps.get("quorum", float("nan")) - start, 3),
    "fetch_s": round(fetch.get("seconds", float("nan")), 3),
    "to_stepping_s": round(stamps.get("stepping", float("nan")) - start, 3),
    "fetch_mbit_s": round(fetch.get("bytes", 0) * 8 / 1e6 / fetch["seconds"], 1) if fetch.get("seconds") else None,
    "sources": fetch.get("sources"),
    "steps_again": len(recorded) - len(set(recorded)),
}
row["of_link"] = round(row["fetch_mbit_s"] / rate, 3) if row["fetch_mbit_s"] else None
print(json.dumps(row))
PY
done
