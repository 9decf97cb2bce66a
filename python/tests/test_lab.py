"""The SDC lab on PyTorch models (steadfast.lab): campaigns run in worker processes and
classified by the Rust core's rule, trials that replay bit for bit, flip logs that undo,
tables that `steadfast report` draws and Chromium renders, and bad requests refused."""
import csv
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import steadfast
import steadfast.lab as lab
import steadfast.torch as st

HERE = pathlib.Path(__file__).resolve().parent
EXAMPLE = HERE.parents[0] / "examples" / "sdc_campaign.py"


def _jobs():
    spec = importlib.util.spec_from_file_location("lab_jobs", HERE / "lab_jobs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


jobs = _jobs()


def rows(out, name="trials.csv"):
    with open(pathlib.Path(out) / name, newline="") as f:
        return list(csv.DictReader(f))


def golden_state(out, step):
    """The golden run's model and optimizer after ``step`` steps, from the campaign's trajectory."""
    g = torch.load(pathlib.Path(out) / "golden" / "trajectory.pt", weights_only=False)
    job = jobs.small_job()
    torch.manual_seed(job.seed)
    model = job.model()
    opt = job.optimizer(model)
    sd, osd, _ = g["states"][step]
    model.load_state_dict(sd)
    opt.load_state_dict(osd)
    return model, opt


def same_bits(a, b):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab") / "live"
    summary = lab.campaign(jobs.small_job, out, trials=24, inject_at=[3, 6], steps_after=5,
                           state=["param", "grad", "optim", "activation"], bits="any", seed=3, workers=2)
    return out, summary


def test_a_campaign_writes_the_tables_of_steadfast_campaign_with_its_classes(live):
    out, summary = live
    trials = rows(out)
    assert [int(r["trial"]) for r in trials] == list(range(24))
    assert {r["state"] for r in trials} == {"param", "grad", "optim", "activation"}
    assert {r["outcome"] for r in trials} <= {"masked", "degraded", "diverged", "crashed", "detected", "corrected"}
    assert not [r for r in trials if r["outcome"] == "crashed"], [r["error"] for r in trials]
    for r in trials:
        assert r["tensor"].startswith({"param": "model.", "grad": "grad.", "optim": "optimizer.",
                                       "activation": "act."}[r["state"]]), r
        assert int(r["step"]) in (3, 6)
    # The steps of each trial, against golden's losses; golden's own steps up to the last.
    steps = rows(out, "steps.csv")
    assert len([s for s in steps if s["trial"] == "0"]) == 5
    assert [int(g["step"]) for g in rows(out, "golden.csv")] == list(range(1, 12))
    # A live flip of stored state is caught by the checksum of the state at rest.
    for r in trials:
        assert (r["alarm_checksum"] != "") == (r["state"] in ("param", "optim")), r
    assert "Outcomes by kind of state" in summary and (out / "summary.md").read_text() == summary
    assert (out / "logs" / "trial-000017.json").exists()


def test_the_classes_follow_the_bits_flipped(tmp_path):
    # The lowest mantissa bit of a parameter changes its value by one part in 2**23: the
    # final model differs in its bits but not in its quality. The top exponent bit makes a
    # weight 2**128 times larger (or infinite): the loss explodes.
    low = lab.campaign(jobs.small_job, tmp_path / "low", trials=6, inject_at=[4], steps_after=4, state=["param"],
                       bits="0", workers=1)
    high = lab.campaign(jobs.small_job, tmp_path / "high", trials=6, inject_at=[4], steps_after=4, state=["param"],
                        bits="30", workers=1)
    assert low and high
    assert {r["outcome"] for r in rows(tmp_path / "low")} == {"masked"}
    assert all(r["bitwise_golden"] == "false" for r in rows(tmp_path / "low"))
    assert {r["outcome"] for r in rows(tmp_path / "high")} & {"diverged", "degraded"}


def test_stop_detects_and_repair_corrects_a_flipped_weight(tmp_path):
    stop = tmp_path / "stop"
    lab.campaign(jobs.small_job, stop, trials=4, inject_at=[4], steps_after=4, state=["param"], bits="30",
                 detect={"response": "stop"}, workers=1)
    assert {r["outcome"] for r in rows(stop)} == {"detected"}
    repair = tmp_path / "repair"
    lab.campaign(jobs.small_job, repair, trials=4, inject_at=[4], steps_after=4, state=["param"], bits="30",
                 detect={"response": "repair"}, workers=1)
    trials = rows(repair)
    assert {r["outcome"] for r in trials} == {"corrected"}
    assert all(r["bitwise_golden"] == "true" and r["rollbacks"] == "1" for r in trials)


def test_every_trial_replays_with_the_same_fault_and_outcome(live, cli):
    out, _ = live
    trials = {int(r["trial"]): r for r in rows(out)}
    steps = rows(out, "steps.csv")
    for index in (0, 5, 17):
        [(text, res, log)] = lab.replay(out, [index])
        row = trials[index]
        assert res["outcome"] == row["outcome"]
        assert text.startswith(f"trial {index} [deterministic]: {row['state']}")
        assert log["flips"][0]["tensor"] == row["tensor"] and str(log["flips"][0]["element"]) == row["element"]
        recorded = [np.float32(s["loss"]) for s in steps if int(s["trial"]) == index]
        assert [np.float32(x) for x in res["losses"]] == recorded
    # The CLI's replay of a PyTorch campaign runs the same replay.
    printed = subprocess.run([cli, "campaign", str(out / "spec.toml"), "--replay", "5"], capture_output=True,
                             text=True, timeout=300)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith(f"trial 5 [deterministic]: {trials[5]['state']}"), printed.stdout


def test_a_live_trial_s_log_undoes_on_the_golden_state(live):
    out, _ = live
    param = next(r for r in rows(out) if r["state"] == "param")
    log = json.loads((out / "logs" / f"trial-{int(param['trial']):06}.json").read_text())
    model, _ = golden_state(out, int(param["step"]))
    before = [t.clone() for t in model.state_dict().values()]
    steadfast.replay({"model": model}, log)
    assert not same_bits(before, model.state_dict().values())
    steadfast.undo({"model": model}, log)
    assert same_bits(before, model.state_dict().values())


def test_a_checkpoint_campaign_alters_copies_and_its_trials_undo(tmp_path, cli):
    out = tmp_path / "ckpt"
    # A rate of corruption rather than a count: each exponent bit with probability 2e-4.
    lab.campaign(jobs.small_job, out, trials=6, inject_at=[4], steps_after=4, state=["param", "optim"],
                 where="checkpoint", bits="exponent", rate=2e-4, workers=1)
    trials = rows(out)
    assert {r["state"] for r in trials} <= {"param", "optim"}
    assert all(r["alarm_checksum"] == "" for r in trials), "the file's checksums were rewritten with the flips"
    assert "probability 0.0002" in (out / "summary.md").read_text()
    golden = next((out / "golden" / "checkpoints").iterdir())
    altered = tmp_path / "altered"
    [(_, res, log)] = lab.replay(out, [2], keep=str(altered))
    assert res["outcome"] == trials[2]["outcome"]
    assert st.verify(altered) == []
    log_path = tmp_path / "trial-2.json"
    log_path.write_text(json.dumps(log))
    undone = subprocess.run([cli, "inject", str(altered), "--undo", str(log_path)], capture_output=True, text=True)
    assert undone.returncode == 0, undone.stderr
    a, b = st.load(altered), st.load(golden)
    assert same_bits(a["model"].values(), b["model"].values())


def test_the_report_of_a_pytorch_campaign_renders_in_chromium(live, cli, tmp_path):
    out, _ = live
    done = subprocess.run([cli, "report", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    page = (out / "report.html").read_text()
    assert "small-mlp" in page and "PyTorch" in page and page.count("<svg") == 4
    assert "python -m steadfast.lab replay" in page
    browser = next((b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is None:
        if os.environ.get("STEADFAST_REQUIRE_BROWSER") == "1":
            pytest.fail("no headless browser (apt-get install chromium)")
        pytest.skip("no chromium to render the report")
    script = ("<script>window.addEventListener('load',function(){var n=0;"
              "document.querySelectorAll('section.plot svg').forEach(function(s){var b=s.getBoundingClientRect();"
              "if(b.width>50&&b.height>50&&s.querySelectorAll('rect,path,polyline,line,circle,text').length>10)n++;});"
              "document.body.setAttribute('data-plots-rendered',String(n));});</script>")
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", script + "</body>"))
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1200,3000",
                          f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", f"file://{probe}"],
                         capture_output=True, text=True, timeout=120)
    assert 'data-plots-rendered="4"' in dom.stdout, dom.stdout[:400]


def test_bad_campaigns_are_refused_with_the_reason(tmp_path):
    kw = dict(trials=2, inject_at=[2], steps_after=2, workers=1)
    with pytest.raises(ValueError, match="weights"):
        lab.campaign(jobs.small_job, tmp_path / "a", state=["weights"], **kw)
    with pytest.raises(ValueError, match="rate"):
        lab.campaign(jobs.small_job, tmp_path / "a", rate=1.5, **kw)
    with pytest.raises(ValueError, match="where"):
        lab.campaign(jobs.small_job, tmp_path / "b", where="disk", **kw)
    with pytest.raises(ValueError, match="only param and optim"):
        lab.campaign(jobs.small_job, tmp_path / "c", where="checkpoint", state=["grad"], **kw)
    with pytest.raises(lab.LabError, match="top level"):
        lab.campaign(lambda: jobs.small_job(), tmp_path / "d", **kw)
    with pytest.raises(lab.LabError, match="matches no param tensor at step 2 .they are: model.0.weight"):
        lab.campaign(jobs.small_job, tmp_path / "g", state=["param"], target="model.fc9.*", **kw)
    with pytest.raises(lab.LabError, match="no optim tensor at step 0 .they are: none: the optimizer holds no state"):
        lab.campaign(jobs.small_job, tmp_path / "h", **dict(kw, inject_at=[0]), state=["optim"])
    with pytest.raises(lab.LabError, match="not deterministic"):
        lab.campaign(jobs.unseeded_job, tmp_path / "e", **kw)
    lab.campaign(jobs.small_job, tmp_path / "f", **kw)
    before = (tmp_path / "f" / "trials.csv").read_bytes()
    with pytest.raises(lab.LabError, match="already holds"):
        lab.campaign(jobs.small_job, tmp_path / "f", **kw)
    assert (tmp_path / "f" / "trials.csv").read_bytes() == before
    with pytest.raises(lab.LabError, match="trials 0 to 1"):
        lab.replay(tmp_path / "f", [7])


def test_the_example_runs_a_campaign_on_the_study_s_mlp(fashion_mnist, tmp_path):
    out = tmp_path / "example"
    done = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(fashion_mnist), "--trials", "8",
                           "--inject-at", "5", "--steps-after", "5", "--out", str(out), "--workers", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    trials = rows(out)
    assert len(trials) == 8 and not [r for r in trials if r["outcome"] == "crashed"], trials
    assert "mlp" in (out / "spec.toml").read_text()
