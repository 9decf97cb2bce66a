"""Checkpoint cost, side by side in one run: Steadfast's save (persist) bandwidth against
the disk's own sequential write+fsync bandwidth (dd), its training stall against a plain
memcpy of the same bytes, and its save/load times against torch.save/torch.load and
Python safetensors save_file/load_file (with fsync) on the same tensors. Loads are cold
(page cache dropped before each) when running as root.

Usage: bench/.venv/bin/python bench/ckpt_vs_peers.py   (bench/run.sh ckpt does this)
"""
import datetime, json, os, statistics, subprocess, sys, time

import torch
from safetensors.numpy import load_file as np_load_file
from safetensors.torch import load_file as st_load_file, save_file as st_save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, fsync_path, publish  # noqa: E402

BIN = os.path.join(ROOT, "target", "release", "steadfast")
SIZES = [int(x) for x in os.environ.get("SIZES_MB", "100,1000").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "3"))
SCRATCH = os.environ.get("SCRATCH", os.path.join(ROOT, "bench", "out", "ckpt"))
COLD = os.geteuid() == 0


def drop_caches():
    if COLD:
        subprocess.run(["sync"], check=True)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")


def touch(tensors):
    """Reads one byte of every page of every tensor, so that lazily mapped data is really
    loaded: the peers' load times then cover the same work as Steadfast's (every byte
    read; Steadfast also hashes it)."""
    total = 0
    for t in tensors.values():
        total += int(t.reshape(-1).view(torch.uint8)[::4096].sum())
    return total


def dd_mb_per_s(mb):
    path = os.path.join(SCRATCH, "dd.bin")
    t = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mb}", "conv=fsync"],
                   check=True, capture_output=True)
    secs = time.perf_counter() - t
    os.remove(path)
    return mb * 1.048576 / secs  # dd counts MiB


def steadfast(mb):
    cmd = [BIN, "bench", "ckpt", "--dir", SCRATCH, "--mb", str(mb), "--shards", "1,2,4", "--repeats", "3"]
    if COLD:
        cmd.append("--drop-caches")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def peers(mb, checkpoint_dir):
    tensors = {}
    for name in sorted(os.listdir(checkpoint_dir)):
        if name.endswith(".safetensors"):
            tensors.update({k: torch.from_numpy(v) for k, v in np_load_file(os.path.join(checkpoint_dir, name)).items()})
    res = {}
    pt = os.path.join(SCRATCH, "peer.pt")
    st = os.path.join(SCRATCH, "peer.safetensors")
    t = time.perf_counter()
    with open(pt, "wb") as f:
        torch.save(tensors, f)
        f.flush()
        os.fsync(f.fileno())
    res["torch_save"] = time.perf_counter() - t
    drop_caches()
    t = time.perf_counter()
    touch(torch.load(pt))
    res["torch_load"] = time.perf_counter() - t
    t = time.perf_counter()
    st_save_file(tensors, st)
    fsync_path(st)
    res["st_save"] = time.perf_counter() - t
    drop_caches()
    t = time.perf_counter()
    touch(st_load_file(st))
    res["st_load"] = time.perf_counter() - t
    os.remove(pt)
    os.remove(st)
    return res


def main():
    os.makedirs(SCRATCH, exist_ok=True)
    rows = []
    for mb in SIZES:
        dd, ours, theirs = [], [], []
        for _ in range(ROUNDS):
            dd.append(dd_mb_per_s(mb))
            runs = steadfast(mb)
            ours.append(runs)
            theirs.append(peers(mb, runs[-1]["checkpoint"]))
        med = lambda xs: statistics.median(xs)
        by_shards = {}
        for runs in ours:
            for r in runs:
                by_shards.setdefault(r["shards"], []).append(r)
        best = max(by_shards, key=lambda s: med([r["save_mb_per_s"] for r in by_shards[s]]))
        b = by_shards[best]
        row = {
            "mb": mb, "dd": med(dd), "shards": best,
            "save_mbps": {s: med([r["save_mb_per_s"] for r in rs]) for s, rs in by_shards.items()},
            "save": med([r["save_seconds"] for r in b]), "load": med([r["load_seconds"] for r in b]),
            "stall": med([r["snapshot_stall_seconds"] for r in b]), "memcpy": med([r["memcpy_seconds"] for r in b]),
            "torch_save": med([p["torch_save"] for p in theirs]), "torch_load": med([p["torch_load"] for p in theirs]),
            "st_save": med([p["st_save"] for p in theirs]), "st_load": med([p["st_load"] for p in theirs]),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    lines = [
        "<!-- ckpt-vs-peers:start -->",
        "## Checkpoint save, load and stall against the disk and PyTorch's savers",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; "
        f"PyTorch {torch.__version__}; scratch directory on the same disk as the checkpoints.",
        "- Command: `bench/run.sh ckpt` (driver: `bench/ckpt_vs_peers.py`, Rust side: `steadfast bench ckpt`).",
        f"- State of 24 f32 tensors of mixed sizes; median of {ROUNDS} rounds (Steadfast: median of 3 repetitions per round);"
        " each round runs dd, Steadfast, then the peers. Every save includes fsync; "
        + ("loads are cold (page cache dropped before each)." if COLD else "loads are warm (not root: the page cache could not be dropped)."),
        "- Peers save the very tensors of Steadfast's checkpoint (read from its shards). A load counts until every byte"
        " is in memory: safetensors maps its file lazily, so one byte of every page is touched inside the timed region"
        " (torch.load too, for symmetry); Steadfast's load also verifies every checksum.",
        "",
        "| state | dd write+fsync MB/s | Steadfast save MB/s (1 / 2 / 4 shards) | best vs dd |"
        " save s: Steadfast / torch.save / safetensors | load s: Steadfast (verified) / torch.load / safetensors |"
        " stall vs memcpy |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sm = r["save_mbps"]
        shards = " / ".join(f"{sm[s]:.0f}" for s in sorted(sm))
        lines.append(
            f"| {r['mb']} MB | {r['dd']:.0f} | {shards} | {sm[r['shards']] / r['dd']:.2f}x |"
            f" {r['save']:.3f} / {r['torch_save']:.3f} / {r['st_save']:.3f} |"
            f" {r['load']:.3f} / {r['torch_load']:.3f} / {r['st_load']:.3f} |"
            f" {r['stall'] * 1e3:.1f} ms / {r['memcpy'] * 1e3:.1f} ms = {r['stall'] / r['memcpy']:.2f}x |"
        )
    lines.append("<!-- ckpt-vs-peers:end -->")
    publish("ckpt-vs-peers", lines)


if __name__ == "__main__":
    main()
