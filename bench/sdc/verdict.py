"""The checkpoint-alteration study's judgement of trials, without PyTorch: the classes of
outcome that Steadfast's campaigns use (`fault::campaign::Outcome`, same thresholds), the
spread of altered bits over steps, tensors and replicas, and the tables that compare
libraries. The CI test feeds it the records of a few real trials."""
import json
import math
import os
import statistics
from collections import Counter, defaultdict

# Steadfast's defaults (`fault::campaign::Thresholds`).
DEGRADED_ACCURACY = 0.005
DEGRADED_LOSS = 0.02
DIVERGED_LOSS = 10.0

OUTCOMES = ("masked", "degraded", "diverged", "crashed")
BIT_CLASSES = ("sign", "exponent", "mantissa")
KINDS = ("model", "optimizer")


def plan(trials_all, trials_one, world, inject_at, steps_after, seed=1, controls=2, counts=(1, 10)):
    """The trials of one (model, world): every combination of kind x bit class x count in
    turn, injection steps alternating, placement `all` first, then `one` (the altered copy
    read by one rank, drawn), then `controls` trials that flip nothing."""
    combos = [(k, b, c) for k in KINDS for b in BIT_CLASSES for c in counts]
    trials = []
    for placement, n in (("all", trials_all), ("one", trials_one)):
        for j in range(n):
            kind, bits, count = combos[j % len(combos)]
            i = len(trials)
            trials.append({"index": i, "placement": placement, "kind": kind, "bits": bits, "count": count,
                           "inject_at": inject_at[(j // len(combos)) % len(inject_at)],
                           "seed": seed * 1_000_003 + i, "rank": (seed + i * 7919) % world if placement == "one" else None})
    for j in range(controls):
        i = len(trials)
        trials.append({"index": i, "placement": "all", "kind": "model", "bits": "any", "count": 0,
                       "inject_at": inject_at[j % len(inject_at)], "seed": 0, "rank": None})
    return {"world": world, "inject_at": list(inject_at), "steps_after": steps_after, "trials": trials}


def read_records(job_dir):
    """Every rank's trial records of a job directory: {trial: {rank: record}}. A line cut
    short by a dying process is ignored (that trial is then incomplete, and crashed)."""
    out = defaultdict(dict)
    for name in sorted(os.listdir(job_dir)):
        if not (name.startswith("trials-rank") and name.endswith(".jsonl")):
            continue
        with open(os.path.join(job_dir, name)) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                out[r["trial"]][r["rank"]] = r
    return out


def finite(x):
    return x is not None and math.isfinite(x)


def judge(trial, ranks, world, crash=None):
    """One trial's verdict from its ranks' records ({rank: record}); `crash` is the error
    of a trial whose job died or hung. Divergence: any rank's training loss non-finite or
    above DIVERGED_LOSS x golden's at the same step, or a non-finite final score. Degraded:
    the worst rank's final test accuracy more than DEGRADED_ACCURACY below golden's, or its
    test loss more than DEGRADED_LOSS above."""
    v = {k: trial[k] for k in ("index", "placement", "kind", "bits", "count", "inject_at", "rank")}
    if crash is not None or len(ranks) < world:
        v.update(outcome="crashed", error=crash or f"{world - len(ranks)} of {world} ranks left no record")
        return v
    recs = [ranks[r] for r in sorted(ranks)]
    diverged_at = None
    for rec in recs:
        for s, loss in rec["losses"].items():
            g = rec["golden_losses"][s]
            if not finite(loss) or loss > DIVERGED_LOSS * g:
                diverged_at = int(s) if diverged_at is None else min(diverged_at, int(s))
    drop = max(r["golden_test_accuracy"] - r["test_accuracy"] for r in recs)
    rise = max((r["test_loss"] - r["golden_test_loss"]) / r["golden_test_loss"]
               if finite(r["test_loss"]) else math.inf for r in recs)
    if diverged_at is not None or not all(finite(r["test_loss"]) for r in recs):
        outcome = "diverged"
    elif drop > DEGRADED_ACCURACY or rise > DEGRADED_LOSS:
        outcome = "degraded"
    else:
        outcome = "masked"
    flips = ranks[0]["flips"] or [] if 0 in ranks else []
    offsets = sorted(int(o) for o in recs[0]["spread"])
    end = str(offsets[-1])
    elements = {o: [sum(r["spread"][str(o)]["tensors"].values()) for r in recs] for o in offsets}
    large = {o: [sum(r["spread"][str(o)]["large"].values()) for r in recs] for o in offsets}
    v.update(
        outcome=outcome, diverged_at=diverged_at, accuracy_drop=drop, loss_rise=rise,
        flips=flips,
        flipped_tensors=sorted({f["tensor"] for f in flips}),
        bit_positions=[b for f in flips for b in f["bits"]],
        # Elements differing from golden after each offset, per rank: in any bit, and by
        # more than 1% of golden's magnitude.
        elements=elements,
        large=large,
        tensors_at_end=sorted({t for r in recs for t in r["spread"][end]["tensors"]}),
        # After each offset, the tensors holding an element off by more than 1% in any rank.
        far_tensors={o: sorted({t for r in recs for t in r["spread"][str(o)]["large"]}) for o in offsets},
        ranks_reached_at_start=sum(1 for r in recs if r["spread"]["0"]["tensors"]),
        ranks_reached_at_end=sum(1 for r in recs if r["spread"][end]["tensors"]),
        bitwise_golden=all(not r["spread"][end]["tensors"] for r in recs),
        replicas_equal_at_end=len({r["end_digest"] for r in recs}) == 1,
        seconds=max(r["seconds"] for r in recs),
    )
    return v


def counts(verdicts):
    """How many verdicts fell in each class of outcome."""
    return Counter(v["outcome"] for v in verdicts)


def wilson(k, n, z=1.96):
    """The 95% Wilson interval of a proportion k/n, for honest comparisons of small counts."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (max(0.0, c - h), min(1.0, c + h))


def spread_over_steps(verdicts, measure="elements"):
    """Per offset: the median and mean over the altered trials (controls left out) of the
    worst rank's elements differing from golden (`measure`: "elements" in any bit, "large"
    by more than 1%)."""
    by = defaultdict(list)
    for v in verdicts:
        if v["outcome"] == "crashed" or not v["count"]:
            continue
        for o, per_rank in v[measure].items():
            by[int(o)].append(max(per_rank))
    return {o: (statistics.median(xs), sum(xs) / len(xs), len(xs)) for o, xs in sorted(by.items())}


def far_reach(verdicts, offset):
    """For each tensor: the share of altered trials in which it held an element off by
    more than 1% from golden's `offset` steps after the resume (last offset: -1)."""
    hits, n = Counter(), 0
    for v in verdicts:
        if v["outcome"] == "crashed" or not v["count"]:
            continue
        keys = sorted(v["far_tensors"], key=int)
        key = keys[-1] if offset == -1 else next((k for k in keys if int(k) == offset), None)
        if key is None:
            continue
        n += 1
        hits.update(v["far_tensors"][key])
    return {t: k / n for t, k in hits.items()} if n else {}
