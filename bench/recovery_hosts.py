"""Recovery of an elastic job across hosts over links shaped with `tc`: runs
`bench/recovery_hosts.sh` (three network-namespace hosts, one worker each, every link at
1 Gbit/s both ways; worker 0 crashes and its replacement fetches the state from the two
live replicas) for states of about 10 MB, 100 MB and 1 GB, and writes the timeline into
docs/benchmarks.md. Needs root (namespaces, tc); says so and writes nothing otherwise.

Usage: python3 bench/recovery_hosts.py   (bench/run.sh recovery-hosts does this)
"""
import datetime, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.environ.get("STEADFAST_BIN") or os.path.join(ROOT, "target", "release", "steadfast")
RATE_MBIT = 1000
WIDTHS = "800 3300 12000"  # about 10 MB, 100 MB and 1 GB of state (AdamW: 12 bytes per parameter)


def main():
    if os.geteuid() != 0:
        print("recovery across hosts needs root (network namespaces and tc): skipped")
        return
    run = subprocess.run(["bash", os.path.join(ROOT, "bench", "recovery_hosts.sh"), BIN, str(RATE_MBIT), WIDTHS],
                         capture_output=True, text=True)
    if run.returncode == 77:
        print("network namespaces or tc are not available here: skipped")
        return
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not rows:
        sys.exit(f"recovery_hosts.sh failed:\n{run.stdout}\n{run.stderr}")
    lines = [
        "<!-- recovery-hosts:start -->",
        "## Recovery across hosts over shaped links",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh recovery-hosts` (as root; driver `bench/recovery_hosts.py`, which runs"
        " `bench/recovery_hosts.sh`).",
        "",
        f"Three hosts as network namespaces joined by a bridge, every host's link shaped to {RATE_MBIT} Mbit/s in"
        " each direction (`tc qdisc ... tbf` on both ends of its veth pair). An elastic job of three nodes of one"
        " worker each (`launch --nnodes 3 --nproc-per-node 1 --max-restarts 1`, node 0's launcher serving the"
        " coordinator), the MLP on synthetic data (`--width W`, AdamW). Worker 0 (on host 0) crashes in the update"
        " of the middle step (of 200 steps for the smallest state, 8 otherwise); its launcher starts a replacement,"
        " which loads its data, builds its model, joins, and fetches the state from the two live replicas on hosts"
        " 1 and 2, through host 0's shaped link. Seconds from the crash (the launcher's line for the worker's"
        " exit); one run per size.",
        "",
        "| state | loss seen | quorum formed | transfer | stepping again | transfer rate | / link | sources |"
        " steps computed again |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['state_mb']:.0f} MB | {r['to_lost_s']:.2f} | {r['to_quorum_s']:.2f} | {r['fetch_s']:.2f} |"
                     f" {r['to_stepping_s']:.2f} | {r['fetch_mbit_s']:.0f} Mbit/s | {r['of_link']:.2f} |"
                     f" {len(r['sources'] or [])} | {r['steps_again']} |")
    lines += [
        "",
        "A crashed process's connection closes at once, so the loss is seen at once (a hung or cut-off worker would"
        " be seen after `--heartbeat-timeout`, here 2 s). The quorum waits for the replacement to start and build"
        " its model, which grows with the state. The fetch takes chunks from both sources at once; with one"
        " receiving link, its rate is bounded by that link. No step is computed twice: the job goes on from the"
        " survivors' current state. (Times are the coordinator's and the launcher's, printed to 10 ms.)",
        "<!-- recovery-hosts:end -->",
    ]
    publish("recovery-hosts", lines)


if __name__ == "__main__":
    main()
