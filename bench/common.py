"""Helpers shared by the benchmark drivers (and imported into every framework's
environment, so they need nothing beyond NumPy)."""
import gzip
import os
import platform

# Fashion-MNIST's pixel mean and standard deviation, as Steadfast normalises.
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def fashion_mnist(dir_, prefix="train"):
    """Images as float32 [n, 784], normalised as Steadfast does, and labels as int64."""
    import numpy as np
    with gzip.open(os.path.join(dir_, f"{prefix}-images-idx3-ubyte.gz")) as f:
        raw = f.read()
    n = int.from_bytes(raw[4:8], "big")
    x = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, 784).astype(np.float32)
    with gzip.open(os.path.join(dir_, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), dtype=np.uint8, offset=8).astype(np.int64)
    x = (x / np.float32(255.0) - np.float32(PIXEL_MEAN)) / np.float32(PIXEL_STD)
    return x.astype(np.float32), y


def last_words(text, lines=1):
    """The last `lines` lines of a failed command's output, joined (a framework's own log
    chatter left out): what to quote when it fails."""
    kept = [l.strip() for l in (text or "").strip().splitlines()
            if l.strip() and not l.startswith(("I0000", "W0000", "WARNING"))]
    return " / ".join(kept[-lines:])[:200 * lines] if kept else "?"


def fsync_path(path):
    """Makes the file at `path` durable (a saver that does not fsync, made comparable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_section(path, name, section):
    """Replaces the section between `<!-- name:start -->` and `<!-- name:end -->` of the
    Markdown file at `path`, or appends it."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        after = rest.split(end, 1)[1]
        text = before + section + after
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with open(path, "w") as f:
        f.write(text)


def publish(name, lines):
    """Prints a benchmark's section (its lines, markers included) and writes it into
    docs/benchmarks.md in place of the section of the same name."""
    section = "\n".join(lines)
    print(section)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    write_section(os.path.join(root, "docs", "benchmarks.md"), name, section)


def recovery_stamps(lines, worker=0):
    """The times (s, as the launcher and the coordinator print them) of a worker's crash and
    recovery in an elastic job's output: `crash` (its process exited), `lost` (the
    coordinator lost it), `replacement` (its next process started), `quorum` (the first
    quorum in which a worker fetches the state) and `stepping` (that epoch's first step)."""
    import re
    stamps = {}
    for line in lines:
        m = re.match(r"\[(coordinator|launcher)\]\s+([\d.]+) s\s+(.*)", line)
        if not m:
            continue
        t, what = float(m.group(2)), m.group(3)
        if what.startswith(f"worker {worker} (process 1) exited") and "crash" not in stamps:
            stamps["crash"] = t
        elif what.startswith(f"worker {worker} lost") and "lost" not in stamps:
            stamps["lost"] = t
        elif what.startswith(f"worker {worker} started: process 2"):
            stamps["replacement"] = t
        elif "fetch the state" in what and "quorum" not in stamps:
            stamps["quorum"] = t
        elif what.endswith(" steps") and "quorum" in stamps and "stepping" not in stamps:
            stamps["stepping"] = t
    return stamps


def first_fetch(metrics_path):
    """The first `fetch` event of a `metrics.jsonl` (bytes, seconds, sources), or {}."""
    import json
    with open(metrics_path) as f:
        return next((json.loads(l) for l in f if '"kind":"fetch"' in l), {})
