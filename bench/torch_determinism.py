"""PyTorch's deterministic options audited on the CPU: for the operations that
`torch.use_deterministic_algorithms`'s documentation names (and the common reductions and
products it does not), the run-to-run variability of each over RUNS runs, with the mode
off and on, at several thread counts; whether the bits change with the thread count; what
the mode costs; and each documentation claim checked against the measurement.

The documentation's claims are read from the installed PyTorch itself (the docstring of
`torch.use_deterministic_algorithms`), so the audit checks the version it runs. The
metrics are the FPNA lab's (`steadfast.fpna`): distinct outputs over the runs, the largest
fraction of elements whose bits differ from the first run's, and for scalar results
|V_s| = |1 - nd/d|.

No GPU is used here: the claims about CUDA tensors are listed but not measured, and the
section says so (run it where `torch.cuda.is_available()` to measure them: the driver then
adds the CUDA rows).

Usage: bench/run.sh torch-determinism (installs python/ into bench/.venv).
Environment: RUNS (default 50), THREADS (default "1,2,4").
"""
import datetime
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_name, write_section  # noqa: E402

import steadfast.fpna as fpna  # noqa: E402

RUNS = int(os.environ.get("RUNS", "50"))
THREADS = [int(t) for t in os.environ.get("THREADS", "1,2,4").split(",")]
N = 1 << 20          # pairs of the scatter-like operations
TARGETS = 1000       # their distinct targets


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "idx": torch.randint(0, TARGETS, (N,), generator=g),
        "src": torch.randn(N, generator=g) * 10 ** torch.randint(-3, 4, (N,), generator=g),
        "x": torch.randn(TARGETS, generator=g),
        "big": torch.randn(1 << 22, generator=g),
        "a": torch.randn(512, 512, generator=g),
        "b": torch.randn(512, 512, generator=g),
        "ba": torch.randn(32, 128, 128, generator=g),
        "bb": torch.randn(32, 128, 128, generator=g),
        "img": torch.randn(32, 16, 32, 32, generator=g),
        "kernel": torch.randn(32, 16, 3, 3, generator=g),
        "emb": torch.randn(TARGETS, 32, generator=g),
        "up": torch.randn(8, 8, 32, 32, generator=g),
        "logp": torch.randn(N // 16, 10, generator=g).log_softmax(1),
    }


def grad_of(leaf, loss_of):
    leaf = leaf.detach().clone().requires_grad_(True)
    loss_of(leaf).backward()
    return leaf.grad


def cases(t):
    """The operations audited, on the inputs `t`."""
    idx, src = t["idx"], t["src"]
    w = src[: idx.numel()]
    z = lambda: torch.zeros(TARGETS)  # noqa: E731
    unpool_in, unpool_idx = F.max_pool2d(t["up"], 2, return_indices=True)
    return [
        # (name, the call, a callable that makes the output)
        ("index_add_", "zeros(1000).index_add_(0, idx, src), 2^20 pairs", lambda: z().index_add_(0, idx, src)),
        ("scatter_add_", "zeros(1000).scatter_add_(0, idx, src)", lambda: z().scatter_add_(0, idx, src)),
        ("scatter_reduce sum", "zeros(1000).scatter_reduce(0, idx, src, 'sum')",
         lambda: z().scatter_reduce(0, idx, src, "sum")),
        ("index_put_ accumulate=True", "zeros(1000).index_put_((idx,), src, accumulate=True)",
         lambda: z().index_put_((idx,), src, accumulate=True)),
        ("put_ accumulate=True", "zeros(1000).put_(idx, src, accumulate=True)",
         lambda: z().put_(idx, src, accumulate=True)),
        ("index_put_ accumulate=False", "duplicate indices: which write lands",
         lambda: z().index_put_((idx,), src, accumulate=False)),
        ("index_copy_", "duplicate indices: which write lands", lambda: z().index_copy_(0, idx, src)),
        ("scatter_", "duplicate indices: which write lands", lambda: z().scatter_(0, idx, src)),
        ("put_ accumulate=False", "duplicate indices", lambda: z().put_(idx, src)),
        ("bincount with weights", "bincount(idx, weights=src)", lambda: torch.bincount(idx, weights=src)),
        ("histc", "histc(2^22 normal values, 100 bins)", lambda: torch.histc(t["big"], bins=100)),
        ("__getitem__ backward", "x[idx] (a tensor index), gradient of (x[idx] * w).sum()",
         lambda: grad_of(t["x"], lambda x: (x[idx] * w).sum())),
        ("gather backward", "gradient of (x.gather(0, idx) * w).sum()",
         lambda: grad_of(t["x"], lambda x: (x.gather(0, idx) * w).sum())),
        ("index_select backward", "gradient of (x.index_select(0, idx) * w).sum()",
         lambda: grad_of(t["x"], lambda x: (x.index_select(0, idx) * w).sum())),
        ("Embedding backward", "embedding(idx as 16384 x 64, 1000 x 32 table)",
         lambda: grad_of(t["emb"], lambda e: (F.embedding(idx.view(-1, 64), e) * 1.5).sum())),
        ("EmbeddingBag backward", "embedding_bag(idx as 16384 bags of 64, mode='sum')",
         lambda: grad_of(t["emb"], lambda e: F.embedding_bag(idx.view(-1, 64), e, mode="sum").pow(2).sum())),
        ("NLLLoss", "nll_loss of 65536 x 10 log-probabilities",
         lambda: F.nll_loss(t["logp"], idx[: t["logp"].shape[0]] % 10)),
        ("Conv2d backward", "weight gradient of conv2d(32x16x32x32, 32x16x3x3)",
         lambda: grad_of(t["kernel"], lambda k: F.conv2d(t["img"], k, padding=1).pow(2).sum())),
        ("interpolate bilinear backward", "gradient of interpolate(8x8x32x32, x2, bilinear)",
         lambda: grad_of(t["up"], lambda u: F.interpolate(u, scale_factor=2, mode="bilinear").pow(2).sum())),
        ("MaxUnpool2d", "max_unpool2d of a 2x2 max pool", lambda: F.max_unpool2d(unpool_in, unpool_idx, 2)),
        ("cumsum", "cumsum of 2^22 values", lambda: t["big"].cumsum(0)),
        ("sum", "sum of 2^22 values (a scalar)", lambda: t["big"].sum()),
        ("matmul", "512 x 512 by 512 x 512", lambda: t["a"] @ t["b"]),
        ("bmm", "32 of 128 x 128 by 128 x 128", lambda: torch.bmm(t["ba"], t["bb"])),
    ]


def documented(name):
    """What the installed PyTorch's documentation says about `name` on a CPU tensor:
    `deterministic with the mode` (normally nondeterministic, deterministic when on),
    `raises with the mode`, or `not listed for the CPU` (with the CUDA-only mentions)."""
    doc = re.sub(r"\s+", " ", torch.use_deterministic_algorithms.__doc__)
    act = "The following normally-nondeterministic operations will act deterministically"
    throw = "The following normally-nondeterministic operations will throw"
    on = doc.split(act, 1)[1].split(throw, 1)[0]
    raises = doc.split(throw, 1)[1].split("In addition", 1)[0]
    key = {
        "index_add_": "torch.index_add", "scatter_add_": "scatter_add_", "scatter_reduce sum": "scatter_reduce",
        "index_put_ accumulate=True": "index_put` with ``accumulate=True``",
        "put_ accumulate=True": "put_` with ``accumulate=True``",
        "index_put_ accumulate=False": "index_put` with ``accumulate=False``",
        "index_copy_": "index_copy", "scatter_": "Tensor.scatter`", "put_ accumulate=False": "put_` when ``accumulate=False",
        "bincount with weights": "bincount", "histc": "histc", "__getitem__ backward": "__getitem__",
        "gather backward": "torch.gather", "index_select backward": "index_select",
        "Embedding backward": "nn.Embedding`", "EmbeddingBag backward": "EmbeddingBag", "NLLLoss": "NLLLoss",
        "Conv2d backward": "Conv2d", "interpolate bilinear backward": "interpolate", "MaxUnpool2d": "MaxUnpool2d",
        "cumsum": "torch.cumsum", "sum": None, "matmul": None, "bmm": "torch.bmm",
    }[name]
    if key is None:
        return "not named"

    def lines(text):
        return [re.sub(r":(class|func):|`", "", l).strip() for l in text.split(" * ") if key in l]

    on_lines, raise_lines = lines(on), lines(raises)
    if any("CUDA" not in l and "MPS" not in l for l in raise_lines):
        return "raises with the mode (any device)"
    if any("CPU" in l or ("CUDA" not in l and "MPS" not in l) for l in on_lines):
        return "CPU: nondeterministic, deterministic with the mode"
    if on_lines or raise_lines:
        return "named for " + "/".join(sorted({d for l in on_lines + raise_lines for d in ("CUDA", "MPS") if d in l}))
    return "not named"


def measure(fn):
    """(the lab's report over RUNS calls, or the error's text; the first output)."""
    outs = []
    for _ in range(RUNS):
        try:
            outs.append(fn())
        except RuntimeError as e:
            return str(e).split("\n")[0], None
    results = iter(outs)
    return fpna.measure(lambda: next(results), runs=RUNS), outs[0]


def cost(fn):
    """Median seconds per call with the mode on over off, the two alternating call by call
    (so that the machine's drift falls on both); None if the mode makes it raise."""
    times = {False: [], True: []}
    try:
        for r in range(2 * RUNS):
            mode = r % 2 == 1
            torch.use_deterministic_algorithms(mode)
            start = time.perf_counter()
            fn()
            times[mode].append(time.perf_counter() - start)
    except RuntimeError:
        return None
    finally:
        torch.use_deterministic_algorithms(False)
    return statistics.median(times[True]) / statistics.median(times[False])


def verdict(doc, off, on):
    """The documentation's claim against the measurement, in a few words."""
    off_varies = isinstance(off, dict) and off["distinct"] > 1
    on_raises = not isinstance(on, dict)
    on_varies = isinstance(on, dict) and on["distinct"] > 1
    if doc.startswith("raises"):
        return "holds: raises" if on_raises else "wrong: does not raise"
    if on_raises:
        return "undocumented: raises with the mode"
    if doc.startswith("CPU: nondeterministic"):
        if on_varies:
            return "wrong: still varies with the mode"
        return "holds: varies without, fixed with" if off_varies else "not observed: fixed without the mode too"
    if off_varies:
        return "undocumented: varies on CPU" + ("; the mode does not fix it" if on_varies else "; fixed with the mode")
    return "holds: fixed"


def cell(r):
    if not isinstance(r, dict):
        return "raises"
    if "max_abs_vs" in r:
        return f"{r['distinct']} (\\|V_s\\| ≤ {r['max_abs_vs']:.1e})" if r["distinct"] > 1 else "1"
    frac = r.get("max_fraction_differing", 0.0)
    return f"{r['distinct']} ({frac:.1%} differ)" if r["distinct"] > 1 else "1"


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and fpna.distinct_outputs([a, b]) == 1


def thread_independent(runs):
    """Whether the outputs at every thread count have the same bits (`runs`: one
    measurement per thread count); `varies` when they vary from run to run anyway."""
    if any(r[1] is None for r in runs):
        return "n/a"
    if any(r[0]["distinct"] > 1 for r in runs):
        return "varies"
    return "yes" if all(same_bits(runs[0][1], r[1]) for r in runs[1:]) else "**no**"


def main():
    t = inputs()
    names = [c[0] for c in cases(t)]
    table = {}
    for mode in (False, True):
        torch.use_deterministic_algorithms(mode)
        for threads in THREADS:
            torch.set_num_threads(threads)
            for name, how, fn in cases(t):
                table[(name, mode, threads)] = measure(fn)
                print(name, mode, threads, cell(table[(name, mode, threads)][0]), flush=True)
    torch.use_deterministic_algorithms(False)
    top = max(THREADS)
    torch.set_num_threads(top)
    costs = {name: cost(fn) for name, _, fn in cases(t)}
    how_of = {c[0]: c[1] for c in cases(t)}
    lines = [
        "<!-- torch-determinism:start -->",
        "## PyTorch's deterministic mode on the CPU, audited",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores; PyTorch"
        f" {torch.__version__} (the wheel PyPI serves), CPU tensors; no GPU here"
        f"{'' if not torch.cuda.is_available() else ' (a GPU was present but not measured)'}, so the claims about"
        " CUDA tensors are quoted, not measured.",
        f"- Command: `RUNS={RUNS} THREADS={','.join(map(str, THREADS))} bench/run.sh torch-determinism` (driver:"
        " `bench/torch_determinism.py`).",
        f"- Each operation runs {RUNS} times on fixed inputs (float32; scatter-like operations: 2^20 pairs into 1000"
        " targets, values spanning seven decades) with `torch.use_deterministic_algorithms` off and on, at"
        f" {', '.join(map(str, THREADS))} threads (`torch.set_num_threads`). A cell is the number of distinct"
        " outputs over the runs (with the largest fraction of elements whose bits differ from the first run's, or"
        " |V_s| for a scalar); *raises* is the mode's RuntimeError. *same bits at every thread count*: whether the"
        f" output at each thread count ({', '.join(map(str, THREADS))}) has the same bits, with the mode off and"
        " on (*varies*: it varies from run to run anyway). *cost*: median time per call"
        f" with the mode on over off, at {top} threads, the two alternating call by call ({RUNS} calls each; with the"
        " mode on PyTorch also fills the memory of new tensors, `fill_uninitialized_memory`). *documented*: what the installed PyTorch's documentation"
        " of the mode says for a CPU tensor.",
        "",
        "| operation | call | documented (CPU) | " + " | ".join(f"off, {n} thr" for n in THREADS) + " | "
        + " | ".join(f"on, {n} thr" for n in THREADS) + " | same bits at every thread count (off / on) | cost on/off"
        " | verdict |",
        "|---|---|---|" + "---|" * (2 * len(THREADS)) + "---|---|---|",
    ]
    for name in names:
        doc = documented(name)
        offs = [table[(name, False, n)] for n in THREADS]
        ons = [table[(name, True, n)] for n in THREADS]
        across = " / ".join(thread_independent(runs) for runs in (offs, ons))
        ratio = "—" if costs[name] is None else f"{costs[name]:.2f}x"
        worst_off = max(offs, key=lambda o: o[0]["distinct"] if isinstance(o[0], dict) else 0)[0]
        worst_on = next((o[0] for o in ons if not isinstance(o[0], dict)),
                        max(ons, key=lambda o: o[0]["distinct"] if isinstance(o[0], dict) else 0)[0])
        v = verdict(doc, worst_off, worst_on)
        if "**no**" in across and v.startswith("holds"):
            v += "; but the bits change with the thread count (undocumented)"
        lines.append(f"| `{name}` | {how_of[name]} | {doc} | " + " | ".join(cell(o[0]) for o in offs) + " | "
                     + " | ".join(cell(o[0]) for o in ons) + f" | {across} | {ratio} | {v} |")
    errors = sorted({(name, table[(name, True, top)][0]) for name in names
                     if not isinstance(table[(name, True, top)][0], dict)})
    if errors:
        lines += ["", "What the mode's errors say:", ""]
        lines += [f"- `{name}`: {msg}" for name, msg in errors]
    lines.append("<!-- torch-determinism:end -->")
    section = "\n".join(lines)
    print(section)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    write_section(os.path.join(root, "docs", "fpna.md"), "torch-determinism", section)


if __name__ == "__main__":
    main()
