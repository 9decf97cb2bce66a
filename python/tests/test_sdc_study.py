"""The SDC study's drivers (bench/sdc), so that they cannot rot between runs: a few real
trials on a tiny MLP trained by two PyTorch DDP processes, each altered by `steadfast
inject`, resumed, judged; a trial whose job dies is crashed and the job is started again
for the rest; and the classes of outcome on records built by hand."""
import json
import math
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def sdc():
    sys.path[:0] = [str(BENCH / "sdc"), str(BENCH)]
    try:
        import study
        import verdict
    finally:
        del sys.path[:2]
    return study, verdict


def trial(index, inject_at, kind="model", bits="any", count=0, placement="all", rank=None, seed=0):
    return {"index": index, "placement": placement, "kind": kind, "bits": bits, "count": count,
            "inject_at": inject_at, "seed": seed, "rank": rank}


def test_real_trials_on_ddp_are_judged(sdc, cli, fashion_mnist, tmp_path):
    study, verdict = sdc
    study.BIN = cli
    plan = {"world": 2, "inject_at": [6, 8], "steps_after": 3, "trials": [
        trial(0, 6),  # a control: the unaltered checkpoint
        # The top exponent bit of 40 small weights: values near 1e38, the loss explodes.
        trial(1, 6, kind="model", bits="30", count=40, seed=1),
        # The top mantissa bit of one AdamW moment in rank 1's copy only.
        trial(2, 8, kind="optimizer", bits="22", count=1, placement="one", rank=1, seed=2),
        # Bit 99 of a float32: inject refuses, the job dies with the trial in flight.
        trial(3, 8, kind="model", bits="99", count=1, seed=3),
        trial(4, 8),  # a new job takes the rest
    ]}
    extra = ["--width", "16", "--data-dir", str(fashion_mnist)]
    vs = {v["index"]: v for v in study.run_cell("ddp", sys.executable, "mlp", 2, plan, tmp_path / "job", extra)}

    for i in (0, 4):
        assert vs[i]["outcome"] == "masked" and vs[i]["bitwise_golden"], vs[i]
        assert all(n == 0 for per_rank in vs[i]["elements"].values() for n in per_rank)

    assert vs[1]["outcome"] == "diverged", vs[1]
    assert vs[1]["bit_positions"] == [30] * 40
    assert vs[1]["flipped_tensors"] and all(t.startswith("model.") for t in vs[1]["flipped_tensors"])
    assert vs[1]["elements"][0] == [40, 40]  # both ranks read the altered file

    v = vs[2]
    assert v["outcome"] == "masked", v
    assert v["elements"][0] == [0, 1]  # only rank 1's copy was altered...
    assert v["flipped_tensors"][0].startswith("optimizer.state.")
    # ...and DDP, which averages gradients but never compares weights, leaves the replicas
    # apart for good.
    assert not v["replicas_equal_at_end"] and v["ranks_reached_at_end"] == 2

    assert vs[3]["outcome"] == "crashed"
    assert "bits" in vs[3]["error"], vs[3]["error"]


def record(rank, losses, golden_losses, acc=0.8, golden_acc=0.8, loss=0.5, golden_loss=0.5, differing=0):
    spread = {str(o): {"tensors": {"model.w": differing} if differing else {}, "large": {}} for o in (0, 1, 3)}
    return {"trial": 0, "rank": rank, "flips": [{"tensor": "model.w", "element": 3, "bits": [30]}] if rank == 0 else None,
            "spread": spread, "losses": {str(s): l for s, l in enumerate(losses)},
            "golden_losses": {str(s): l for s, l in enumerate(golden_losses)}, "test_loss": loss,
            "test_accuracy": acc, "golden_test_loss": golden_loss, "golden_test_accuracy": golden_acc,
            "end_digest": f"d{differing}", "seconds": 0.1}


def test_the_classes_follow_steadfasts_thresholds(sdc):
    _, verdict = sdc
    t = trial(0, 0, count=1)
    ok = record(0, [1.0, 0.9], [1.0, 0.9])
    judge = lambda r1: verdict.judge(t, {0: ok, 1: r1}, 2)  # noqa: E731
    assert judge(record(1, [1.0, 0.9], [1.0, 0.9]))["outcome"] == "masked"
    # Diverged: a loss above 10x golden's at the same step, or a non-finite one.
    assert judge(record(1, [1.0, 9.1], [1.0, 0.9]))["outcome"] == "diverged"
    assert judge(record(1, [1.0, 8.9], [1.0, 0.9]))["outcome"] == "masked"
    assert judge(record(1, [math.nan, 0.9], [1.0, 0.9]))["diverged_at"] == 0
    assert judge(record(1, [1.0, 0.9], [1.0, 0.9], loss=math.inf))["outcome"] == "diverged"
    # Degraded: the worst replica's accuracy 0.5 points below golden's, or its loss 2% above.
    assert judge(record(1, [1.0, 0.9], [1.0, 0.9], acc=0.794))["outcome"] == "degraded"
    assert judge(record(1, [1.0, 0.9], [1.0, 0.9], acc=0.796))["outcome"] == "masked"
    assert judge(record(1, [1.0, 0.9], [1.0, 0.9], loss=0.5101))["outcome"] == "degraded"
    # Replicas: one rank differing at the end reached one replica; the digests part.
    v = judge(record(1, [1.0, 0.9], [1.0, 0.9], differing=5))
    assert (v["ranks_reached_at_end"], v["replicas_equal_at_end"], v["bitwise_golden"]) == (1, False, False)
    assert v["bit_positions"] == [30] and v["flipped_tensors"] == ["model.w"]
    # A rank without a record, or a job that died: crashed.
    assert verdict.judge(t, {0: ok}, 2)["outcome"] == "crashed"
    assert verdict.judge(t, {0: ok, 1: ok}, 2, crash="killed")["error"] == "killed"


def test_records_cut_short_are_ignored(sdc, tmp_path):
    _, verdict = sdc
    with open(tmp_path / "trials-rank0.jsonl", "w") as f:
        f.write(json.dumps({"trial": 0, "rank": 0}) + "\n" + '{"trial": 1, "ra')
    with open(tmp_path / "trials-rank1.jsonl", "w") as f:
        f.write(json.dumps({"trial": 0, "rank": 1}) + "\n")
    assert {t: sorted(r) for t, r in verdict.read_records(tmp_path).items()} == {0: [0, 1]}


def test_the_plan_covers_every_knob(sdc):
    _, verdict = sdc
    p = verdict.plan(24, 12, 4, [200, 400], 50, controls=2)
    altered = [t for t in p["trials"] if t["count"]]
    assert len(p["trials"]) == 38 and len(altered) == 36
    assert {(t["kind"], t["bits"], t["count"]) for t in altered} == {
        (k, b, c) for k in verdict.KINDS for b in verdict.BIT_CLASSES for c in (1, 10)}
    assert {t["inject_at"] for t in altered} == {200, 400}
    assert {t["rank"] for t in altered if t["placement"] == "one"} <= {0, 1, 2, 3}
    assert len({t["seed"] for t in altered}) == 36
