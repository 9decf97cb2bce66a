"""Recovery from live replicas, measured side by side in one run:

1. state transfer throughput (`steadfast bench transfer`) for 10 MB to 1 GB from one and two
   sources, against the loopback's one-stream bandwidth measured by the same command;
2. the recovery timeline of a 3-worker elastic MLP job whose worker 0 crashes (detection,
   replacement started, quorum formed, state fetched, stepping again), from the launcher's
   timestamped lines and the replacement's `fetch` event;
3. the failure-free cost of being ready to recover: the same 3-worker job as a static job
   (`launch --nproc 3`) and as an elastic one (`--max-restarts 1`, and with
   `--on-divergence repair`), alternating, median of 3 wall times.

Usage: python3 bench/recovery.py   (bench/run.sh recovery does this)
"""
import datetime, json, os, re, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, write_section  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
TRAIN = ["train", "--model", "mlp", "--data", "fashion-mnist", "--micro-batch", "32", "--reduce", "reproducible",
         "--eval-every", "0"]


def transfer_rows():
    out = subprocess.run([BIN, "bench", "transfer", "--mb", "10,100,1000", "--sources", "1,2"], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def timeline(tmp):
    """Times (s) from the crash of worker 0 to each stage of its recovery, from one job."""
    out_dir = os.path.join(tmp, "timeline")
    run = subprocess.run([BIN, "launch", "--nproc", "3", "--max-restarts", "1", "--", *TRAIN, "--steps", "400",
                          "--out", out_dir, "--fault", "crash:rank=0,step=200,phase=update"],
                         check=True, capture_output=True, text=True)
    stamps = {}
    for line in run.stdout.splitlines():
        m = re.match(r"\[(coordinator|launcher)\]\s+([\d.]+) s\s+(.*)", line)
        if not m:
            continue
        t, what = float(m.group(2)), m.group(3)
        if what.startswith("worker 0 lost") and "lost" not in stamps:
            stamps["lost"] = t
        elif what.startswith("worker 0 started: process 2"):
            stamps["replacement"] = t
        elif "fetch the state" in what and "quorum" not in stamps:
            stamps["quorum"] = t
        elif what.endswith(" steps") and "quorum" in stamps and "stepping" not in stamps:
            stamps["stepping"] = t
    fetch = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl")) if '"fetch"' in l]
    stamps["fetch_seconds"] = fetch[0]["seconds"] if fetch else float("nan")
    stamps["fetch_bytes"] = fetch[0]["bytes"] if fetch else 0
    return stamps


def wall(args):
    """Wall time of a run, and the steps/s worker 0 reported (its time inside steps)."""
    t = time.perf_counter()
    out = subprocess.run([BIN, *args], check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - t
    rate = float(re.search(r"\[0\] steps:\s+\d+ at ([\d.]+) steps/s", out).group(1))
    return seconds, rate


def overhead(tmp):
    job = [*TRAIN, "--steps", "600", "--out", os.path.join(tmp, "overhead")]
    variants = {
        "static": ["launch", "--nproc", "3", "--", *job],
        "elastic": ["launch", "--nproc", "3", "--max-restarts", "1", "--", *job],
        "elastic, repair": ["launch", "--nproc", "3", "--max-restarts", "1", "--", *job, "--on-divergence", "repair"],
    }
    runs = {k: [] for k in variants}
    for _ in range(3):
        for k, args in variants.items():
            runs[k].append(wall(args))
    return {k: (statistics.median(s for s, _ in v), statistics.median(r for _, r in v)) for k, v in runs.items()}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        rows = transfer_rows()
        stamps = timeline(tmp)
        costs = overhead(tmp)
    lines = [
        "<!-- recovery:start -->",
        "## Recovery from live replicas",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh recovery` (driver: `bench/recovery.py`; Rust side: `steadfast bench transfer`,"
        " `steadfast launch --max-restarts`).",
        "",
        "### State transfer",
        "",
        "A fetcher takes a state of f32 from 1 or 2 sources over authenticated loopback TCP, in checksummed chunks"
        " (`comm::transfer`), each source a port of its own in one process; every fetch is checked equal to the"
        " sources' state. *Loopback* is one raw TCP stream's one-way bandwidth, measured by the same command: the"
        " bound for one receiver. Median of 3.",
        "",
        "| state | sources | seconds | MB/s | / loopback |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['mb']} MB | {r['sources']} | {r['seconds']:.3f} | {r['mb_per_s']:.0f} |"
                     f" {r['mb_per_s'] / r['loopback_mb_per_s']:.0%} |")
    lines.append(f"\nLoopback bound: {rows[0]['loopback_mb_per_s']:.0f} MB/s.")
    lost = stamps.get("lost", float("nan"))
    lines += [
        "",
        "### Recovery timeline",
        "",
        "A 3-worker elastic MLP job on Fashion-MNIST (micro-batches of 32, `reproducible`, 400 steps); worker 0"
        f" crashes in the update of step 200; times from the coordinator's loss of it (the state is"
        f" {stamps['fetch_bytes'] / 1e6:.1f} MB).",
        "",
        "| stage | seconds after the loss |",
        "|---|---|",
        f"| replacement process started | {stamps.get('replacement', float('nan')) - lost:.3f} |",
        f"| quorum formed (the replacement joined, with data loaded and model built) | {stamps.get('quorum', float('nan')) - lost:.3f} |",
        f"| state fetched (transfer alone: {stamps['fetch_seconds']:.3f} s) and stepping again | {stamps.get('stepping', float('nan')) - lost:.3f} |",
        "",
        "Detection of a crash is immediate (the connection closes); a hung or cut-off worker is found after"
        " `--heartbeat-timeout` (10 s by default).",
        "",
        "### Failure-free cost of being ready to recover",
        "",
        "The same 600-step 3-worker job: wall time of the whole `launch`, and the steps/s worker 0 reports"
        " (time inside steps only, without start-up); median of 3 alternating runs.",
        "",
        "| job | seconds | / static | steps/s | time per step / static |",
        "|---|---|---|---|---|",
    ]
    static_s, static_rate = costs["static"]
    for k, (s, rate) in costs.items():
        lines.append(f"| {k} | {s:.2f} | {s / static_s:.3f}x | {rate:.1f} | {static_rate / rate:.3f}x |")
    lines.append("<!-- recovery:end -->")
    section = "\n".join(lines)
    write_section(os.path.join(ROOT, "docs", "benchmarks.md"), "recovery", section)
    print(section)


if __name__ == "__main__":
    main()
