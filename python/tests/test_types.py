"""steadfast.torch gives back the types it was given: tied weights shared again, Parameters
and requires_grad, namedtuples, torch.Size, defaultdicts, dtypes and devices; what it
cannot give back is refused with an error that says what to do; map_location follows
torch.load's convention."""
import collections
import inspect
import json
import typing

import numpy as np
import pytest
import torch

import steadfast
import steadfast.torch as st
from bits import raw, same
from steadfast import _location, _tree

Point = collections.namedtuple("Point", "x y")


class Span(typing.NamedTuple):
    start: int
    stop: int = 0


def stored_names(step_dir):
    return [t["name"] for t in json.loads((step_dir / "manifest.json").read_text())["tensors"]]


def shard_bytes(step_dir):
    return sum(p.stat().st_size for p in step_dir.glob("*.safetensors"))


class TiedLM(torch.nn.Module):
    def __init__(self, vocab=1000, width=64):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, width)
        self.lm = torch.nn.Linear(width, vocab, bias=False)
        self.lm.weight = self.emb.weight


# 1. Tied weights.

def test_tied_weights_are_stored_once_and_come_back_sharing_their_memory(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    sd = model.state_dict()
    assert sd["lm.weight"] is not sd["emb.weight"] and sd["lm.weight"].data_ptr() == sd["emb.weight"].data_ptr()
    d = st.save({"model": sd}, tmp_path / "ckpt", step=0)
    assert stored_names(d) == ["model.emb.weight"]
    one = 1000 * 64 * 4
    assert one <= shard_bytes(d) < 1.5 * one
    back = st.load(tmp_path / "ckpt")["model"]
    emb, lm = back["emb.weight"], back["lm.weight"]
    assert emb is not lm and emb.data_ptr() == lm.data_ptr()
    assert raw(emb) == raw(sd["emb.weight"]) and raw(lm) == raw(sd["lm.weight"])
    emb[0, 0] = 12.5
    assert lm[0, 0].item() == 12.5
    # It drives a module with tied weights as the original did.
    again = TiedLM()
    again.load_state_dict(back)
    assert again.lm.weight is again.emb.weight and raw(again.lm.weight) == raw(emb)


def test_one_object_under_two_names_comes_back_as_one_object(tmp_path):
    p = torch.nn.Parameter(torch.randn(3, 2))
    arr = np.arange(6, dtype=np.int32)
    state = {"a": p, "b": p, "more": [p, {"c": p}], "arr": arr, "arr again": arr}
    d = st.save(state, tmp_path / "ckpt", step=0)
    assert stored_names(d) == ["a", "arr"]
    back = st.load(tmp_path / "ckpt")
    assert isinstance(back["a"], torch.nn.Parameter) and back["a"].requires_grad
    assert back["b"] is back["a"] and back["more"][0] is back["a"] and back["more"][1]["c"] is back["a"]
    assert back["arr again"] is back["arr"] and back["arr"].tobytes() == arr.tobytes()
    # The background checkpointer stores it once too.
    with st.AsyncCheckpointer(tmp_path / "async") as saver:
        saver.save(state, 1)
    assert stored_names(tmp_path / "async" / "step-00000001") == ["a", "arr"]


def test_views_of_overlapping_memory_are_refused_naming_both_and_disjoint_views_are_saved(tmp_path):
    base = torch.arange(16.0).reshape(4, 4)
    for state, a, b in (({"w": base, "wt": base.t()}, "w", "wt"),
                        ({"a": base[:, 0:2], "b": base[:, 1:3]}, "a", "b"),
                        ({"w": base, "row": base[1]}, "row", "w"),
                        ({"w": base, "bits": base.view(torch.int32)}, "bits", "w")):
        with pytest.raises(ValueError) as e:
            st.save(state, tmp_path / "ckpt", step=0)
        message = str(e.value)
        assert f"{a} and {b} are different views of overlapping memory" in message or \
            f"{b} and {a} are different views of overlapping memory" in message, message
        assert ".clone()" in message
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").glob("step-*"))
    # A copy of one of them is fine, and so are views of memory that does not overlap.
    rows = torch.arange(8.0).reshape(2, 4)
    d = st.save({"w": base, "wt": base.t().clone(), "r0": rows[0], "r1": rows[1]}, tmp_path / "ckpt", step=0)
    assert stored_names(d) == ["w", "wt", "r0", "r1"]
    back = st.load(d)
    assert torch.equal(back["wt"], base.t()) and torch.equal(back["r1"], rows[1])


# 2. Parameters and requires_grad.

def test_parameters_and_requires_grad_come_back(tmp_path):
    torch.manual_seed(1)
    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    state = {
        "params": dict(model.named_parameters()),
        "leaf": torch.randn(2).requires_grad_(),
        "plain": torch.randn(2),
        "computed": torch.randn(2, requires_grad=True) * 2,  # comes back a leaf, as torch.load gives it
    }
    st.save(state, tmp_path / "ckpt", step=0)
    back = st.load(tmp_path / "ckpt")
    assert type(back["params"]["weight"]) is torch.nn.Parameter and back["params"]["weight"].requires_grad
    assert type(back["params"]["bias"]) is torch.nn.Parameter and not back["params"]["bias"].requires_grad
    assert type(back["leaf"]) is torch.Tensor and back["leaf"].requires_grad and back["leaf"].is_leaf
    assert not back["plain"].requires_grad
    assert back["computed"].requires_grad and back["computed"].is_leaf
    state["computed"] = state["computed"].detach().requires_grad_()
    same(state, back)


# 3. namedtuple, torch.Size, defaultdict, dtype and device.

def test_namedtuples_sizes_defaultdicts_dtypes_and_devices_keep_their_types(tmp_path):
    Local = collections.namedtuple("Local", "a b")
    Elsewhere = collections.namedtuple("Elsewhere", ["p", "q"], module="a_module_nobody_imported")
    Impostor = collections.namedtuple("Point", "x z")      # the name of this module's Point, other fields
    Impostor.__module__ = __name__
    state = {
        "point": Point(torch.ones(2), 3),
        "span": Span(1, 5),
        "locals": [Local(1, 2), Local(3, 4)],
        "elsewhere": Elsewhere("p", None),
        "impostor": Impostor(1, 2),
        "shape": torch.Size([8, 2]),
        "shapes": {"w": torch.zeros(4, 3).shape},
        "counts": collections.defaultdict(int, {"a": 2}),
        "groups": collections.defaultdict(list, {"x": [1, 2]}),
        "nested": collections.defaultdict(collections.OrderedDict),
        "no factory": collections.defaultdict(None, {1: "one"}),
        "dtypes": [torch.bfloat16, torch.int64, torch.bool],
        "devices": [torch.device("cpu"), torch.device("cuda", 1), torch.device("meta")],
    }
    st.save(state, tmp_path / "ckpt", step=0)
    back = st.load(tmp_path / "ckpt")
    same(state["point"], back["point"])
    assert type(back["point"]) is Point and type(back["span"]) is Span and back["span"] == Span(1, 5)
    # Not to be found without importing: a namedtuple of the same name and fields, one class.
    first, second = back["locals"]
    assert type(first) is not tuple and type(first).__name__ == "Local" and type(first)._fields == ("a", "b")
    assert type(second) is type(first) and (first.a, first.b, second.b) == (1, 2, 4)
    assert type(back["elsewhere"]).__name__ == "Elsewhere" and back["elsewhere"].q is None
    assert type(back["impostor"]) is not Point and type(back["impostor"])._fields == ("x", "z")
    assert type(back["shape"]) is torch.Size and back["shape"] == torch.Size([8, 2])
    assert type(back["shapes"]["w"]) is torch.Size
    for k in ("counts", "groups", "nested", "no factory"):
        same(state[k], back[k], k)
    back["counts"]["new"] += 1
    back["groups"]["new"].append(1)
    assert back["counts"]["new"] == 1 and back["groups"]["new"] == [1]
    assert type(back["nested"]["new"]) is collections.OrderedDict
    assert back["dtypes"] == state["dtypes"] and all(isinstance(d, torch.dtype) for d in back["dtypes"])
    assert back["devices"] == state["devices"] and all(type(d) is torch.device for d in back["devices"])


class Config(dict):
    pass


class History(list):
    pass


class Pair(tuple):
    pass


def test_containers_that_would_not_come_back_as_they_were_are_refused(tmp_path):
    cases = [
        ({"opt": {"cfg": Config(lr=1)}}, "opt.cfg", "Config", "dict"),
        ({"log": History([1])}, "log", "History", "list"),
        ({"pairs": [Pair((1, 2))]}, "pairs.0", "Pair", "tuple"),
        ({"max": torch.max(torch.ones(2, 2), 0)}, "max", "torch.return_types.max", "tuple"),
    ]
    for state, path, cls, base in cases:
        with pytest.raises(TypeError) as e:
            st.save(state, tmp_path / "ckpt", step=0)
        message = str(e.value)
        assert message.startswith(f"{path}: ") and cls in message and f"plain {base}" in message, message
    with pytest.raises(TypeError, match=r"^counts: .*default_factory .*lambda"):
        st.save({"counts": collections.defaultdict(lambda: 0)}, tmp_path / "ckpt", step=0)
    with pytest.raises(TypeError, match="default_factory"):
        st.save({"x": collections.defaultdict(Config)}, tmp_path / "ckpt", step=0)
    assert not (tmp_path / "ckpt").exists() or not list((tmp_path / "ckpt").glob("step-*"))


def test_trees_written_before_keep_loading_and_arrays_share_their_tensors_memory():
    tree = json.dumps({"dict": [[{"str": "w"}, {"tensor": "w"}], [{"str": "a"}, {"ndarray": "a"}],
                                [{"str": "u"}, {"ndarray": "u"}], [{"str": "t"}, {"tuple": [{"int": "1"}]}]]})
    tensors = {"w": torch.arange(4.0), "a": torch.arange(6, dtype=torch.int32).reshape(2, 3),
               "u": torch.tensor([1, 2**16 - 1], dtype=torch.int32).to(torch.uint16)}
    state = _tree.decode(tree, tensors)
    assert state["w"] is tensors["w"] and not state["w"].requires_grad and state["t"] == (1,)
    assert state["a"].dtype == np.int32 and state["a"].tolist() == [[0, 1, 2], [3, 4, 5]]
    state["a"][1, 2] = 50
    assert tensors["a"][1, 2].item() == 50
    assert state["u"].dtype == np.uint16 and state["u"].tolist() == [1, 2**16 - 1]


def test_unsigned_arrays_round_trip(tmp_path):
    state = {k: np.array([0, 1, np.iinfo(t).max], dtype=t) for k, t in (("u16", np.uint16), ("u32", np.uint32),
                                                                        ("u64", np.uint64))}
    st.save(state, tmp_path / "ckpt", step=0)
    back = st.load(tmp_path / "ckpt")
    for k, a in state.items():
        assert back[k].dtype == a.dtype and back[k].tobytes() == a.tobytes(), k


# 4. Errors that name their cause.

def test_a_name_clash_names_its_cause_and_both_paths(tmp_path):
    with pytest.raises(ValueError) as e:
        st.save({0: torch.zeros(1), "0": torch.ones(1)}, tmp_path / "ckpt", step=0)
    message = str(e.value)
    assert "state[0] and state['0'] would both be named '0'" in message, message
    assert "0 (int) and '0' (str)" in message and "dot" not in message, message
    with pytest.raises(ValueError) as e:
        st.save({"a.b": torch.zeros(1), "a": {"b": torch.ones(1)}}, tmp_path / "ckpt", step=0)
    message = str(e.value)
    assert "state['a.b'] and state['a']['b'] would both be named 'a.b'" in message, message
    assert "the key 'a.b' holds a dot" in message, message


def test_a_dtensor_is_refused_saying_to_gather_it_or_save_its_local_part(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/rdv", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        sharded = distribute_tensor(torch.arange(16.0).reshape(8, 2), mesh, [Shard(0)])
        with pytest.raises(TypeError) as e:
            st.save({"model": {"w": sharded}}, tmp_path / "ckpt", step=0)
        message = str(e.value)
        assert message.startswith("model.w: a DTensor") and ".full_tensor()" in message and ".to_local()" in message
        assert "0 bytes" not in message
        # What it says to save saves.
        st.save({"model": {"w": sharded.full_tensor()}}, tmp_path / "ckpt", step=0)
        assert torch.equal(st.load(tmp_path / "ckpt")["model"]["w"], torch.arange(16.0).reshape(8, 2))
    finally:
        dist.destroy_process_group()


class Hollow(torch.Tensor):
    """A tensor with a shape and elements but no memory (as wrapper subclasses are)."""

    @staticmethod
    def __new__(cls, shape):
        return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=torch.float32)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"Hollow has no {func}")


def test_tensors_without_values_are_refused_with_what_to_do(tmp_path):
    with pytest.raises(ValueError, match=r"^w: a tensor on the meta device .* materialize it"):
        st.save({"w": torch.empty(3, 2, device="meta")}, tmp_path / "ckpt", step=0)
    with pytest.raises(ValueError, match=r"^h: a Hollow of shape \[3\] has no memory of its own"):
        st.save({"h": Hollow((3,))}, tmp_path / "ckpt", step=0)
    with pytest.raises(ValueError, match=r"^lazy.weight: an uninitialized \(lazy\) parameter"):
        st.save({"lazy": torch.nn.LazyLinear(2).state_dict()}, tmp_path / "ckpt", step=0)


def test_step_must_be_a_non_negative_int(tmp_path):
    root = tmp_path / "ckpt"
    x = {"x": torch.zeros(1)}
    for bad, error, says in ((-1, ValueError, "from 0 to 2\\*\\*63 - 1"), (2**63, ValueError, "from 0 to"),
                             (1.5, TypeError, "give the step as an int"), (True, TypeError, "as an int"),
                             (np.bool_(True), TypeError, "as an int"), ("3", TypeError, "as an int")):
        with pytest.raises(error, match=says):
            st.save(x, root, step=bad)
        with st.AsyncCheckpointer(root) as saver, pytest.raises(error, match=says):
            saver.save(x, bad)
    assert st.steps(root) == []
    assert st.save(x, root, step=np.int64(7)).name == "step-00000007"
    with st.AsyncCheckpointer(root) as saver:
        assert saver.save(x, torch.tensor(9)) is None
    assert st.steps(root) == [7, 9]


def test_keep_last_must_keep_at_least_one(tmp_path):
    root = tmp_path / "ckpt"
    x = {"x": torch.zeros(1)}
    for bad, error in ((0, ValueError), (-2, ValueError), (True, TypeError), (1.0, TypeError)):
        with pytest.raises(error, match="keep_last"):
            st.save(x, root, step=0, keep_last=bad)
        with pytest.raises(error, match="keep_last"):
            st.AsyncCheckpointer(root, keep_last=bad)
    with pytest.raises(ValueError, match="keep_last must be at least 1"):
        st.save(x, root, step=0, keep_last=0)
    assert st.steps(root) == []
    for step in range(3):
        st.save(x, root, step=step, keep_last=None)
    assert st.steps(root) == [0, 1, 2]


def test_a_closed_checkpointer_says_so(tmp_path):
    saver = st.AsyncCheckpointer(tmp_path / "ckpt")
    saver.save({"x": torch.zeros(1)}, 1)
    saver.close()
    saver.close()
    for call in (lambda: saver.save({"x": torch.zeros(1)}, 2), saver.wait, saver.busy):
        with pytest.raises(steadfast.CheckpointError, match="is closed"):
            call()
    assert st.steps(tmp_path / "ckpt") == [1]


def test_urls_are_refused_and_home_is_expanded(tmp_path, monkeypatch):
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    x = {"x": torch.ones(2)}
    url = "s3://bucket/ckpt"
    for call in (lambda: st.save(x, url, step=0), lambda: st.load(url), lambda: st.verify(url),
                 lambda: st.steps(url), lambda: st.AsyncCheckpointer(url)):
        with pytest.raises(ValueError, match="is a URL: .*mount the bucket.*or save to a local directory"):
            call()
    assert list(work.iterdir()) == []
    assert st.save(x, "~/ckpt", step=3) == home / "ckpt" / "step-00000003"
    with st.AsyncCheckpointer("~/ckpt") as saver:
        assert saver.root == home / "ckpt"
        saver.save(x, 4)
    assert st.steps("~/ckpt") == [3, 4] and st.verify("~/ckpt") == []
    assert torch.equal(st.load("~/ckpt")["x"], x["x"])
    assert list(work.iterdir()) == []


# 5. map_location as torch.load takes it.

def test_map_location_moves_as_torch_load_does(tmp_path):
    torch.manual_seed(2)
    sd = TiedLM(vocab=8, width=4).state_dict()
    st.save({"model": sd, "other": torch.arange(3)}, tmp_path / "ckpt", step=0)
    for where in ("cpu", torch.device("cpu"), None, {"cuda:0": "cpu"}):
        back = st.load(tmp_path / "ckpt", map_location=where)
        assert back["model"]["emb.weight"].device.type == "cpu"
        assert raw(back["model"]["lm.weight"]) == raw(sd["lm.weight"])
    back = st.load(tmp_path / "ckpt", map_location="meta")
    assert back["model"]["emb.weight"].is_meta and back["other"].is_meta
    # The callable gets each stored tensor's storage once, with the location it was saved from.
    calls = []

    def fn(storage, location):
        calls.append((type(storage), storage.nbytes(), location))
        return storage

    back = st.load(tmp_path / "ckpt", map_location=fn)
    assert calls == [(torch.UntypedStorage, 8 * 4 * 4, "cpu"), (torch.UntypedStorage, 3 * 8, "cpu")]
    assert back["model"]["lm.weight"].data_ptr() == back["model"]["emb.weight"].data_ptr()
    assert raw(back["model"]["emb.weight"]) == raw(sd["emb.weight"]) and back["other"].tolist() == [0, 1, 2]
    # A storage elsewhere: the tensor is rebuilt over it with its dtype, shape and strides.
    back = st.load(tmp_path / "ckpt", map_location=lambda s, loc: s.clone())
    assert back["other"].dtype == torch.int64 and back["other"].tolist() == [0, 1, 2]
    for bad in (3, ["cpu"], b"cpu"):
        with pytest.raises(TypeError, match="map_location"):
            st.load(tmp_path / "ckpt", map_location=bad)
    with pytest.raises(TypeError, match="must return a storage or a tensor"):
        st.load(tmp_path / "ckpt", map_location=lambda s, loc: "cpu")


def test_a_saved_location_is_mapped_by_a_dict_and_handed_to_a_callable():
    tree = json.dumps({"dict": [
        [{"str": "gpu"}, {"tensor": "gpu", "location": "cuda:0", "parameter": True, "requires_grad": True}],
        [{"str": "tied"}, {"tensor": "tied", "shares": "gpu"}],
        [{"str": "host"}, {"tensor": "host"}],
    ]})

    def tensors():
        return {"gpu": torch.arange(4.0), "host": torch.arange(2.0)}

    state = _tree.decode(tree, tensors(), _location.mover({"cuda:0": "meta"}))
    assert state["gpu"].is_meta and state["tied"].is_meta and state["host"].device.type == "cpu"
    assert type(state["gpu"]) is torch.nn.Parameter and state["gpu"].requires_grad
    assert type(state["tied"]) is torch.Tensor and not state["tied"].requires_grad
    state = _tree.decode(tree, tensors(), _location.mover({"cuda:1": "meta"}))
    assert state["gpu"].device.type == "cpu" and state["gpu"].data_ptr() == state["tied"].data_ptr()
    seen = []
    state = _tree.decode(tree, tensors(), _location.mover(lambda s, loc: seen.append(loc)))
    assert seen == ["cuda:0", "cpu"] and state["gpu"].tolist() == [0.0, 1.0, 2.0, 3.0]
    place = _location.mover(torch.device("meta"))
    assert place(torch.zeros(2), "cuda:0").is_meta
    with pytest.raises(TypeError, match="give None, a device"):
        _location.mover(object())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_tensor_saved_from_a_gpu_records_its_device(tmp_path):
    state = {"w": torch.arange(4.0, device="cuda:0"), "h": torch.arange(2.0)}
    tree, _ = _tree.encode(state, share=True)
    assert {"tensor": "w", "location": "cuda:0"} in json.loads(tree)["dict"][0]
    st.save(state, tmp_path / "ckpt", step=0)
    assert st.load(tmp_path / "ckpt")["w"].device.type == "cpu"
    assert st.load(tmp_path / "ckpt", map_location={"cuda:0": "cpu"})["w"].device.type == "cpu"
    back = st.load(tmp_path / "ckpt", map_location="cuda:0")
    assert back["w"].device == torch.device("cuda:0") and back["h"].device == torch.device("cuda:0")


# 6. AsyncCheckpointer.save says what it does.

def test_the_asynchronous_save_returns_nothing_and_says_so():
    signature = inspect.signature(st.AsyncCheckpointer.save)
    assert signature.return_annotation in (None, "None")
    doc = inspect.getdoc(st.AsyncCheckpointer.save)
    assert doc and "waits for the save in flight" in doc and "raises that save's error" in doc


def test_numpy_scalars_plain_subclasses_and_bytearrays_keep_their_types_or_are_refused(tmp_path):
    import enum
    state = {"f64": np.float64(1.5), "b": np.bool_(True), "i": np.int32(-3), "ba": bytearray(b"\x00\xff")}
    back = st.load(st.save(state, tmp_path, step=0))
    assert {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in state.items()}
    assert back["f64"] == 1.5 and back["ba"] == bytearray(b"\x00\xff")

    class Color(enum.IntEnum):
        RED = 1

    class Name(str):
        pass

    for value, plain in ((Color.RED, "int"), (Name("x"), "str")):
        with pytest.raises(TypeError, match=f"a subclass of {plain}.*convert it"):
            st.save({"v": value}, tmp_path, step=1)
    with pytest.raises(TypeError, match="NumPy str_"):
        st.save({"v": np.str_("x")}, tmp_path, step=1)


def test_a_state_nested_too_deeply_or_containing_itself_is_refused_with_what_to_do(tmp_path):
    deep = {}
    node = deep
    for _ in range(60):
        node["d"] = {}
        node = node["d"]
    with pytest.raises(ValueError, match="nests too deeply.*flatten"):
        st.save(deep, tmp_path, step=0)
    loop = {"a": 1}
    loop["self"] = loop
    with pytest.raises(ValueError, match="nests too deeply to save \\(or contains itself\\)"):
        st.save(loop, tmp_path, step=0)
    assert st.steps(tmp_path) == []


def test_a_sampler_takes_any_integer_and_refuses_a_negative_seed():
    assert len(st.ResumableSampler(np.int64(10), seed=np.uint32(3))) == 10
    with pytest.raises(ValueError, match="seed -1"):
        st.ResumableSampler(10, seed=-1)
