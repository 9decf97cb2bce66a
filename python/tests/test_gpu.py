"""steadfast.torch with tensors on a GPU: saved from where they lie (the snapshot copies
them to the host), their device recorded, and put back where map_location says, shared
weights still shared; a load into a GPU module's own parameters. Skipped without CUDA."""
import pytest
import torch

import steadfast
import steadfast.torch as st

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def gpu_model():
    torch.manual_seed(0)
    emb = torch.nn.Embedding(16, 8)
    head = torch.nn.Linear(8, 16, bias=False)
    head.weight = emb.weight                       # tied
    model = torch.nn.ModuleDict({"emb": emb, "head": head, "norm": torch.nn.LayerNorm(8)}).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model["head"](model["norm"](model["emb"](torch.arange(16, device="cuda")))).square().mean().backward()
    opt.step()
    return model, opt


def host(state):
    return {k: v.cpu() for k, v in state.items()}


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_gpu_state_saves_and_comes_back_where_map_location_says(tmp_path, asynchronous):
    model, opt = gpu_model()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    if asynchronous:
        with st.AsyncCheckpointer(tmp_path) as saver:
            saver.prepare(state)
            saver.save(state, 1)
    else:
        st.save(state, tmp_path, step=1)
    on_host = st.load(tmp_path)
    assert on_host["model"]["emb.weight"].device.type == "cpu"
    for k, v in model.state_dict().items():
        assert torch.equal(on_host["model"][k], v.cpu()), k
    for map_location in ("cuda:0", torch.device("cuda", 0), {"cuda:0": "cuda:0"},
                         lambda storage, location: storage.cuda() if location.startswith("cuda") else storage):
        back = st.load(tmp_path, map_location=map_location)
        w = back["model"]
        assert w["emb.weight"].is_cuda, map_location
        assert w["emb.weight"].data_ptr() == w["head.weight"].data_ptr(), "the tied weight is shared on the GPU too"
        assert torch.equal(host(w)["norm.weight"], model.state_dict()["norm.weight"].cpu())
        assert back["optimizer"]["state"][0]["exp_avg"].is_cuda
    # A location the dict does not name stays on the CPU.
    assert not st.load(tmp_path, map_location={"cuda:1": "cuda:0"})["model"]["emb.weight"].is_cuda


def test_a_load_into_a_gpu_modules_parameters_fills_them(tmp_path):
    model, _ = gpu_model()
    st.save({"model": model.state_dict()}, tmp_path, step=1)
    fresh, _ = gpu_model()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    weight = fresh["norm"].weight
    state = st.load(tmp_path, into={"model": fresh.state_dict()})
    assert fresh["norm"].weight is weight and weight.is_cuda
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), k
    assert state["model"]["norm.weight"].is_cuda


def test_a_bit_flip_in_a_gpu_module_is_found_where_it_lies_and_undone():
    model, _ = gpu_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    log = steadfast.inject(model, target="norm.weight", bits="exponent", count=1, seed=5)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed == ["norm.weight"]
    steadfast.undo(model, log)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
