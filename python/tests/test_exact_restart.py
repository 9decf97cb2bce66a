"""The study's MLP in PyTorch, killed with kill -9 and restarted from steadfast.torch's
checkpoints, ends bit-identical to a run that never stopped; restarted from what
PyTorch's tutorials save (model and optimizer only), it does not."""
import json
import pathlib
import signal
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "exact_restart.py"
STEPS = 60


def run(args, data):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(data), "--steps", str(STEPS), *args],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def killed_then_resumed(args, data, kill_after):
    cmd = [sys.executable, str(EXAMPLE), "--data", str(data), "--steps", str(STEPS), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if int(line) == kill_after:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    return run(args, data)


def test_a_killed_loop_resumes_bit_identical(tmp_path, fashion_mnist):
    whole = run(["--ckpt", str(tmp_path / "whole"), "--every", "10"], fashion_mnist)
    assert whole["step"] == STEPS
    # Killed between checkpoints (after step 27, the newest is 20), then again right
    # after one was handed to the background writer.
    for kill_after in (27, 40):
        root = tmp_path / f"killed-{kill_after}"
        resumed = killed_then_resumed(["--ckpt", str(root), "--every", "10"], fashion_mnist, kill_after)
        assert resumed == whole, f"killed after step {kill_after}"


def test_a_tutorial_style_restart_is_not_exact(tmp_path, fashion_mnist):
    args = ["--ckpt", str(tmp_path / "tutorial"), "--every", "10", "--tutorial"]
    whole = run(["--ckpt", str(tmp_path / "whole"), "--every", "10", "--tutorial"], fashion_mnist)
    resumed = killed_then_resumed(args, fashion_mnist, 27)
    assert resumed["step"] == whole["step"] and resumed["weights_sha256"] != whole["weights_sha256"]
