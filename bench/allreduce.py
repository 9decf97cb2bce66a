"""All-reduce bus bandwidth over loopback TCP, for 1..256 MB, against the loopback's own
one-way bandwidth measured in the same process, and the cost of the reproducible mode
against the fast one. Each rank is a thread of one process with its own TCP mesh.

Usage: python3 bench/allreduce.py   (bench/run.sh allreduce does this)
"""
import datetime, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
WORLDS = [int(w) for w in os.environ.get("WORLDS", "2,4").split(",")]


def busy(row, mode):
    """Cores busy during one all-reduce in `mode`: CPU seconds over wall seconds of the same span."""
    return f"{row[mode + '_cores_busy']:.1f}"


def main():
    lines = [
        "<!-- allreduce:start -->",
        "## All-reduce bandwidth over loopback TCP",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh allreduce` (driver: `bench/allreduce.py`, Rust side: `steadfast bench allreduce`).",
        "- Ring all-reduce of f32 vectors, each rank a thread with its own authenticated TCP mesh on 127.0.0.1; median of 5."
        " Bus bandwidth = 2(W-1)/W x message / time (NCCL's definition). Two baselines measured by the same command:"
        " *loopback* = one TCP stream's one-way bandwidth with the machine otherwise idle; *ring* = the per-stream"
        " bandwidth when W raw TCP streams run at once in a ring (every rank sending and receiving), which is what a"
        " ring step can get when W ranks share the cores.",
        "",
        "*reproducible* is the 64-bit fixed-point sum; *reproducible32* the 32-bit one (half the integer bytes, about a"
        " float sum's accuracy, at most 128 parts). The three modes take turns repetition by repetition.",
        "*cores busy* = the process's CPU time (every rank, user and system) over the wall time of the same span,"
        " from a barrier before one all-reduce to a barrier after every rank finished it (medians of each);"
        f" the machine has {os.cpu_count()}. A mode that keeps every core busy is bound by CPU, and its time"
        " against `fast` follows its CPU time against `fast`'s.",
        "",
        "| ranks | message | loopback MB/s | ring MB/s | fast bus MB/s | fast / loopback | fast / ring |"
        " reproducible bus MB/s | reproducible / fast time | reproducible32 bus MB/s | reproducible32 / fast time |"
        " cores busy: fast, reproducible, reproducible32 | reproducible / fast CPU time | reproducible32 / fast CPU time |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w in WORLDS:
        out = subprocess.run([BIN, "bench", "allreduce", "--world", str(w)], check=True, capture_output=True, text=True).stdout
        for r in (json.loads(l) for l in out.splitlines() if l.strip()):
            lines.append(
                f"| {w} | {r['mb']} MB | {r['loopback_mb_per_s']:.0f} | {r['ring_loopback_mb_per_s']:.0f} |"
                f" {r['fast_bus_mb_per_s']:.0f} | {r['fast_bus_mb_per_s'] / r['loopback_mb_per_s']:.2f}x |"
                f" {r['fast_bus_mb_per_s'] / r['ring_loopback_mb_per_s']:.2f}x | {r['reproducible_bus_mb_per_s']:.0f} |"
                f" {r['reproducible_seconds'] / r['fast_seconds']:.2f}x | {r['reproducible32_bus_mb_per_s']:.0f} |"
                f" {r['reproducible32_seconds'] / r['fast_seconds']:.2f}x |"
                f" {busy(r, 'fast')}, {busy(r, 'reproducible')}, {busy(r, 'reproducible32')} |"
                f" {r['reproducible_cpu_seconds'] / r['fast_cpu_seconds']:.2f}x |"
                f" {r['reproducible32_cpu_seconds'] / r['fast_cpu_seconds']:.2f}x |"
            )
            print(lines[-1], flush=True)
    lines.append("<!-- allreduce:end -->")
    publish("allreduce", lines)


if __name__ == "__main__":
    main()
