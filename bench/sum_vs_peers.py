"""Throughput of the reproducible sum against a naive f32 sum, a pairwise sum, rayon's
parallel sum, and the exact-summation crates `accurate` (OnlineExactSum, f32) and `xsum`
(f64 only), all measured in one process (bench/sum-bench); plus the deterministic
(sorted) scatter-add against the atomic one.

Usage: python3 bench/sum_vs_peers.py   (bench/run.sh sum does this)
"""
import datetime, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

THREADS = os.environ.get("THREADS", "2")
MAX_EXP = os.environ.get("MAX_EXP", "8")


def main():
    manifest = os.path.join(ROOT, "bench", "sum-bench", "Cargo.toml")
    subprocess.run(["cargo", "build", "--release", "--manifest-path", manifest], check=True)
    exe = os.path.join(ROOT, "bench", "sum-bench", "target", "release", "steadfast-sum-bench")
    out = subprocess.run([exe], check=True, capture_output=True, text=True,
                         env=dict(os.environ, THREADS=THREADS, MAX_EXP=MAX_EXP)).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.strip()]
    r = {(x["kernel"], x["n"], x["threads"]): x["elements_per_s"] for x in rows}
    t = int(THREADS)
    sizes = sorted({x["n"] for x in rows})
    g = lambda k, n, th=1: r.get((k, n, th), float("nan")) / 1e9
    lines = [
        "<!-- sum-vs-peers:start -->",
        "## Reproducible sum throughput against naive, pairwise and exact-summation crates",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh sum` (driver: `bench/sum_vs_peers.py`, harness: `bench/sum-bench`).",
        "- Inputs: uniform significands with random signs and exponents over 2^-20..2^20. Rates in 10^9 elements/s,"
        " median of 5 samples of at least 50 ms each, all kernels in one process. `repro` is exact and correctly"
        f" rounded; `accurate` is OnlineExactSum (exact, f32); `xsum` is exact but f64-only (run on the same values"
        f" widened to f64, beside `repro` on the same f64 data). {t} threads where marked.",
        "",
        f"| n | naive f32 | pairwise f32 | repro f32 | repro f32 ({t}t) | rayon f32 ({t}t, not reproducible) |"
        " accurate f32 | repro / naive | repro / accurate | xsum f64 | repro f64 | repro f64 / xsum |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in sizes:
        lines.append(
            f"| {n:.0e} | {g('naive_f32', n):.3f} | {g('pairwise_f32', n):.3f} | {g('repro_f32', n):.3f} |"
            f" {g('repro_f32', n, t):.3f} | {g('rayon_f32', n, t):.3f} | {g('accurate_exact_f32', n):.3f} |"
            f" {g('repro_f32', n) / g('naive_f32', n):.2f}x | {g('repro_f32', n) / g('accurate_exact_f32', n):.1f}x |"
            f" {g('xsum_f64', n):.3f} | {g('repro_f64', n):.3f} | {g('repro_f64', n) / g('xsum_f64', n):.2f}x |"
        )
    lines += ["", f"Scatter-add (`out[idx[i]] += v[i]`, n pairs into n/32 targets, {t} threads):", "",
              "| n | atomic (CAS) | sorted, deterministic | deterministic / atomic time |", "|---|---|---|---|"]
    for n in sizes:
        a, s = g("index_add_atomic", n, t), g("index_add_sorted", n, t)
        if a == a and s == s:
            lines.append(f"| {n:.0e} | {a:.3f} | {s:.3f} | {a / s:.2f}x |")
    lines.append("<!-- sum-vs-peers:end -->")
    publish("sum-vs-peers", lines)


if __name__ == "__main__":
    main()
