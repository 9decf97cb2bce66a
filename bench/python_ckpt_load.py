"""What loading a checkpoint and the first asynchronous save cost a PyTorch loop:
steadfast.torch.load against torch.load, and AsyncCheckpointer's first stall against its
later ones.

Load. Three states (8 tensors of 100 MB in all, 8 of 500 MB, and 8,000 small tensors)
are saved once with torch.save and once with steadfast.torch.save; each loader then runs
in a fresh process (so that its peak memory is its own), the loaders taking turns, REPEAT
times, from the page cache (the files were just written). *Peak* is the growth of the
process's peak resident memory over the load, against the state's size.
steadfast.torch.load verifies every byte's checksum as it reads; torch.load checks
nothing. `into=` reads into tensors the process allocated before the load (a module's own
parameters), so its peak counts no tensor memory at all.

First asynchronous save. A fresh process builds the state, makes an AsyncCheckpointer and
saves five times, waiting for each write; the first save's stall is set against the
median of the others, without and with `prepare(state)` called right after the
checkpointer was made (the loop then trains for a second before it first saves).

Usage: bench/run.sh python-ckpt (this runs after bench/python_ckpt.py). Environment:
REPEAT (default 5).
"""
import datetime, json, os, shutil, statistics, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, publish  # noqa: E402

REPEAT = int(os.environ.get("REPEAT", "5"))
STATES = {"100 MB": ("big", 100), "500 MB": ("big", 500), "8,000 tensors": ("many", 8000)}

CHILD = r"""
import json, os, resource, sys, time
import torch
torch.set_num_threads(1)
import steadfast.torch as st

def state(kind, size):
    g = torch.Generator().manual_seed(0)
    if kind == "big":
        n = size * 1000 * 1000 // 4 // 8
        return {f"layer{i}.weight": torch.randn(n, generator=g) for i in range(8)}
    return {f"block{i}.weight": torch.randn(2048, generator=g) for i in range(size)}

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

what, kind, size, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if what == "make":
    s = state(kind, size)
    torch.save(s, os.path.join(path, "state.pt"))
    st.save(s, os.path.join(path, "root"), step=1)
elif what in ("torch.load", "steadfast.torch.load", "steadfast.torch.load(into=)"):
    into = None
    if what.endswith("(into=)"):
        into = {k: torch.empty_like(v) for k, v in state(kind, size).items()}
    before = max(rss(), peak())
    began = time.perf_counter()
    if what == "torch.load":
        got = torch.load(os.path.join(path, "state.pt"))
    else:
        got = st.load(os.path.join(path, "root"), into=into)
    took = time.perf_counter() - began
    print(json.dumps({"seconds": took, "peak": peak() - before}))
else:
    s = state(kind, size)
    with st.AsyncCheckpointer(os.path.join(path, f"{what}-{os.getpid()}"), keep_last=1) as saver:
        if what == "prepared":
            saver.prepare(s)
            time.sleep(1.0)
        for step in range(5):
            saver.save(s, step)
            saver.wait()
    print(json.dumps({"stalls": saver.stalls}))
"""


def child(*args):
    out = subprocess.run([sys.executable, "-c", CHILD, *map(str, args)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1]) if out.stdout.strip() else None


LOADERS = ["torch.load", "steadfast.torch.load", "steadfast.torch.load(into=)"]


def main():
    base = os.environ.get("BENCH_DIR", "/var/tmp")
    rows, stalls = [], []
    for label, (kind, size) in STATES.items():
        d = tempfile.mkdtemp(dir=base)
        try:
            child("make", kind, size, d)
            state_bytes = os.path.getsize(os.path.join(d, "state.pt"))
            runs = {k: [] for k in LOADERS}
            for r in range(REPEAT):
                for loader in LOADERS[r % 3:] + LOADERS[:r % 3]:
                    runs[loader].append(child(loader, kind, size, d))
            for loader in LOADERS:
                secs = statistics.median(x["seconds"] for x in runs[loader])
                peak = statistics.median(x["peak"] for x in runs[loader])
                rows.append((label, state_bytes, loader, secs, peak))
                print(rows[-1], flush=True)
            if kind == "big":
                for mode in ("unprepared", "prepared"):
                    firsts, warms = [], []
                    for _ in range(max(3, REPEAT // 2)):
                        s = child(mode, kind, size, d)["stalls"]
                        firsts.append(s[0])
                        warms.append(statistics.median(s[1:]))
                    stalls.append((label, mode, statistics.median(firsts), statistics.median(warms)))
                    print(stalls[-1], flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    import torch
    lines = [
        "<!-- python-load:start -->",
        "## PyTorch checkpoints loaded: steadfast.torch.load against torch.load, and the first asynchronous save",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch"
        f" {torch.__version__}, one thread; the disk under {base}, files in the page cache.",
        f"- Command: `REPEAT={REPEAT} bench/run.sh python-ckpt` (driver: `bench/python_ckpt_load.py`).",
        "- Each load runs in a fresh process, the loaders taking turns; medians of"
        f" {REPEAT}. *peak*: the growth of the process's peak resident memory over the load. `steadfast.torch.load`"
        " verifies every byte's checksum as it reads (and would pass over a damaged newest checkpoint);"
        " `torch.load` checks nothing. `into=` reads into tensors allocated before the load (a module's parameters).",
        "",
        "| state | loader | load (ms) | vs torch.load | peak (MB) | peak vs torch.load |",
        "|---|---|---|---|---|---|",
    ]
    ref = {(r[0]): (r[3], r[4]) for r in rows if r[2] == "torch.load"}
    for label, _size, loader, secs, peak in rows:
        t0, p0 = ref[label]
        lines.append(f"| {label} | {loader} | {secs * 1e3:.0f} | {secs / t0:.2f}x | {peak / 1e6:.0f} |"
                     f" {peak / p0:.2f}x |")
    lines += [
        "",
        "The first save of an `AsyncCheckpointer` against its later ones (a fresh process each time; medians of"
        f" {max(3, REPEAT // 2)} processes, the later saves' stall the median of four). *prepared*: `prepare(state)`"
        " right after the checkpointer was made, a second before the first save.",
        "",
        "| state | first save | first stall (ms) | later stalls (ms) | first / later |",
        "|---|---|---|---|---|",
    ]
    for label, mode, first, warm in stalls:
        lines.append(f"| {label} | {mode} | {first * 1e3:.0f} | {warm * 1e3:.0f} | {first / warm:.2f}x |")
    lines.append("<!-- python-load:end -->")
    publish("python-load", lines)


if __name__ == "__main__":
    main()
