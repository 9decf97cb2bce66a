"""The seed study's experiment on a PyTorch model with `steadfast.lab`: LeNet-5 (the study's
CNN) trained by AdamW on Fashion-MNIST, its checkpoint altered at step 200 or 400 (one bit
of one element of the weights or of the optimizer state, per bit class: sign, exponent,
mantissa), resumed and trained 30 steps, judged against the golden run. Prints the table of
outcome shares by bit class and tensor role that docs/sdc-findings.md quotes.

    python bench/sdc_lab_findings.py [--trials 200] [--out bench/out/sdc-lab-cnn]
"""
import argparse
import csv
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "python", "examples", "sdc_campaign.py")
CLASSES = ("sign", "exponent", "mantissa")
OUTCOMES = ("masked", "degraded", "diverged", "crashed")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=200, help="trials per bit class")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "out", "sdc-lab-cnn"))
    a = ap.parse_args()
    rows = []
    for bits in CLASSES:
        out = os.path.join(a.out, bits)
        if not os.path.exists(os.path.join(out, "trials.csv")):
            subprocess.run([sys.executable, EXAMPLE, "--model", "cnn", "--where", "checkpoint",
                            "--state", "param,optim", "--bits", bits, "--inject-at", "200,400", "--steps-after", "30",
                            "--trials", str(a.trials), "--seed", "5", "--out", out],
                           check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "trials.csv"), newline="") as f:
            rows += [dict(r, bit_class=bits) for r in csv.DictReader(f)]
    print("| role | bit class | trials | " + " | ".join(OUTCOMES) + " |")
    print("|---|---|---:|" + "---:|" * len(OUTCOMES))
    for state, role in (("param", "model (weights)"), ("optim", "optimizer (AdamW moments)")):
        for bits in CLASSES:
            mine = [r for r in rows if r["state"] == state and r["bit_class"] == bits]
            cells = []
            for o in OUTCOMES:
                k = sum(r["outcome"] == o for r in mine)
                cells.append(f"{k} ({100 * k / len(mine):.1f}%)" if k else "0")
            print(f"| {role} | {bits} | {len(mine)} | " + " | ".join(cells) + " |")
    harmful = [r for r in rows if r["outcome"] not in ("masked",)]
    print(f"\n{len(harmful)} harmful of {len(rows)}; by tensor:")
    by = {}
    for r in harmful:
        by[r["tensor"]] = by.get(r["tensor"], 0) + 1
    for t, k in sorted(by.items(), key=lambda x: -x[1]):
        print(f"  {t}: {k}")
    bits = {}
    for r in harmful:
        top = max(int(b) for b in r["bits"].split(";"))
        bits[top] = bits.get(top, 0) + 1
    print("by bit:", dict(sorted(bits.items())))


if __name__ == "__main__":
    main()
