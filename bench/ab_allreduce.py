"""Side-by-side all-reduce times of two `steadfast` binaries (before and after a change to the
sum), on two transports of one host: loopback TCP (`steadfast bench allreduce`, each rank a
thread with its own TCP mesh) and the default mesh, whose ranks on one host exchange frames
through shared memory (`steadfast launch --nproc W -- bench collective`). Both sum as a
training step does: the rank's part read, the sum written beside it. The binaries take
turns run by run, REPEAT times; each cell is the median over the runs of the ratio
reproducible / fast measured within one run, and of the reproducible time.

Usage: python3 bench/ab_allreduce.py OLD_BINARY NEW_BINARY [--worlds 2,4] [--mb 4,64] [--repeat 3]
Prints a Markdown table.
"""
import argparse
import json
import os
import statistics
import subprocess


def loopback(binary, world, mbs):
    out = subprocess.run([binary, "bench", "allreduce", "--world", str(world), "--mb", ",".join(map(str, mbs)),
                          "--repeats", "5", "--modes", "fast,reproducible,reproducible32"],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["mb"]] = {m: r[f"{m}_seconds"] for m in ("fast", "reproducible", "reproducible32")}
    return rows


def shared_memory(binary, world, mbs):
    # Threads per rank = cores / ranks (at least one), as a job is run.
    env = dict(os.environ, RAYON_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // world)))
    out = subprocess.run([binary, "launch", "--nproc", str(world), "--", "bench", "collective", "--mb",
                          ",".join(map(str, mbs)), "--repeats", "5", "--reduce", "fast,reproducible,reproducible32"],
                         capture_output=True, text=True, check=True, timeout=600, env=env).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("[0] {"):
            r = json.loads(line[4:])
            rows.setdefault(r["mb"], {})[r["mode"]] = r["seconds"]
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--worlds", default="2,4")
    ap.add_argument("--mb", default="4,64")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    worlds = [int(w) for w in a.worlds.split(",")]
    mbs = [int(m) for m in a.mb.split(",")]
    runs = {}  # (transport, world, mb, side, mode) -> [seconds]
    ratios = {}  # (transport, world, mb, side, mode) -> [mode / fast]
    for _ in range(a.repeat):
        for side, binary in (("old", a.old), ("new", a.new)):
            for world in worlds:
                for transport, f in (("loopback TCP", loopback), ("shared memory", shared_memory)):
                    for mb, t in f(binary, world, mbs).items():
                        for mode, secs in t.items():
                            runs.setdefault((transport, world, mb, side, mode), []).append(secs)
                            ratios.setdefault((transport, world, mb, side, mode), []).append(secs / t["fast"])
    med = statistics.median
    print("| transport | ranks | message | fast ms, old / new | reproducible ms, old -> new | "
          "reproducible / fast, old -> new | reproducible32 / fast, old -> new |")
    print("|---|---|---|---|---|---|---|")
    for transport in ("loopback TCP", "shared memory"):
        for world in worlds:
            for mb in mbs:
                k = lambda side, mode: (transport, world, mb, side, mode)
                r32 = "-"
                if k("old", "reproducible32") in ratios:
                    r32 = f"{med(ratios[k('old', 'reproducible32')]):.2f}x -> {med(ratios[k('new', 'reproducible32')]):.2f}x"
                print(f"| {transport} | {world} | {mb} MB | {1e3 * med(runs[k('old', 'fast')]):.2f} / "
                      f"{1e3 * med(runs[k('new', 'fast')]):.2f} | {1e3 * med(runs[k('old', 'reproducible')]):.2f} -> "
                      f"{1e3 * med(runs[k('new', 'reproducible')]):.2f} | {med(ratios[k('old', 'reproducible')]):.2f}x -> "
                      f"{med(ratios[k('new', 'reproducible')]):.2f}x | {r32} |")


if __name__ == "__main__":
    main()
