"""A PyTorch job under Steadfast's launcher (``steadfast.elastic``, the example
``python/examples/elastic_ddp.py``): the final weights' SHA-256 is the undisturbed
single-process run's on any number of workers, and after a worker is killed with SIGKILL
or stopped past its heartbeat at a random moment (replaced from the live replicas, or the
job shrinks). Each random moment comes from a seed the test prints."""
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import ROOT

import steadfast.elastic as se

EXAMPLE = ROOT / "python" / "examples" / "elastic_ddp.py"
SHA = re.compile(r"weights sha256: ([0-9a-f]{64})")
# The MLP's job in every test that disturbs it (one undisturbed run to compare with).
MLP = ("--steps", "150", "--batch", "96", "--micro-batches", "6")
LONG = ("--steps", "400", "--batch", "96", "--micro-batches", "6")
# Slower steps, where a replacement must start (a fresh Python, PyTorch and the data set) and
# still find the job running (scripts/netns-python-test.sh runs this job too).
SLOW = ("--width", "1024", "--steps", "400", "--batch", "96", "--micro-batches", "6")


def _env(data):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(EXAMPLE.parent), env.get("PYTHONPATH")]))
    return env


_ALONE = {}


def _alone(data, *args):
    """The undisturbed single-process run's digest (once per arguments in a session)."""
    if args in _ALONE:
        return _ALONE[args]
    out = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(data), *args], env=_env(data),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    _ALONE[args] = SHA.findall(out.stdout)[0]
    return _ALONE[args]


def _launch(cli, data, nproc, args, launch_args=(), log=None):
    command = [cli, "launch", "--nproc", str(nproc), *launch_args, "--", sys.executable, str(EXAMPLE),
               "--data", str(data), *args]
    return subprocess.Popen(command, env=_env(data), stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _pid(log_text, worker):
    pids = re.findall(rf"worker {worker} started: process \d+ \(pid (\d+)\)", log_text)
    return int(pids[-1]) if pids else None


def _wait_for(path, pattern, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if re.search(pattern, text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in {path}:\n{path.read_text(errors='replace')}")


def _ended(job, path):
    try:
        job.wait(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        raise AssertionError("the job did not end within 300 s:\n" + path.read_text(errors="replace"))
    return path.read_text(errors="replace")


def test_one_process_and_two_workers_give_the_same_weights_for_the_transformer(cli, fashion_mnist, tmp_path):
    # The transformer's dropout draws from the generator each micro-batch's context seeds.
    args = ["--model", "transformer", "--steps", "12", "--batch", "64"]
    alone = _alone(fashion_mnist, *args)
    log = tmp_path / "launch.log"
    with open(log, "w") as f:
        text = _ended(_launch(cli, fashion_mnist, 2, args, ["--max-restarts", "0"], f), log)
    assert "the job finished" in text, text
    assert SHA.findall(text) == [alone, alone], text


@pytest.mark.parametrize("blow", ["kill", "stop"])
def test_a_worker_lost_at_a_random_moment_is_replaced_from_the_replicas_with_the_same_bits(
        cli, fashion_mnist, tmp_path, blow):
    seed = int(os.environ.get("STEADFAST_TEST_SEED", time.time_ns() % 100000))
    print(f"seed {seed} (STEADFAST_TEST_SEED={seed} draws the same moment)")
    draw = random.Random(seed)
    args = MLP
    alone = _alone(fashion_mnist, *args)
    log = tmp_path / "launch.log"
    with open(log, "w") as f:
        # A killed worker's survivors step on while its replacement starts (--min-nproc); a
        # stopped one's wait for theirs: both paths end with the same bits.
        going_on = ["--min-nproc", "2"] if blow == "kill" else []
        job = _launch(cli, fashion_mnist, 3, args, ["--max-restarts", "2", "--heartbeat-timeout", "2", *going_on], f)
        _wait_for(log, r"epoch 1 steps", 120)
        # (Within the job's few seconds of steps: a worker stopped after the end is killed
        # only at the launcher's grace, two minutes on.)
        time.sleep(draw.uniform(0.1, 1.5))
        victim = draw.randrange(3)
        pid = _pid(log.read_text(errors="replace"), victim)
        os.kill(pid, signal.SIGKILL if blow == "kill" else signal.SIGSTOP)
        text = _ended(job, log)
    assert job.returncode == 0, text
    shas = SHA.findall(text)
    assert shas and set(shas) == {alone}, text
    fetched = re.search(r"\[\d\] \[steadfast\] fetched the state of step \d+", text)
    if "every member holds the final state" not in text.split(f"worker {victim} (process 1)")[0]:
        # The blow landed while the job trained: a replacement started, and fetched the state
        # unless the survivors (going on without it) finished first.
        assert re.search(rf"replacing worker {victim}", text), text
        assert fetched or going_on, text
        assert len(shas) == (3 if fetched else 2), text
    if going_on and fetched:
        # The survivors stepped while the replacement started: an epoch of two before the
        # one it joined.
        assert re.search(r"epoch 2: workers \[\d, \d\] ", text), text


def test_a_bit_flipped_at_rest_in_one_worker_is_found_and_repaired_from_the_replicas(cli, fashion_mnist, tmp_path):
    args = MLP
    alone = _alone(fashion_mnist, *args)
    log = tmp_path / "launch.log"
    with open(log, "w") as f:
        text = _ended(_launch(cli, fashion_mnist, 3, [*args, "--flip", "40:1"], ["--max-restarts", "0"], f), log)
    assert re.search(r"\[1\] flipped a bit of \S+ after step 40", text), text
    assert re.search(r"\[1\] \[steadfast\] the state changed at rest since its commit", text), text
    assert re.search(r"epoch 2: workers \[0, 1, 2\] from step 40 \S+; \[1\] fetch the state from \[0, 2\]", text), text
    assert SHA.findall(text) == [alone] * 3, text


def test_a_job_that_shrinks_ends_with_the_same_bits(cli, fashion_mnist, tmp_path):
    args = MLP
    alone = _alone(fashion_mnist, *args)
    log = tmp_path / "launch.log"
    with open(log, "w") as f:
        # (Four workers: with the single process and the transformer's two, the job's bits
        # are checked on 1, 2, 3 and 4.)
        job = _launch(cli, fashion_mnist, 4, args, ["--on-failure", "shrink", "--min-nproc", "1"], f)
        _wait_for(log, r"epoch 1 steps", 120)
        time.sleep(1.0)
        os.kill(_pid(log.read_text(errors="replace"), 1), signal.SIGKILL)
        text = _ended(job, log)
    assert job.returncode == 0, text
    assert re.search(r"epoch 2: workers \[0, 2, 3\]", text), text
    assert SHA.findall(text) == [alone] * 3, text


def test_a_job_killed_whole_resumes_from_its_parted_checkpoints_on_another_worker_count(cli, fashion_mnist,
                                                                                         tmp_path):
    seed = int(os.environ.get("STEADFAST_TEST_SEED", time.time_ns() % 100000))
    print(f"seed {seed} (STEADFAST_TEST_SEED={seed} draws the same moment)")
    args = LONG
    alone = _alone(fashion_mnist, *args)
    root = tmp_path / "ckpt"
    saving = [*args, "--checkpoint-dir", str(root), "--checkpoint-every", "20", "--resume", "latest"]
    log = tmp_path / "first.log"
    with open(log, "w") as f:
        job = _launch(cli, fashion_mnist, 2, saving, ["--max-restarts", "0"], f)
        _wait_for(log, r"epoch 1 steps", 120)
        time.sleep(random.Random(seed).uniform(1.0, 3.0))
        os.killpg(job.pid, signal.SIGKILL)          # the launcher and every worker at once
        job.wait()
    steps = [int(d.name.split("-")[1]) for d in root.glob("step-*")]
    verified = subprocess.run([cli, "ckpt", "verify", str(root)], capture_output=True, text=True)
    assert verified.returncode == 0 and " 0 corrupt" in verified.stdout, verified.stdout + verified.stderr
    log = tmp_path / "second.log"
    with open(log, "w") as f:
        text = _ended(_launch(cli, fashion_mnist, 3, saving, ["--max-restarts", "0"], f), log)
    assert SHA.findall(text) == [alone] * 3, f"checkpoints at {sorted(steps)} before the second run\n{text}"
    if steps:
        assert re.search(rf"from step {max(steps)} ", text), text


def test_the_launcher_refuses_another_program_outside_an_elastic_job(cli):
    for flags, said in ([[], "make the job elastic with --max-restarts K"],
                        [["--max-restarts", "1", "--recovery", "checkpoint"], "recovers from its live replicas"]):
        out = subprocess.run([cli, "launch", "--nproc", "2", *flags, "--", sys.executable, "train.py"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and said in out.stderr, out.stderr


def test_the_steps_of_a_job_alone_refuse_a_micro_batch_out_of_turn_or_left_out():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job = se.Job(model, opt, steps=2, micro_batches=2)
    assert job.worker is None
    steps = iter(job)
    step = next(steps)
    with pytest.raises(ValueError, match="micro-batch 1 out of turn: this worker computes 0 next"):
        with step.micro_batch(1):
            pass
    with step.micro_batch(0):
        model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(RuntimeError, match=r"micro-batches \[1\] not computed"):
        next(steps)


def test_a_job_alone_applies_the_mean_of_its_micro_batches():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    xs = [torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[3.0, 0.0, -1.0]])]
    for step in se.Job(model, opt, steps=1, micro_batches=2):
        for i in step.micro_batches:
            with step.micro_batch(i):
                model(xs[i]).sum().backward()
    # d(w.x)/dw = x: the mean gradient of the two micro-batches is (2, 1, 1).
    assert torch.equal(model.weight.detach(), before - torch.tensor([[2.0, 1.0, 1.0]]))


def test_a_node_lost_across_hosts_comes_back_and_fetches_the_state_with_the_same_bits(cli, fashion_mnist):
    # Two hosts as network namespaces meeting in etcd (scripts/netns-python-test.sh): host
    # 1's launcher and worker killed, host 0's going on alone, host 1 started again.
    is_root = os.geteuid() == 0
    has_ip = subprocess.run(["ip", "-V"], capture_output=True).returncode == 0 if is_root else False
    if not (is_root and has_ip):
        pytest.skip("needs root and iproute2 (hosts as network namespaces)")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "netns-python-test.sh"), cli, sys.executable,
                          str(fashion_mnist), _alone(fashion_mnist, *SLOW)], capture_output=True, text=True,
                         timeout=600)
    text = out.stdout + out.stderr
    if out.returncode == 77:
        pytest.skip(text)
    assert out.returncode == 0, text
    assert "ok: host 1's new worker fetched the state of step" in text, text


def test_slurm_runs_a_pytorch_job_whose_killed_worker_is_replaced_with_the_same_bits(cli, fashion_mnist, tmp_path):
    # A one-host Slurm cluster (scripts/slurm-one-host.sh: Debian's slurm-wlm and munge, as
    # root) runs examples/slurm/elastic.sbatch with `-- python elastic_ddp.py`: srun starts
    # one launcher per task (each standing for a node); one worker is killed with SIGKILL.
    script = ROOT / "scripts" / "slurm-one-host.sh"
    cluster = tmp_path / "slurm"
    started = subprocess.run(["bash", str(script), "start", str(cluster)], capture_output=True, text=True)
    if started.returncode == 77:
        if os.environ.get("STEADFAST_REQUIRE_SLURM"):
            pytest.fail("STEADFAST_REQUIRE_SLURM is set: " + started.stdout + started.stderr)
        pytest.skip(started.stdout + started.stderr)
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        env = _env(fashion_mnist)
        env.update(SLURM_CONF=str(cluster / "slurm.conf"), STEADFAST_BIN=cli, STEADFAST_NPROC_PER_NODE="1",
                   STEADFAST_RESTARTS="1")
        alone = _alone(fashion_mnist, *SLOW)
        output = tmp_path / "job.out"
        submitted = subprocess.run(
            ["sbatch", "--parsable", "--ntasks", "2", "--ntasks-per-node", "2", "--output", str(output),
             str(ROOT / "examples" / "slurm" / "elastic.sbatch"), "--", sys.executable, str(EXAMPLE),
             "--data", str(fashion_mnist), *SLOW], env=env, capture_output=True, text=True, cwd=tmp_path)
        assert submitted.returncode == 0, submitted.stderr
        job = submitted.stdout.strip().split(";")[0]
        text = _wait_for(output, r"step +50 +loss", 180)
        os.kill(_pid(text, 1), signal.SIGKILL)
        deadline = time.monotonic() + 300
        state = ""
        while time.monotonic() < deadline:
            shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True)
            state = next((f.split("=", 1)[1] for f in shown.stdout.split() if f.startswith("JobState=")), "")
            if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", ""):
                break
            time.sleep(0.5)
        text = output.read_text(errors="replace")
        assert state == "COMPLETED", f"job {job} {state}:\n{text}"
        assert "replacing worker 1" in text, text
        shas = SHA.findall(text)
        assert shas and set(shas) == {alone}, text
    finally:
        subprocess.run(["bash", str(script), "stop", str(cluster)], capture_output=True)


def test_pods_of_the_pytorch_jobset_survive_a_worker_their_kubelet_restarts(cli, fashion_mnist, tmp_path):
    # deploy/kubernetes/elastic-pytorch.yaml's shape run here (its consistency is checked by
    # crates/cli/tests/deploy_manifests.rs): the coordinator's command, and bare Python
    # workers that find their job in the environment the manifest gives them; one killed
    # with SIGKILL and its command started again, as the kubelet restarts a container.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env(fashion_mnist)
    env.update(STEADFAST_SECRET="from-the-kubernetes-secret")
    coordinator = subprocess.Popen([cli, "coordinator", "--elastic", "--bind", f"127.0.0.1:{port}", "--world-size",
                                    "2", "--min-world", "1", "--heartbeat-timeout", "2", "--quorum-timeout", "60"],
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    logs = [tmp_path / f"pod{i}.log" for i in range(2)]

    def pod(i, mode="w"):
        pod_env = dict(env, STEADFAST_ELASTIC="1", STEADFAST_WORLD_SIZE="2", STEADFAST_RANK=str(i),
                       STEADFAST_COORDINATOR=f"127.0.0.1:{port}")
        with open(logs[i], mode) as f:
            return subprocess.Popen([sys.executable, str(EXAMPLE), "--data", str(fashion_mnist), *SLOW], env=pod_env,
                                    stdout=f, stderr=subprocess.STDOUT)

    pods = [pod(0), pod(1)]
    try:
        _wait_for(logs[1], r"step +50 +loss", 120)
        pods[1].kill()
        pods[1].wait()
        pods[1] = pod(1, "a")
        said, _ = coordinator.communicate(timeout=300)
        assert coordinator.returncode == 0, said
        for p in pods:
            p.wait(timeout=60)
    finally:
        for p in [coordinator, *pods]:
            if p.poll() is None:
                p.kill()
    assert "[1] fetch the state from [0]" in said, said
    alone = _alone(fashion_mnist, *SLOW)
    shas = [SHA.findall(log.read_text())[-1:] for log in logs]
    assert shas == [[alone], [alone]], said + "".join(log.read_text() for log in logs)


def test_a_second_job_on_a_running_jobs_checkpoint_directory_is_refused(cli, fashion_mnist, tmp_path):
    # Two runs on one directory: the second job's workers find the first's lock and stop
    # before their first step, saying which process holds it; the first goes on untouched.
    # (The first job is held still with SIGSTOP, its lock taken, while the second starts;
    # its heartbeat timeout outlasts the pause.)
    root = tmp_path / "ckpt"
    saving = [*LONG, "--checkpoint-dir", str(root), "--checkpoint-every", "20"]
    first_log = tmp_path / "first.log"
    with open(first_log, "w") as f:
        first = _launch(cli, fashion_mnist, 2, saving, ["--max-restarts", "0", "--heartbeat-timeout", "120"], f)
        try:
            _wait_for(first_log, r"epoch 1 steps", 120)
            deadline = time.monotonic() + 60
            while not list(root.glob("step-*")) and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(first.pid, signal.SIGSTOP)
            before = sorted(p.name for p in root.iterdir())
            second = subprocess.run([cli, "launch", "--nproc", "2", "--max-restarts", "0", "--", sys.executable,
                                     str(EXAMPLE), "--data", str(fashion_mnist), *saving], env=_env(fashion_mnist),
                                    capture_output=True, text=True, timeout=300)
            said = second.stdout + second.stderr
            assert second.returncode != 0, said
            assert "two runs cannot write one checkpoint directory" in said, said
            assert sorted(p.name for p in root.iterdir()) == before
            os.killpg(first.pid, signal.SIGCONT)
            text = _ended(first, first_log)
        finally:
            if first.poll() is None:
                os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, text
    assert SHA.findall(text) == [_alone(fashion_mnist, *LONG)] * 2, text
