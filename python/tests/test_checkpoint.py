"""steadfast.torch's checkpoints: exact round trips of nested state, what the CLI sees of
them, damage found and named, the fallback to the newest valid checkpoint, one writer per
root, retention, and kill -9 during asynchronous saves."""
import json
import math
import os
import pathlib
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import steadfast
import steadfast.torch as st
from bits import raw, same

HERE = pathlib.Path(__file__).resolve().parent


def trained(seed=0, steps=3):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def full_state(model, opt, step=3):
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "rng": st.rng_state(),
        "odd": {
            "nan": float("nan"), "inf": float("-inf"), "negative zero": -0.0, "big": 2**100, "bytes": b"\x00\xff", (1, "a"): None,
            7: True, "bf16": torch.randn(3).bfloat16(), "f16": torch.randn(2, 2).half(),
            "f64": torch.randn(2, dtype=torch.float64), "bool": torch.tensor([True, False]),
            "empty": torch.empty(0, 4), "zero-dim": torch.tensor(2.5), "i64": torch.arange(5), "i8": torch.tensor([-1, 2], dtype=torch.int8),
            "u8": torch.arange(4, dtype=torch.uint8), "strided": torch.arange(12.0).reshape(3, 4).T,
            "numpy": np.arange(6, dtype=np.int32).reshape(2, 3), "numpy scalar": np.int16(-7),
            "nested": [(1.5, "x"), {"deeper": [torch.ones(2)]}],
        },
    }


def test_a_nested_state_comes_back_bit_for_bit_with_its_types(tmp_path):
    model, opt = trained()
    state = full_state(model, opt)
    out = st.save(state, tmp_path / "ckpt", step=3)
    assert out == tmp_path / "ckpt" / "step-00000003"
    back = st.load(tmp_path / "ckpt")
    # A strided tensor comes back contiguous, with the same values.
    state["odd"]["strided"] = state["odd"]["strided"].contiguous()
    same(state, back)
    # What came back drives PyTorch as the original did.
    model2, opt2 = trained(seed=1)
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optimizer"])
    st.set_rng_state(back["rng"])
    x = torch.randn(4, 8)
    st.set_rng_state(state["rng"])
    assert torch.equal(torch.randn(4, 8), x)
    for m, o in ((model, opt), (model2, opt2)):
        loss = m(x).square().mean()
        o.zero_grad()
        loss.backward()
        o.step()
    for p, q in zip(model.parameters(), model2.parameters()):
        assert raw(p) == raw(q)


def test_steps_default_to_one_after_the_newest_and_retention_keeps_the_last(tmp_path):
    model, opt = trained()
    root = tmp_path / "ckpt"
    dirs = [st.save({"model": model.state_dict()}, root, keep_last=2) for _ in range(4)]
    assert [d.name for d in dirs] == ["step-00000000", "step-00000001", "step-00000002", "step-00000003"]
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000002", "step-00000003"]
    state, info = st.load(root, with_info=True)
    assert info["step"] == 3 and info["skipped"] == []


def test_the_cli_verifies_and_inspects_what_python_wrote(tmp_path, cli):
    model, opt = trained()
    d = st.save(full_state(model, opt), tmp_path / "ckpt", step=5)
    ok = subprocess.run([cli, "ckpt", "verify", str(tmp_path / "ckpt")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    shown = subprocess.run([cli, "ckpt", "--json", "inspect", str(d)], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    for name in ("model.0.weight", "optimizer.state.0.exp_avg", "rng.torch", "odd.bf16"):
        assert name in text, f"{name} missing from `ckpt inspect`"
    manifest = json.loads((d / "manifest.json").read_text())
    roles = {t["name"]: (t["role"], t["dtype"]) for t in manifest["tensors"]}
    assert roles["model.0.weight"] == ("model", "F32")
    assert roles["optimizer.state.0.exp_avg"] == ("optim", "F32")
    assert roles["rng.torch"] == ("extra", "U8")
    assert roles["odd.bf16"] == ("extra", "BF16")
    assert manifest["version"] == steadfast.FORMAT_VERSION


def damage(path, offset_from_end, byte=None):
    data = bytearray(path.read_bytes())
    i = len(data) - offset_from_end
    data[i] ^= 0x10 if byte is None else byte
    path.write_bytes(bytes(data))


def test_a_flipped_bit_or_a_truncated_shard_is_an_error_naming_the_file_and_tensor(tmp_path):
    model, opt = trained()
    d = st.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt", step=1)
    manifest = json.loads((d / "manifest.json").read_text())
    victim = manifest["tensors"][-1]
    shard = d / victim["file"]
    original = shard.read_bytes()
    # One bit in the middle of the victim tensor's bytes.
    data = bytearray(original)
    data[victim["offset"] + victim["length"] // 2] ^= 0x04
    shard.write_bytes(bytes(data))
    with pytest.raises(steadfast.CheckpointError) as e:
        st.load(d)
    assert victim["file"] in str(e.value) and victim["name"] in str(e.value)
    problems = st.verify(d)
    assert [(p.file, p.tensor) for p in problems] == [(victim["file"], victim["name"])]
    # Truncated.
    shard.write_bytes(original[: len(original) - 3])
    with pytest.raises(steadfast.CheckpointError) as e:
        st.load(d)
    assert victim["file"] in str(e.value)
    assert st.verify(d)
    # Restored, it loads again.
    shard.write_bytes(original)
    assert st.verify(d) == []
    st.load(d)


def test_a_root_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path):
    model, opt = trained()
    root = tmp_path / "ckpt"
    st.save({"model": model.state_dict(), "step": 1}, root, step=1)
    newest = st.save({"model": model.state_dict(), "step": 2}, root, step=2)
    damage(newest / "manifest.json", 40)
    with pytest.warns(UserWarning, match="step-00000002"):
        state, info = st.load(root, with_info=True)
    assert state["step"] == 1 and info["step"] == 1
    assert [pathlib.Path(p).name for p, _ in info["skipped"]] == ["step-00000002"]
    with pytest.raises(steadfast.CheckpointError):
        st.load(newest)
    # Verifying the root checks every checkpoint in it, not only the one a load takes.
    assert [p.file for p in st.verify(root)] == ["step-00000002/manifest.json"]
    assert st.verify(root / "step-00000001") == []
    assert st.verify(tmp_path / "empty") != []


def test_unsupported_values_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(TypeError, match="odd.f"):
        st.save({"odd": {"f": object()}}, tmp_path / "ckpt", step=0)
    with pytest.raises(TypeError, match="complex"):
        st.save({"c": torch.zeros(2, dtype=torch.complex64)}, tmp_path / "ckpt", step=0)
    with pytest.raises(ValueError, match="both be named"):
        st.save({"a.b": torch.zeros(1), "a": {"b": torch.zeros(1)}}, tmp_path / "ckpt", step=0)
    assert not list((tmp_path / "ckpt").glob("step-*")) if (tmp_path / "ckpt").exists() else True


def test_a_second_writer_of_a_root_is_refused(tmp_path):
    root = tmp_path / "ckpt"
    with st.AsyncCheckpointer(root) as first:
        with pytest.raises(steadfast.CheckpointError, match="written by this process already"):
            st.AsyncCheckpointer(root)
        with pytest.raises(steadfast.CheckpointError):
            st.save({"x": torch.zeros(1)}, root, step=9)
        first.save({"x": torch.ones(1)}, step=1)
    # Released on close.
    st.save({"x": torch.zeros(1)}, root, step=2)


def test_the_asynchronous_checkpointer_snapshots_and_commits_in_order(tmp_path):
    root = tmp_path / "ckpt"
    w = torch.zeros(1000)
    with st.AsyncCheckpointer(root, keep_last=3) as saver:
        for step in range(1, 6):
            w += 1
            saver.save({"model": {"w": w}, "step": step}, step)
            # The loop changes its tensor at once: the checkpoint holds the snapshot.
            w += 100
            w -= 100
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000003", "step-00000004", "step-00000005"]
    for step in (3, 4, 5):
        state = st.load(root / f"step-{step:08d}")
        assert state["step"] == step and torch.equal(state["model"]["w"], torch.full((1000,), float(step)))
    assert len(saver.stalls) == 5 and all(s >= 0 for s in saver.stalls)


SAVER_LOOP = """
import sys, torch, steadfast.torch as st
root = sys.argv[1]
saver = st.AsyncCheckpointer(root, keep_last=4)
step = (st.steps(root) or [0])[-1]    # on from the newest, as a resumed loop goes
while True:
    step += 1
    # Every tensor is a function of the step: a loaded checkpoint can be checked.
    saver.save({"model": {"w": torch.full((1 << 20,), float(step))}, "step": step}, step)
    print(step, flush=True)
"""


def test_kill_9_during_asynchronous_saves_leaves_the_newest_committed_checkpoint_loadable(tmp_path):
    rng = np.random.default_rng(7)
    root = tmp_path / "ckpt"
    for attempt in range(4):
        p = subprocess.Popen([sys.executable, "-c", SAVER_LOOP, str(root)], stdout=subprocess.PIPE, text=True)
        # Wait until it has saved a few, then kill it at a random instant.
        for _ in range(3 + attempt):
            assert p.stdout.readline(), "the saving loop died"
        time.sleep(float(rng.uniform(0, 0.05)))
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        state, info = st.load(root, with_info=True)
        assert info["skipped"] == []
        assert state["step"] == info["step"]
        assert torch.equal(state["model"]["w"], torch.full((1 << 20,), float(info["step"])))
        assert st.verify(root) == []
        # The next run takes the root over: the dead writer's lock went with it.
        with st.AsyncCheckpointer(root) as again:
            assert again.busy() is False


def test_the_sampler_resumes_mid_epoch_in_the_same_order():
    a = st.ResumableSampler(100, seed=3)
    seen = []
    it = iter(a)
    for _ in range(37):
        seen.append(next(it))
    saved = a.state_dict()
    b = st.ResumableSampler(100, seed=3)
    b.load_state_dict(saved)
    rest = list(b)
    assert sorted(seen + rest) == list(range(100))
    assert seen + rest == [int(i) for i in st.ResumableSampler(100, seed=3).order(0)]
    # Then the next epoch, a different permutation.
    assert b.epoch == 1 and list(b) != seen + rest
    with pytest.raises(ValueError):
        st.ResumableSampler(100, seed=4).load_state_dict(saved)


def test_batches_cover_each_epoch_drop_its_tail_and_resume_between_batches():
    a = st.ResumableSampler(10, seed=1)
    it = a.batches(3)
    first = [next(it) for _ in range(2)]
    saved = a.state_dict()
    assert saved["position"] == 6
    b = st.ResumableSampler(10, seed=1)
    b.load_state_dict(saved)
    rest = [next(it) for _ in range(4)]
    assert [x.tolist() for x in rest[:1]] == [next(b.batches(3)).tolist()]
    order0, order1 = a.order(0).tolist(), a.order(1).tolist()
    # Three batches of epoch 0 (its tenth example dropped), then epoch 1 from its start.
    assert sum((x.tolist() for x in first + rest[:1]), []) == order0[:9]
    assert sum((x.tolist() for x in rest[1:]), []) == order1[:9]
    with pytest.raises(ValueError):
        next(st.ResumableSampler(10).batches(11))
    for bad in ({**saved, "position": 11}, {**saved, "epoch": -1}):
        with pytest.raises(ValueError, match="not a place in an epoch"):
            st.ResumableSampler(10, seed=1).load_state_dict(bad)
    with pytest.raises(ValueError):
        st.ResumableSampler(-5)


def test_the_sampler_visits_steadfast_trains_order(cli, tmp_path):
    # `steadfast bench order` exports the trainer's order for a seed.
    out = tmp_path / "order.safetensors"
    r = subprocess.run([cli, "bench", "order", "--seed", "5", "--examples", "1000", "--epochs", "2", "--to", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    from safetensors.numpy import load_file
    order = load_file(str(out))["order"]
    s = st.ResumableSampler(1000, seed=5)
    assert [int(i) for i in s.order(0)] == order[0].tolist()
    assert [int(i) for i in s.order(1)] == order[1].tolist()
