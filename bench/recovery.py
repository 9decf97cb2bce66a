"""Recovery from live replicas, measured side by side in one run:

1. state transfer throughput (`steadfast bench transfer`) for 10 MB to 1 GB from one and two
   sources, against the loopback's one-stream bandwidth measured by the same command;
2. the recovery timeline of a 3-worker elastic MLP job whose worker 0 crashes (detection,
   replacement started, quorum formed, state fetched, stepping again), from the launcher's
   timestamped lines and the replacement's `fetch` event, for states of 3 MB to 1 GB
   (`train --width`);
3. the failure-free cost of being ready to recover: the same 3-worker job as a static job
   (`launch --nproc 3`) and as an elastic one (`--max-restarts 1`, and with
   `--on-divergence repair`), in rounds, as ratios to the static job of the same round;
4. a fixed job under random crashes (`--fault crash:mtbf=S`) at several rates, recovered
   from live replicas and by the two baselines (`--recovery memory` and `checkpoint`).

Usage: python3 bench/recovery.py   (bench/run.sh recovery does this)
"""
import datetime, json, os, re, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, first_fetch, publish, recovery_stamps  # noqa: E402

# STEADFAST_BIN: a copy of the binary, so that a build during the run does not change it.
BIN = os.environ.get("STEADFAST_BIN") or os.path.join(ROOT, "target", "release", "steadfast")
TRAIN = ["train", "--model", "mlp", "--data", "fashion-mnist", "--micro-batch", "32", "--reduce", "reproducible",
         "--eval-every", "0"]


def transfer_rows():
    out = subprocess.run([BIN, "bench", "transfer", "--mb", "10,100,1000", "--sources", "1,2"], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# The MLP's widths for states of about 3 MB, 10 MB, 100 MB and 1 GB (AdamW: 12 bytes per parameter).
WIDTHS = [256, 800, 3300, 12000]


def timeline(tmp, width):
    """Times (s) from the crash of worker 0 to each stage of its recovery, from one job."""
    out_dir = os.path.join(tmp, f"timeline-{width}")
    steps = 400 if width == 256 else 8
    run = subprocess.run([BIN, "launch", "--nproc", "3", "--max-restarts", "1", "--", "train", "--model", "mlp",
                          "--data", "synthetic", "--width", str(width), "--batch", "48", "--micro-batch", "16",
                          "--eval-every", "0", "--steps", str(steps), "--out", out_dir,
                          "--fault", f"crash:rank=0,step={steps // 2},phase=update"],
                         check=True, capture_output=True, text=True)
    stamps = recovery_stamps(run.stdout.splitlines())
    fetch = first_fetch(os.path.join(out_dir, "metrics.jsonl"))
    stamps["fetch_seconds"] = fetch.get("seconds", float("nan"))
    stamps["fetch_bytes"] = fetch.get("bytes", 0)
    return stamps


def wall(args):
    """Wall time of a run, and the steps/s worker 0 reported (its time inside steps)."""
    t = time.perf_counter()
    out = subprocess.run([BIN, *args], check=True, capture_output=True, text=True).stdout
    seconds = time.perf_counter() - t
    rate = float(re.search(r"\[0\] steps:\s+\d+ at ([\d.]+) steps/s", out).group(1))
    return seconds, rate


OVERHEAD_ROUNDS = 9


def overhead(tmp):
    """Per variant: median wall time and steps/s, and the median (min, max) over rounds of the
    ratio to the static job of the same round, for the wall time and the time per step."""
    job = [*TRAIN, "--steps", "600", "--out", os.path.join(tmp, "overhead")]
    variants = {
        "static": ["launch", "--nproc", "3", "--", *job],
        "elastic": ["launch", "--nproc", "3", "--max-restarts", "1", "--", *job],
        "elastic, repair": ["launch", "--nproc", "3", "--max-restarts", "1", "--", *job, "--on-divergence", "repair"],
    }
    names = list(variants)
    runs = {k: [] for k in names}
    for i in range(OVERHEAD_ROUNDS):
        # The order turns every round, so that a drift of the machine's speed favours no one.
        for k in names[i % len(names):] + names[:i % len(names)]:
            runs[k].append(wall(variants[k]))
    out = {}
    for k, v in runs.items():
        walls = [s / b for (s, _), (b, _) in zip(v, runs["static"])]
        steps = [br / r for (_, r), (_, br) in zip(v, runs["static"])]
        out[k] = {
            "seconds": statistics.median(s for s, _ in v), "rate": statistics.median(r for _, r in v),
            "wall": (statistics.median(walls), min(walls), max(walls)),
            "step": (statistics.median(steps), min(steps), max(steps)),
        }
    return out


SWEEP_STEPS = 2000
SWEEP_MTBF = [None, 120, 60, 30]
SWEEP_SEEDS = [1, 2]
METHODS = {
    "live replicas": [],
    "in-memory copy every 100 steps": ["--recovery", "memory", "--save-every", "100"],
    "checkpoint every 100 steps": ["--recovery", "checkpoint", "--save-every", "100"],
}


def sweep(tmp):
    """Wall time and failures of a fixed job per method and per mean time between failures."""
    rows, reference = [], None
    for mtbf in SWEEP_MTBF:
        for method, flags in METHODS.items():
            times, failures = [], []
            for seed in (SWEEP_SEEDS if mtbf else [0]):
                fault = ["--fault", f"crash:mtbf={mtbf},seed={seed}"] if mtbf else []
                args = ["launch", "--nproc", "3", "--max-restarts", "100", "--heartbeat-timeout", "2", *flags, "--",
                        *TRAIN, "--steps", str(SWEEP_STEPS), "--out", os.path.join(tmp, "sweep"), *fault]
                t = time.perf_counter()
                out = subprocess.run([BIN, *args], check=True, capture_output=True, text=True).stdout
                times.append(time.perf_counter() - t)
                prints = set(re.findall(r"fingerprint: ([0-9a-f]{16})", out))
                reference = reference or next(iter(prints), None)
                if prints != {reference}:
                    raise SystemExit(f"{method} at mtbf {mtbf}: fingerprints {prints}, not {reference}")
                failures.append(out.count("replacing worker") + out.count("restarting every worker"))
            rows.append({"mtbf": mtbf, "method": method, "seconds": statistics.mean(times),
                         "failures": statistics.mean(failures)})
            print(rows[-1], file=sys.stderr)
    return rows


def main():
    with tempfile.TemporaryDirectory() as tmp:
        rows = transfer_rows()
        stamps = {w: timeline(tmp, w) for w in WIDTHS}
        costs = overhead(tmp)
        swept = sweep(tmp)
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
    lines += [
        "",
        "### Recovery timeline",
        "",
        "A 3-worker elastic job of the MLP on synthetic data (`--width W`: states of 3 MB to 1 GB, AdamW; micro-batches"
        " of 16); worker 0 crashes in the update of the middle step (of 400 steps for the smallest, 8 otherwise);"
        " seconds from the coordinator's loss of it to each stage. The replacement loads its data and builds its model"
        " before it joins; then it fetches the state from the two survivors. There is no catch-up: nothing is"
        " computed again.",
        "",
        "| state | replacement started | quorum formed | stepping again | of which the transfer |",
        "|---|---|---|---|---|",
    ]
    for w, st in stamps.items():
        lost = st.get("lost", float("nan"))
        lines.append(f"| {st['fetch_bytes'] / 1e6:.0f} MB | {st.get('replacement', float('nan')) - lost:.3f} |"
                     f" {st.get('quorum', float('nan')) - lost:.3f} | {st.get('stepping', float('nan')) - lost:.3f} |"
                     f" {st['fetch_seconds']:.3f} |")
    lines += [
        "",
        "The clock starts when the coordinator declares the worker lost; the time from the crash to that is"
        " not measured here (a crashed process's connection closes at once; a hung or cut-off worker is declared"
        " lost after `--heartbeat-timeout`, 10 s by default). The launcher and coordinator print times to 10 ms.",
        "",
        "### Failure-free cost of being ready to recover",
        "",
        "The same 600-step 3-worker job: wall time of the whole `launch`, and the steps/s worker 0 reports"
        f" (time inside steps only, without start-up). {OVERHEAD_ROUNDS} rounds, each running the three jobs one after"
        " the other in a turning order; the ratios are to the static job of the same round: median (min to max) over"
        " rounds. An elastic job hashes its state only when the protocol needs the fingerprint (to report after a"
        " failure, at the end); with `--on-divergence repair` it hashes it after every update and checks it before the"
        " next step, which is the price of finding a replica whose state changed at rest.",
        "",
        "| job | seconds | / static | steps/s | time per step / static |",
        "|---|---|---|---|---|",
    ]
    for k, c in costs.items():
        w, t = c["wall"], c["step"]
        lines.append(f"| {k} | {c['seconds']:.2f} | {w[0]:.3f}x ({w[1]:.3f} to {w[2]:.3f}) | {c['rate']:.1f} |"
                     f" {t[0]:.3f}x ({t[1]:.3f} to {t[2]:.3f}) |")
    base = {r["method"]: r["seconds"] for r in swept if r["mtbf"] is None}
    live = {r["mtbf"]: r["seconds"] for r in swept if r["method"] == "live replicas"}
    lines += [
        "",
        "### Under a sweep of failure rates",
        "",
        f"The job of the cost above for {SWEEP_STEPS} steps, each worker process crashing at a"
        " random moment drawn from an exponential distribution of the given mean (`--fault crash:mtbf=S,seed=N`; a"
        " replacement draws its own), recovered three ways: from the live replicas (replace, no rollback); by going"
        " back to an in-memory copy of the state (`--recovery memory`, Elastic Horovod's way); by restarting every"
        " worker from the last checkpoint (`--recovery checkpoint`). Mean of "
        f"{len(SWEEP_SEEDS)} seeds; every run ends with the failure-free bits.",
        "",
        "| mean time between failures, per worker | method | failures | seconds | / failure-free | / live replicas |",
        "|---|---|---|---|---|---|",
    ]
    for r in swept:
        mtbf = "none" if r["mtbf"] is None else f"{r['mtbf']} s"
        lines.append(f"| {mtbf} | {r['method']} | {r['failures']:.1f} | {r['seconds']:.2f} |"
                     f" {r['seconds'] / base[r['method']]:.3f}x | {r['seconds'] / live[r['mtbf']]:.3f}x |")
    lines.append("<!-- recovery:end -->")
    publish("recovery", lines)


if __name__ == "__main__":
    main()
