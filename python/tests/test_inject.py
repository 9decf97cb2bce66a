"""steadfast.inject from Python: the same flips, logs, replay and undo as `steadfast
inject`, on a PyTorch file and on a checkpoint that steadfast.torch wrote."""
import json
import shutil
import subprocess

import numpy as np
import pytest
import torch

import steadfast
import steadfast.torch as st


def state_dict():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)).state_dict()


def test_flips_in_a_pytorch_file_are_logged_undone_and_replayed(tmp_path):
    pt = tmp_path / "model.pt"
    torch.save(state_dict(), pt)
    original = pt.read_bytes()
    log = steadfast.inject(pt, out=tmp_path / "altered.pt", target="0.*", bits="exponent", count=3, seed=1)
    assert log["format"] and len(log["flips"]) == 3
    assert all(f["tensor"].startswith("0.") and 23 <= f["bits"][0] <= 30 for f in log["flips"])
    assert pt.read_bytes() == original  # the input is untouched
    altered = torch.load(tmp_path / "altered.pt")
    for f in log["flips"]:
        value = altered[f["tensor"]].reshape(-1)[f["element"]].item()
        assert f"{value}" != f["old_value"] or f["old_value"] == f["new_value"]
    # The log was written beside the copy; undo gives the original bytes back.
    assert (tmp_path / "altered.pt.inject.json").exists()
    steadfast.undo(tmp_path / "altered.pt", log)
    assert (tmp_path / "altered.pt").read_bytes() == original
    # Replayed on a fresh copy of the input: the same altered bytes as the first time.
    again = steadfast.replay(pt, log, out=tmp_path / "again.pt")
    assert again["flips"] == log["flips"]
    steadfast.inject(pt, out=tmp_path / "first.pt", target="0.*", bits="exponent", count=3, seed=1)
    assert (tmp_path / "again.pt").read_bytes() == (tmp_path / "first.pt").read_bytes()


def test_python_and_the_cli_flip_the_same_bits(tmp_path, cli):
    pt = tmp_path / "model.pt"
    torch.save(state_dict(), pt)
    py = steadfast.inject(pt, out=tmp_path / "py.pt", bits="mantissa", count=5, seed=9)
    r = subprocess.run([cli, "inject", str(pt), "--out", str(tmp_path / "cli.pt"), "--bits", "mantissa", "--count", "5",
                        "--seed", "9"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "py.pt").read_bytes() == (tmp_path / "cli.pt").read_bytes()
    cli_log = json.loads((tmp_path / "cli.pt.inject.json").read_text())
    # The same flips, each recorded against its own copy.
    assert [{**f, "file": ""} for f in cli_log["flips"]] == [{**f, "file": ""} for f in py["flips"]]


def test_a_checkpoint_written_from_python_is_altered_by_role_with_its_checksums_rewritten_or_kept(tmp_path):
    model = state_dict()
    root = tmp_path / "ckpt"
    d = st.save({"model": model, "rng": st.rng_state()}, root, step=1)
    names = {t["name"]: t["role"] for t in steadfast.tensors_in(d)}
    assert names["model.0.weight"] == "model" and names["rng.torch"] == "extra"
    log = steadfast.inject(d, out=tmp_path / "rewritten", role="model", bits="sign", count=2, seed=3)
    assert {f["role"] for f in log["flips"]} == {"model"}
    assert st.verify(tmp_path / "rewritten") == []  # the checksums were rewritten
    back = st.load(tmp_path / "rewritten")
    changed = [n for n in model if not torch.equal(model[n], back["model"][n])]
    assert changed and all(n in {f["tensor"].removeprefix("model.") for f in log["flips"]} for n in changed)
    kept = steadfast.inject(d, out=tmp_path / "kept", role="model", bits="sign", count=2, seed=3,
                            keep_checksums=True)
    problems = st.verify(tmp_path / "kept")
    assert {p.tensor for p in problems} == {f["tensor"] for f in kept["flips"]}
    with pytest.raises(steadfast.CheckpointError):
        st.load(tmp_path / "kept")
    # The original checkpoint is as it was.
    assert st.verify(d) == []


def test_bad_requests_are_errors_and_alter_nothing(tmp_path):
    pt = tmp_path / "model.pt"
    torch.save(state_dict(), pt)
    original = pt.read_bytes()
    with pytest.raises(ValueError, match="role"):
        steadfast.inject(pt, role="weights")
    with pytest.raises(ValueError, match="bits"):
        steadfast.inject(pt, bits="exponant")
    with pytest.raises(ValueError, match="not both"):
        steadfast.inject(pt, count=1, rate=0.1)
    with pytest.raises(steadfast.InjectError, match="no tensor"):
        steadfast.inject(pt, target="nothing.*")
    with pytest.raises(steadfast.InjectError):
        steadfast.inject(tmp_path / "missing.pt")
    log = steadfast.inject(pt, out=tmp_path / "a.pt", count=1, seed=2)
    # Undo on a file that does not hold the log's new bytes is refused.
    with pytest.raises(steadfast.InjectError, match="log expects"):
        steadfast.undo(pt, log)
    with pytest.raises(ValueError, match="injection log"):
        steadfast.undo(pt, {"flips": "no"})
    shutil.copy(pt, tmp_path / "b.pt")
    assert pt.read_bytes() == original


def bits_of(state):
    """Every tensor of a state dict as raw bytes (NaN-safe equality)."""
    return {k: v.detach().contiguous().view(torch.uint8).clone() for k, v in state.items()}


def test_flips_in_a_module_land_in_its_parameters_and_undo_and_replay(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    before = bits_of(model.state_dict())
    log = steadfast.inject(model, target="*.weight", bits="exponent", count=3, seed=5, log=tmp_path / "l.json")
    assert log["target"] == "memory" and log["format"] == "memory" and len(log["flips"]) == 3
    after = bits_of(model.state_dict())
    for f in log["flips"]:
        assert f["tensor"].endswith(".weight") and f["role"] == "model"
        got = model.state_dict()[f["tensor"]].reshape(-1)[f["element"]]
        assert got.view(torch.int32).item().to_bytes(4, "little", signed=True).hex() == f["new_bytes"]
    assert {k for k in before if not torch.equal(before[k], after[k])} == {f["tensor"] for f in log["flips"]}
    # The forward pass sees the flips: they are in the parameters themselves.
    assert model[0].weight.data_ptr() == model.state_dict()["0.weight"].data_ptr()
    steadfast.undo(model, log)
    assert all(torch.equal(v, before[k]) for k, v in bits_of(model.state_dict()).items())
    steadfast.replay(model, tmp_path / "l.json")
    assert all(torch.equal(v, after[k]) for k, v in bits_of(model.state_dict()).items())
    # Replayed again, the log's old bytes are gone: an error, and nothing changes.
    with pytest.raises(steadfast.InjectError, match="the log expects"):
        steadfast.replay(model, log)
    assert all(torch.equal(v, after[k]) for k, v in bits_of(model.state_dict()).items())


def test_a_training_state_is_altered_by_role_and_a_view_through_its_base(tmp_path):
    torch.manual_seed(1)
    model = torch.nn.Linear(6, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 6)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    weights = bits_of(model.state_dict())
    log = steadfast.inject(state, role="optim", bits="sign", count=4, seed=2)
    assert {f["tensor"].split(".")[0] for f in log["flips"]} == {"optimizer"}
    assert all(torch.equal(v, weights[k]) for k, v in bits_of(model.state_dict()).items())
    slots = {f["tensor"] for f in log["flips"]}
    assert slots <= {"optimizer.state.0.exp_avg", "optimizer.state.0.exp_avg_sq", "optimizer.state.1.exp_avg",
                     "optimizer.state.1.exp_avg_sq", "optimizer.state.0.step", "optimizer.state.1.step"}
    # A transposed view is flipped through a copy and written back into its base.
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base.t()
    log = steadfast.inject({"v": view}, bits="sign", count=1, seed=0)
    (flip,) = log["flips"]
    r, c = divmod(flip["element"], 3)          # row-major in the view's [4, 3] shape
    assert base[c, r].item() == -float(c * 4 + r) and (base < 0).sum().item() == (1 if c * 4 + r else 0)


def test_tied_weights_are_flipped_once_and_read_only_arrays_are_refused():
    shared = torch.zeros(4)
    log = steadfast.inject({"a": shared, "b": shared}, bits="sign", count=2, seed=0)
    assert {f["tensor"] for f in log["flips"]} == {"a"}
    assert (shared.view(torch.int32) != 0).sum().item() == 2
    frozen = np.frombuffer(bytes(16), dtype=np.float32)
    with pytest.raises(ValueError, match="read-only"):
        steadfast.inject({"w": frozen}, count=1)
    assert bytes(frozen.tobytes()) == bytes(16)
    with pytest.raises(steadfast.InjectError, match="no tensor matches"):
        steadfast.inject({"w": torch.zeros(2)}, target="nothing*")
    with pytest.raises(ValueError, match="for files"):
        steadfast.inject({"w": torch.zeros(2)}, out="x.pt")


def test_a_state_and_its_checkpoint_take_the_same_flips_for_the_same_seed(tmp_path):
    torch.manual_seed(2)
    state = {"model": torch.nn.Linear(16, 8).state_dict()}
    root = tmp_path / "ckpt"
    st.save(state, root, step=0)
    in_file = steadfast.inject(root, bits="mantissa", count=5, seed=9)
    in_memory = steadfast.inject(state, bits="mantissa", count=5, seed=9)
    key = lambda f: (f["tensor"], f["element"], f["bits"], f["old_bytes"], f["new_bytes"])  # noqa: E731
    assert [key(f) for f in in_memory["flips"]] == [key(f) for f in in_file["flips"]]
    # And the state saved now holds what the altered checkpoint holds.
    assert all(torch.equal(a, b) for a, b in zip(state["model"].values(), st.load(root)["model"].values()))


def test_views_of_overlapping_memory_are_refused_and_aliases_are_named():
    base = torch.arange(1.0, 17.0).reshape(4, 4)
    before = base.clone()
    for state in ({"w": base, "wt": base.t()}, {"a": base[:, 0:2], "b": base[:, 1:3]}):
        with pytest.raises(ValueError, match="overlapping memory"):
            steadfast.inject(state, bits="sign", count=1, seed=1)
        assert torch.equal(base, before)
    array = np.arange(16, dtype=np.float32).reshape(4, 4)
    with pytest.raises(ValueError, match="overlapping memory"):
        steadfast.inject({"a": array, "reversed": array[::-1]}, bits="sign", count=1)
    log = steadfast.inject({"a": array, "b": np.zeros(3, dtype=np.float32)}, bits="sign", count=2, seed=3)
    assert (array < 0).sum() + 0 == sum(f["tensor"] == "a" and f["old_value"] != "0" for f in log["flips"])
    shared = torch.zeros(3)
    state = {"model": {"enc": shared, "dec": shared}}
    listed = {t["name"]: t.get("alias_of") for t in steadfast.tensors_in(state)}
    assert listed == {"model.enc": None, "model.dec": "model.enc"}
    with pytest.raises(steadfast.InjectError, match="model.dec is the same tensor as model.enc"):
        steadfast.inject(state, target="model.dec", bits="sign")


def test_modules_and_optimizers_nested_in_a_state_are_altered_where_they_live():
    torch.manual_seed(4)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    weight = model.weight.detach().clone()
    log = steadfast.inject({"model": model, "optimizer": opt}, role="model", target="model.weight", bits="sign")
    (flip,) = log["flips"]
    assert flip["tensor"] == "model.weight"
    assert model.weight.reshape(-1)[flip["element"]].item() == -weight.reshape(-1)[flip["element"]].item()
    log = steadfast.inject({"model": model, "optimizer": opt}, role="optim", bits="sign", count=2, seed=1)
    assert all(f["tensor"].startswith("optimizer.state.") for f in log["flips"])
