"""The study's MLP in PyTorch, killed with kill -9 and restarted from steadfast.torch's
checkpoints, ends bit-identical to a run that never stopped; restarted from what
PyTorch's tutorials save (model and optimizer only), it does not; and one whose newest
checkpoint rotted while it was down restarts from the one before, still exact."""
import json
import pathlib
import signal
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "exact_restart.py"
STEPS = 60


def run(args, data, stderr=None):
    out = subprocess.run([sys.executable, str(EXAMPLE), "--data", str(data), "--steps", str(STEPS), *args],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    if stderr is not None:
        stderr.append(out.stderr)
    return json.loads(out.stdout.splitlines()[-1])


def killed(args, data, kill_after):
    cmd = [sys.executable, str(EXAMPLE), "--data", str(data), "--steps", str(STEPS), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if int(line) == kill_after:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()


def killed_then_resumed(args, data, kill_after):
    killed(args, data, kill_after)
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
    # Killed, and a bit of the newest checkpoint's weights flipped while it was down: the
    # restart passes over that checkpoint (saying so), resumes from the one before, and
    # saves the damaged step again on its way.
    root = tmp_path / "rotted"
    killed(["--ckpt", str(root), "--every", "10"], fashion_mnist, 35)
    newest = sorted(root.glob("step-*"))[-1]
    manifest = json.loads((newest / "manifest.json").read_text())
    w = next(t for t in manifest["tensors"] if t["name"] == "model.0.weight")
    shard = newest / w["file"]
    data = bytearray(shard.read_bytes())
    data[w["offset"] + 4 * 1000 + 2] ^= 0x04
    shard.write_bytes(bytes(data))
    said = []
    resumed = run(["--ckpt", str(root), "--every", "10"], fashion_mnist, said)
    assert resumed == whole
    assert f"passing over {newest}" in said[0] and "tensor model.0.weight" in said[0], said[0]
    assert f"replaced {newest}, which did not verify" in said[0], said[0]


def test_a_tutorial_style_restart_is_not_exact(tmp_path, fashion_mnist):
    args = ["--ckpt", str(tmp_path / "tutorial"), "--every", "10", "--tutorial"]
    whole = run(["--ckpt", str(tmp_path / "whole"), "--every", "10", "--tutorial"], fashion_mnist)
    resumed = killed_then_resumed(args, fashion_mnist, 27)
    assert resumed["step"] == whole["step"] and resumed["weights_sha256"] != whole["weights_sha256"]
