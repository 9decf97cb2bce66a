"""The engines benchmark's ratios measured as interleaved pairs, for figures too close to
call from best-of-N runs: an elastic job (`launch --max-restarts 1`) against the same
static job (ELASTIC), a one-rank job (`launch --nproc 1`) against `train` alone (ONE),
Steadfast against MPI (MPI), and one build against another (AB). Each pair
runs both, the order alternating from pair to pair; the ratio is taken within the pair,
so a drift in the machine's speed falls on both sides. Prints one JSON line per cell:
the median ratio, its quartiles, each side's median steps/s and the fingerprints (each
side's runs must agree; the two sides must too, but for MPI's `fast` sums on more than two
ranks, which add in another order).

    bench/run.sh engines-pairs
    PAIRS=8 ELASTIC=mlp:2:fast,mlp:4:reproducible ONE=cnn:fast MPI=mlp:4:fast bench/run.sh engines-pairs

Two builds of Steadfast against each other (a change's before and after), a static job of
each cell run by the second build against the same job run by the first:

    BUILDS=/tmp/before,/tmp/after AB=mlp:4:fast,cnn:4:fast ELASTIC= ONE= MPI= bench/run.sh engines-pairs

(AB_ENGINE=elastic pairs elastic jobs instead.)
"""
import json
import os
import statistics
import sys

os.environ.setdefault("STEPS", "1000")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import engines  # noqa: E402

BIN = engines.BIN

PAIRS = int(os.environ.get("PAIRS", "8"))
ELASTIC = os.environ.get("ELASTIC", "mlp:2:fast,mlp:2:reproducible,mlp:4:fast,mlp:4:reproducible,cnn:2:reproducible")
ONE = os.environ.get("ONE", "mlp:fast,mlp:reproducible,cnn:fast")
MPI = os.environ.get("MPI", "mlp:2:fast,mlp:4:fast,cnn:4:fast")
AB = os.environ.get("AB", "")
AB_ENGINE = os.environ.get("AB_ENGINE", "steadfast")
BUILDS = dict(zip(("before", "after"), filter(None, os.environ.get("BUILDS", "").split(","))))


def cells():
    for c in filter(None, ELASTIC.split(",")):
        model, world, mode = c.split(":")
        yield "elastic", "steadfast", model, int(world), mode
    for c in filter(None, ONE.split(",")):
        model, mode = c.split(":")
        yield "steadfast", "alone", model, 1, mode
    for c in filter(None, MPI.split(",")):
        model, world, mode = c.split(":")
        yield "steadfast", "mpi", model, int(world), mode
    for c in filter(None, AB.split(",")):
        if len(BUILDS) != 2:
            sys.exit("AB needs BUILDS=BEFORE,AFTER: the two binaries to pair")
        model, world, mode = c.split(":")
        yield "after", "before", model, int(world), mode


def pairs(a, b, model, world, mode):
    ratios, steps = [], {a: [], b: []}
    prints = {a: set(), b: set()}
    for i in range(PAIRS):
        got = {}
        for engine in ((a, b) if i % 2 == 0 else (b, a)):
            engines.BIN = BUILDS.get(engine, BIN)
            rate, fingerprint = engines.train_once(AB_ENGINE if engine in BUILDS else engine, model, world, mode)
            got[engine] = rate
            steps[engine].append(rate)
            prints[engine].add(fingerprint)
        ratios.append(got[a] / got[b])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return {"cell": f"{a} / {b}", "model": model, "world": world, "mode": mode,
            "median_ratio": round(statistics.median(ratios), 3), "q1": round(q1, 3), "q3": round(q3, 3),
            a: round(statistics.median(steps[a]), 1), b: round(statistics.median(steps[b]), 1),
            "fingerprints": {e: sorted(p) for e, p in prints.items()}}


def main():
    for cell in cells():
        row = pairs(*cell)
        print(json.dumps(row), flush=True)
        prints = row["fingerprints"]
        if any(len(p) != 1 for p in prints.values()):
            sys.exit(f"fingerprints differ between runs: {row}")
        other_order = "mpi" in prints and row["mode"] == "fast" and row["world"] > 2
        if len({p[0] for p in prints.values()}) != 1 and not other_order:
            sys.exit(f"fingerprints differ between the engines: {row}")


if __name__ == "__main__":
    main()
