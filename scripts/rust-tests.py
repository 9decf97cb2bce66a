#!/usr/bin/env python3
"""Run the workspace's Rust tests as `cargo test --release --workspace` does, two test
binaries at a time.

`cargo test` runs one test binary after another. Many of Steadfast's binaries spend most of
their time waiting (an etcd lease to expire, a killed worker to be noticed, a link shaped to
1 Gbit/s), so one at a time leaves the cores idle for about 40% of the run. This builds the
tests with cargo (the same features and flags as `cargo test --release --workspace`), then
runs each test binary in its package's directory, as cargo does, `--jobs` at a time, the
slowest first (by the times of the previous run kept in target/, or the list below on a fresh
machine), and the doc tests last. Each binary's output is printed whole when it ends; the run
fails if any binary fails, after all of them ran, naming them.

    scripts/rust-tests.py              # what scripts/test.sh runs
    scripts/rust-tests.py --jobs 1     # one binary at a time, like cargo test
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
TIMES = ROOT / "target" / "rust-test-times.json"
# The slowest binaries on a 2-core machine (2026-11-30), started first on a fresh machine
# when no earlier run's times are kept.
SLOW_FIRST = ["etcd_cli", "multihost", "chaos_cli", "cpu_kinds", "slurm_cli", "pipeline_recovery_cli",
              "train_cli", "recovery_cli", "study_cli", "behaviour", "pipeline_cli", "launch_cli"]
CARGO = ["cargo", "test", "--release", "--locked", "--workspace"]


def test_binaries():
    """(name, package directory, executable) of every test binary, built by cargo."""
    out = subprocess.run([*CARGO, "--no-run", "--message-format=json-render-diagnostics"], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit(f"cargo could not build the tests (exit {out.returncode})")
    found = []
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg["profile"]["test"] or not msg.get("executable"):
            continue
        target = msg["target"]
        package = pathlib.Path(msg["manifest_path"]).parent
        found.append((f"{package.name}/{target['name']} ({target['kind'][0]})", package, msg["executable"]))
    return found


def run(name, cwd, cmd, env):
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=2, help="test binaries at a time (default 2)")
    a = ap.parse_args()
    began = time.monotonic()
    binaries = test_binaries()
    try:
        kept = json.loads(TIMES.read_text())
    except (OSError, ValueError):
        kept = {}
    hint = {n: len(SLOW_FIRST) - k for k, n in enumerate(SLOW_FIRST)}
    binaries.sort(key=lambda b: (kept.get(b[0], 0.0), hint.get(b[0].split("/")[1].split(" ")[0], 0)), reverse=True)
    jobs = [(name, cwd, [exe], {"CARGO_MANIFEST_DIR": str(cwd), "CARGO_PKG_NAME": cwd.name})
            for name, cwd, exe in binaries]
    # The doc tests need cargo (rustdoc builds each one), which no other job uses by now.
    jobs.append(("doc tests", ROOT, [*CARGO, "--doc"], {}))

    lock = threading.Lock()
    queue = list(jobs)
    failed, took = [], {}

    def lane():
        while True:
            with lock:
                if not queue:
                    return
                name, cwd, cmd, extra = queue.pop(0)
            code, output, seconds = run(name, cwd, cmd, {**os.environ, **extra})
            with lock:
                took[name] = seconds
                print(f"== {name}: {'ok' if code == 0 else f'FAILED (exit {code})'} in {seconds:.1f} s "
                      f"(at {time.monotonic() - began:.0f} s)\n{output}", flush=True)
                if code != 0:
                    failed.append(name)

    lanes = [threading.Thread(target=lane) for _ in range(max(1, a.jobs))]
    for t in lanes:
        t.start()
    for t in lanes:
        t.join()
    TIMES.parent.mkdir(exist_ok=True)
    TIMES.write_text(json.dumps({**kept, **took}, indent=1, sort_keys=True))
    slowest = sorted(took.items(), key=lambda kv: kv[1], reverse=True)[:8]
    print("== the slowest: " + ", ".join(f"{n} {s:.0f} s" for n, s in slowest))
    if failed:
        sys.exit(f"{len(failed)} of {len(jobs)} test binaries failed: {', '.join(failed)}")
    print(f"== all {len(jobs)} test binaries passed in {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
