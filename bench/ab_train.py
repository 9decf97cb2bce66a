"""Training steps/s of two or more `steadfast` binaries on one shape, side by side: the
binaries' runs alternate, so that all see the same noise, and each figure counts the steps
after the first fifth (the warm-up), as bench/train_sweep.py does.

Usage: python3 bench/ab_train.py THREADS STEPS REPEAT BINARY... -- TRAIN_FLAGS
  e.g. python3 bench/ab_train.py 2 30 3 old/steadfast target/release/steadfast -- --model gpt --batch 32 --lr 2e-3
Prints one line per binary: its name, the median steps/s, and every run's.
"""
import json, os, statistics, subprocess, sys, tempfile


def steps_per_second(binary, threads, steps, flags):
    warm = max(1, steps // 5)
    with tempfile.TemporaryDirectory() as out:
        cmd = [binary, "train", "--steps", str(steps), "--eval-every", "0", "--eval-limit", "1", "--out", out, *flags]
        subprocess.run(cmd, check=True, env=dict(os.environ, RAYON_NUM_THREADS=str(threads)),
                       stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            done = {r["step"]: r["time"] for r in map(json.loads, f) if r.get("kind") == "train"}
    return (steps - warm) / (done[steps] - done[warm])


def main(argv):
    if "--" not in argv or len(argv[:argv.index("--")]) < 4:
        sys.exit(__doc__)
    sep = argv.index("--")
    threads, steps, repeat = (int(v) for v in argv[:3])
    binaries, flags = argv[3:sep], argv[sep + 1:]
    runs = {b: [] for b in binaries}
    for _ in range(repeat):
        for b in binaries:
            runs[b].append(steps_per_second(b, threads, steps, flags))
    for b in binaries:
        print(f"{b} {statistics.median(runs[b]):.2f} steps/s  " + " ".join(f"{r:.2f}" for r in runs[b]))


if __name__ == "__main__":
    main(sys.argv[1:])
