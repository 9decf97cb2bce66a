"""Recovery of an elastic job across hosts over links shaped with `tc`: runs
`bench/recovery_hosts.sh` (three network-namespace hosts, one worker each, every link at
1 Gbit/s both ways; worker 0 crashes and its replacement fetches the state from the two
live replicas) for states of about 10 MB, 100 MB and 1 GB, then the failure-rate sweep
across the same hosts (`bench/recovery_sweep_hosts.sh`: live replicas, in-memory copies and
checkpoint restart under random crashes), and writes both into docs/benchmarks.md. Needs
root (namespaces, tc); says so and writes nothing otherwise.

Usage: python3 bench/recovery_hosts.py   (bench/run.sh recovery-hosts does this)
"""
import datetime, json, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, first_fetch, publish, recovery_stamps  # noqa: E402

BIN = os.environ.get("STEADFAST_BIN") or os.path.join(ROOT, "target", "release", "steadfast")
RATE_MBIT = 1000
WIDTHS = [800, 3300, 12000]  # about 10 MB, 100 MB and 1 GB of state (AdamW: 12 bytes per parameter)
SWEEP_MTBF = [0, 120, 60, 30]  # seconds per worker process; 0: no failures
SWEEP_SEEDS = [1, 2]
SWEEP_STEPS = 1500
METHODS = {
    "live": "live replicas",
    "memory": "in-memory copy every 100 steps",
    "checkpoint": "checkpoint every 100 steps, job restarted whole",
}


def sweep():
    """The sweep's runs, averaged over seeds per (mtbf, method); every run's workers must
    print one fingerprint, the same for all."""
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(["bash", os.path.join(ROOT, "bench", "recovery_sweep_hosts.sh"), BIN, out,
                              str(RATE_MBIT), " ".join(map(str, SWEEP_MTBF)), " ".join(map(str, SWEEP_SEEDS)),
                              str(SWEEP_STEPS)], capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"recovery_sweep_hosts.sh failed:\n{run.stdout}\n{run.stderr}")
        runs = [json.loads(l) for l in open(os.path.join(out, "runs.jsonl"))]
    prints = {f for r in runs for f in r["fingerprints"]}
    if len(prints) != 1 or any(sum(r["fingerprints"].values()) != 3 for r in runs):
        sys.exit(f"the runs' fingerprints differ: {runs}")
    rows = []
    for mtbf in SWEEP_MTBF:
        for method in METHODS:
            mine = [r for r in runs if r["mtbf"] == mtbf and r["method"] == method]
            rows.append({"mtbf": mtbf, "method": method,
                         "seconds": sum(r["seconds"] for r in mine) / len(mine),
                         "failures": sum(r["failures"] for r in mine) / len(mine)})
    return rows, prints.pop()


def row(out, width, link):
    """One state size's timeline, from node 0's output and worker 0's metrics."""
    with open(os.path.join(out, f"node0-{width}.log")) as f:
        st = recovery_stamps(f)
    fetch = first_fetch(os.path.join(out, f"out-{width}", "metrics.jsonl"))
    with open(os.path.join(out, f"out-{width}", "metrics.jsonl")) as f:
        steps = [json.loads(l)["step"] for l in f if '"kind":"train"' in l]
    start = min(st.get("crash", float("inf")), st.get("lost", float("inf")))
    rate = fetch["bytes"] * 8 / 1e6 / fetch["seconds"]
    return {
        "state_mb": fetch["bytes"] / 1e6,
        "lost": st["lost"] - start,
        "quorum": st["quorum"] - start,
        "fetch": fetch["seconds"],
        "stepping": st["stepping"] - start,
        "rate": rate,
        "of_link": rate / link["mbit_s"],
        "sources": len(fetch.get("sources") or []),
        "again": len(steps) - len(set(steps)),
    }


def main():
    if os.geteuid() != 0:
        print("recovery across hosts needs root (network namespaces and tc): skipped")
        return
    with tempfile.TemporaryDirectory() as out:
        run = subprocess.run(["bash", os.path.join(ROOT, "bench", "recovery_hosts.sh"), BIN, out, str(RATE_MBIT),
                              " ".join(map(str, WIDTHS))], capture_output=True, text=True)
        if run.returncode == 77:
            print("network namespaces or tc are not available here: skipped")
            return
        if run.returncode != 0:
            sys.exit(f"recovery_hosts.sh failed:\n{run.stdout}\n{run.stderr}")
        link = json.load(open(os.path.join(out, "link.json")))
        rows = [row(out, w, link) for w in WIDTHS]
    swept, fingerprint = sweep()
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
        f"*Link* is one raw TCP stream of 200 MB from host 1 to host 0 through the same shaped links, measured in the"
        f" same run: {link['mbit_s']:.0f} Mbit/s. It is the fetch's peer: the most one receiving link carries.",
        "",
        "| state | loss seen | quorum formed | transfer | stepping again | transfer rate | / link | sources |"
        " steps computed again |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['state_mb']:.0f} MB | {r['lost']:.2f} | {r['quorum']:.2f} | {r['fetch']:.2f} |"
                     f" {r['stepping']:.2f} | {r['rate']:.0f} Mbit/s | {r['of_link']:.2f} | {r['sources']} |"
                     f" {r['again']} |")
    lines += [
        "",
        "A crashed process's connection closes at once, so the loss is seen at once (a hung or cut-off worker would"
        " be seen after `--heartbeat-timeout`, here 2 s). The quorum waits for the replacement to start and build"
        " its model, which grows with the state. The fetch takes chunks from both sources at once; with one"
        " receiving link, its rate is bounded by that link. No step is computed twice: the job goes on from the"
        " survivors' current state. (Times are the coordinator's and the launcher's, printed to 10 ms.)",
        "",
        "### Under a sweep of failure rates, across hosts",
        "",
        f"The same three hosts and links; the MLP on Fashion-MNIST (batch 128 as micro-batches of 32,"
        f" `reproducible`) for {SWEEP_STEPS} steps, one worker per host, each worker process crashing at a random"
        " moment drawn from an exponential distribution of the given mean (`--fault crash:mtbf=S,seed=N`; every"
        " process draws its own). Recovered three ways: from the live replicas (an elastic job of three nodes,"
        " `--max-restarts 100 --min-nproc 2`: each node replaces its worker, the survivors go on meanwhile); by"
        " going back to an in-memory copy kept every 100 steps (`--recovery memory`); by restarting the whole"
        " static job from its checkpoint of every 100 steps (`--resume auto`, as a scheduler requeues a job; each"
        f" start's processes draw new moments). Wall seconds of the whole job, mean of {len(SWEEP_SEEDS)} seeds;"
        f" every run's three workers end with the same fingerprint, `{fingerprint}`. Failures are the crashes that"
        " happened (the live and memory jobs' replacements, the checkpoint job's restarts).",
        "",
        "| mean time between failures, per worker | method | failures | seconds | / failure-free | / live replicas |",
        "|---|---|---|---|---|---|",
    ]
    base = {r["method"]: r["seconds"] for r in swept if r["mtbf"] == 0}
    live = {r["mtbf"]: r["seconds"] for r in swept if r["method"] == "live"}
    for r in swept:
        mtbf = "none" if r["mtbf"] == 0 else f"{r['mtbf']} s"
        lines.append(f"| {mtbf} | {METHODS[r['method']]} | {r['failures']:.1f} | {r['seconds']:.2f} |"
                     f" {r['seconds'] / base[r['method']]:.3f}x | {r['seconds'] / live[r['mtbf']]:.3f}x |")
    lines += [
        "<!-- recovery-hosts:end -->",
    ]
    publish("recovery-hosts", lines)


if __name__ == "__main__":
    main()
