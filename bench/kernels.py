"""The fixed-order matrix product of `crates/kernels` on the models' shapes, each
instruction-set path against the `gemm` crate that the framework's CPU backend calls,
side by side in one run (`cargo bench -p steadfast-kernels --bench gemm`).

Usage: python3 bench/kernels.py   (bench/run.sh kernels does this)
"""
import datetime, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import cpu_name, publish  # noqa: E402


def main():
    out = subprocess.run(["cargo", "bench", "--locked", "-p", "steadfast-kernels", "--bench", "gemm"], cwd=ROOT,
                         check=True, capture_output=True, text=True).stdout
    table = [line for line in out.splitlines() if line.startswith("|")]
    header = table[0]
    lines = [
        "<!-- kernels:start -->",
        "## Fixed-order matrix product against the framework's",
        "",
        f"- Date: {datetime.date.today().isoformat()}; machine: {cpu_name()}, {os.cpu_count()} cores.",
        "- Command: `bench/run.sh kernels` (`cargo bench -p steadfast-kernels --bench gemm`).",
        "- `kernels::gemm::matmul` on each instruction-set path this CPU has (all give the same bits: each output is one"
        " chain of fused multiply-adds over the inner dimension in increasing order), against the `gemm` crate (0.19)"
        " that the framework's CPU backend calls, whose blocking of the inner dimension follows the L1 cache and whose"
        " bits therefore depend on the CPU. Median of 11 after a warm-up; GFLOP/s = 2mkn / time.",
        "",
        header,
        "|" + "---|" * (header.count("|") - 1),
        *table[1:],
        "<!-- kernels:end -->",
    ]
    publish("kernels", lines)


if __name__ == "__main__":
    main()
