"""steadfast.torch.load reads each checkpoint once, verified, into the tensors it returns
(or the caller's own), passes over a newest checkpoint whose data is damaged as the CLI
does, and save never replaces a checkpoint that verifies unless told to."""
import importlib.metadata
import pathlib
import re
import warnings

import pytest
import torch

import steadfast
import steadfast.torch as st


def shard_of(d, tensor="w"):
    """The shard file of checkpoint `d` that holds `tensor`, and the tensor's offset in it."""
    import json
    manifest = json.loads((pathlib.Path(d) / "manifest.json").read_text())
    (entry,) = [t for t in manifest["tensors"] if t["name"] == tensor]
    return pathlib.Path(d) / entry["file"], entry["offset"]


def two_steps(root):
    st.save({"w": torch.ones(1000)}, root, step=1)
    return st.save({"w": torch.full((1000,), 2.0)}, root, step=2)


def flip_byte_in_w(d):
    path, offset = shard_of(d)
    data = bytearray(path.read_bytes())
    data[offset + 100] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_newest_checkpoint_with_a_flipped_byte_in_its_data_is_passed_over_with_a_warning(tmp_path):
    newest = two_steps(tmp_path)
    flip_byte_in_w(newest)
    with pytest.warns(UserWarning, match=r"passing over .*step-00000002.*did not check out.*tensor w.*loading step 1"):
        state, info = st.load(tmp_path, with_info=True)
    assert info["step"] == 1 and torch.equal(state["w"], torch.ones(1000))
    assert [pathlib.Path(d).name for d, _ in info["skipped"]] == ["step-00000002"]
    assert "checksum" in info["skipped"][0][1]
    # The damaged checkpoint named itself is an error, never a state.
    with pytest.raises(steadfast.CheckpointError, match="tensor w"):
        st.load(newest)


def test_a_truncated_shard_is_passed_over_too_and_no_checkpoint_that_verifies_is_an_error(tmp_path):
    newest = two_steps(tmp_path)
    path, _ = shard_of(newest)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.warns(UserWarning, match="passing over"):
        assert st.load(tmp_path)["w"][0] == 1.0
    flip_byte_in_w(tmp_path / "step-00000001")
    with pytest.raises(steadfast.CheckpointError, match=r"no checkpoint in it verifies.*step-00000002.*step-00000001"):
        st.load(tmp_path)


def test_load_into_a_modules_own_parameters_fills_them_in_place(tmp_path):
    torch.manual_seed(0)
    saved = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 2))
    st.save({"model": saved.state_dict(), "step": 7}, tmp_path, step=7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.Linear(4, 2))
    weight = model[0].weight
    state = st.load(tmp_path, into={"model": model.state_dict()})
    assert model[0].weight is weight and state["step"] == 7
    for a, b in zip(saved.parameters(), model.parameters()):
        assert torch.equal(a, b)
    # The returned state holds the module's own memory.
    assert state["model"]["0.weight"].data_ptr() == weight.data_ptr()
    # Autograd is told, as by an in-place copy: a graph built before the load cannot
    # silently use the new values.
    loss = model(torch.randn(1, 6)).sum()
    st.load(tmp_path, into={"model": model.state_dict()})
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_load_into_tensors_of_another_shape_is_refused_before_anything_is_written(tmp_path):
    st.save({"model": {"w": torch.ones(4, 3), "b": torch.ones(4)}}, tmp_path, step=1)
    into = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}}
    with pytest.raises(steadfast.CheckpointError, match=r"tensor model.w is F32 \[4, 3\], `into` has torch.float32 \[3, 4\]"):
        st.load(tmp_path, into=into)
    assert not into["model"]["b"].any()
    with pytest.raises(steadfast.CheckpointError, match="does not hold.*model.extra"):
        st.load(tmp_path, into={"model": {"extra": torch.zeros(1)}})


def test_load_into_tied_or_strided_targets_reads_each_once(tmp_path):
    st.save({"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(6.0).reshape(2, 3) + 10}, tmp_path, step=1)
    base = torch.zeros(2, 3)
    strided = torch.zeros(3, 2).T            # not contiguous: read aside, then copied in
    state = st.load(tmp_path, into={"a": base, "b": strided})
    assert torch.equal(base, torch.arange(6.0).reshape(2, 3)) and torch.equal(strided, base + 10)
    assert state["b"] is strided


def test_saving_a_step_that_verifies_again_is_refused_unless_overwrite(tmp_path):
    st.save({"w": torch.ones(3)}, tmp_path, step=5)
    with pytest.raises(steadfast.CheckpointError, match="already holds a checkpoint of step 5 that verifies.*overwrite=True"):
        st.save({"w": torch.zeros(3)}, tmp_path, step=5)
    assert torch.equal(st.load(tmp_path)["w"], torch.ones(3))
    st.save({"w": torch.zeros(3)}, tmp_path, step=5, overwrite=True)
    assert torch.equal(st.load(tmp_path)["w"], torch.zeros(3))
    with st.AsyncCheckpointer(tmp_path) as saver:
        with pytest.raises(steadfast.CheckpointError, match="step 5 that verifies"):
            saver.save({"w": torch.ones(3)}, 5)
    with st.AsyncCheckpointer(tmp_path, overwrite=True) as saver:
        saver.save({"w": torch.full((3,), 9.0)}, 5)
    assert torch.equal(st.load(tmp_path)["w"], torch.full((3,), 9.0))


def test_a_damaged_checkpoint_of_the_step_is_replaced_with_a_warning(tmp_path):
    # What a loop that resumed past its damaged newest checkpoint does when it gets there.
    newest = two_steps(tmp_path)
    flip_byte_in_w(newest)
    with pytest.warns(UserWarning, match=r"replaced .*step-00000002, which did not verify"):
        st.save({"w": torch.full((1000,), 3.0)}, tmp_path, step=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(st.load(tmp_path)["w"], torch.full((1000,), 3.0))


def test_a_prepared_checkpointer_saves_what_it_was_given(tmp_path):
    w = torch.arange(1 << 20, dtype=torch.float32)
    with st.AsyncCheckpointer(tmp_path) as saver:
        saver.prepare({"model": {"w": w}})
        saver.save({"model": {"w": w}}, 1)
        w += 1                                   # the snapshot was taken: this is not in it
        saver.save({"model": {"w": w, "b": torch.ones(2)}}, 2)   # another layout than prepared
    assert torch.equal(st.load(tmp_path / "step-00000001")["model"]["w"], w - 1)
    assert torch.equal(st.load(tmp_path)["model"]["w"], w)


def test_the_package_has_a_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", steadfast.__version__), steadfast.__version__
    try:
        installed = importlib.metadata.version("steadfast")
    except importlib.metadata.PackageNotFoundError:
        return                                   # run from the source tree, not installed
    assert steadfast.__version__ == installed


def test_a_legacy_pt_file_and_a_pickled_module_say_what_to_do(tmp_path):
    model = torch.nn.Linear(3, 2)
    torch.save(model.state_dict(), tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(steadfast.InjectError, match=r"legacy \(non-zip\) format.*torch.save"):
        steadfast.tensors_in(tmp_path / "old.pt")
    torch.save(model, tmp_path / "module.pt")
    with pytest.raises(steadfast.InjectError, match=r"pickled torch.nn.modules.linear.Linear object.*state_dict\(\)"):
        steadfast.tensors_in(tmp_path / "module.pt")


def test_a_state_of_none_is_refused_and_deletes_nothing(tmp_path):
    st.save({"w": torch.ones(3)}, tmp_path, step=1)
    with pytest.raises(ValueError, match="the state is None"):
        st.save(None, tmp_path, step=2, keep_last=1)
    with st.AsyncCheckpointer(tmp_path) as saver, pytest.raises(ValueError, match="the state is None"):
        saver.save(None, 3)
    assert st.steps(tmp_path) == [1] and torch.equal(st.load(tmp_path)["w"], torch.ones(3))


def test_saving_below_later_checkpoints_that_verify_is_refused_unless_overwrite_which_removes_them(tmp_path):
    # A loop rolled back to an older checkpoint (a loss spike): a load of the root would
    # take the abandoned later ones, and retention would prune the resumed run's.
    for s in (498, 499, 500):
        st.save({"s": s}, tmp_path, step=s, keep_last=3)
    with pytest.raises(steadfast.CheckpointError, match="steps 498, 499, 500 that verify.*overwrite=True"):
        st.save({"s": 301}, tmp_path, step=301, keep_last=3)
    assert st.steps(tmp_path) == [498, 499, 500]
    with pytest.warns(UserWarning, match="removing .*step-00000500 once this save commits"):
        st.save({"s": 301}, tmp_path, step=301, keep_last=3, overwrite=True)
    assert st.steps(tmp_path) == [301] and st.load(tmp_path)["s"] == 301
    # Later ones that do not verify are removed without being asked, and said.
    st.save({"w": torch.ones(1000)}, tmp_path, step=400)
    flip_byte_in_w(tmp_path / "step-00000400")
    with st.AsyncCheckpointer(tmp_path, keep_last=3) as saver, \
            pytest.warns(UserWarning, match="removing .*step-00000400.*does not verify"):
        saver.save({"s": 302}, 302)
    assert st.steps(tmp_path) == [301, 302]


def test_a_mismatch_with_into_is_raised_not_passed_over_for_an_older_checkpoint(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(1, 3)).sum().backward()
    opt.step()
    st.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path, step=1)
    st.save({"model": model.state_dict()}, tmp_path, step=2)
    fresh = torch.nn.Linear(3, 2)
    before = fresh.weight.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(steadfast.CheckpointError, match="step-00000002: `into` has tensors the checkpoint does not hold"):
            st.load(tmp_path, into={"model": fresh.state_dict(), "optimizer": {"state": {0: {"momentum_buffer": torch.zeros(2, 3)}}}})
    assert torch.equal(fresh.weight, before)
    with pytest.raises(steadfast.CheckpointError, match="layout|model|torch"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            st.load(tmp_path, layout="torch")


def test_load_into_an_untied_module_from_a_tied_checkpoint_fills_both(tmp_path):
    def lm(tied):
        torch.manual_seed(1)
        m = torch.nn.ModuleDict({"emb": torch.nn.Embedding(5, 3), "head": torch.nn.Linear(3, 5, bias=False)})
        if tied:
            m["head"].weight = m["emb"].weight
        return m
    st.save({"model": lm(True).state_dict()}, tmp_path, step=0)
    untied = lm(False)
    with torch.no_grad():
        untied["head"].weight.zero_()
    st.load(tmp_path, into={"model": untied.state_dict()})
    assert torch.equal(untied["head"].weight, lm(True)["emb"].weight)
    assert untied["head"].weight.data_ptr() != untied["emb"].weight.data_ptr()


def test_steps_lists_committed_checkpoints_only(tmp_path):
    st.save({"w": torch.ones(1)}, tmp_path, step=1)
    (tmp_path / "step-00000003").mkdir()
    assert st.steps(tmp_path) == [1]


def test_a_second_saver_in_one_process_is_told_it_is_this_process(tmp_path):
    with st.AsyncCheckpointer(tmp_path):
        with pytest.raises(steadfast.CheckpointError, match="written by this process already"):
            st.save({"w": torch.ones(1)}, tmp_path, step=1)
