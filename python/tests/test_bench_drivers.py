"""The study drivers' own logic, so that it cannot rot between runs: the determinism
audit reads the installed PyTorch's documentation into the right categories and turns
measurements into verdicts (bench/torch_determinism.py)."""
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def audit():
    sys.path.insert(0, str(BENCH))
    try:
        import torch_determinism
    finally:
        sys.path.remove(str(BENCH))
    return torch_determinism


def test_the_documentation_is_read_into_its_categories(audit):
    assert audit.documented("index_put_ accumulate=True") == "CPU: nondeterministic, deterministic with the mode"
    assert audit.documented("index_copy_") == "CPU: nondeterministic, deterministic with the mode"
    assert audit.documented("MaxUnpool2d") == "raises with the mode (any device)"
    assert audit.documented("put_ accumulate=False") == "raises with the mode (any device)"
    assert audit.documented("index_add_") == "named for CUDA"
    assert audit.documented("sum") == "not named"


def test_measurements_become_verdicts(audit):
    fixed, varies = {"distinct": 1}, {"distinct": 7}
    cpu = "CPU: nondeterministic, deterministic with the mode"
    assert audit.verdict(cpu, varies, fixed) == "holds: varies without, fixed with"
    assert audit.verdict(cpu, fixed, fixed) == "not observed: fixed without the mode too"
    assert audit.verdict(cpu, varies, varies) == "wrong: still varies with the mode"
    assert audit.verdict("raises with the mode (any device)", varies, "an error") == "holds: raises"
    assert audit.verdict("raises with the mode (any device)", fixed, fixed) == "wrong: does not raise"
    assert audit.verdict("named for CUDA", varies, fixed) == "undocumented: varies on CPU; fixed with the mode"
    assert audit.verdict("not named", fixed, "an error") == "undocumented: raises with the mode"


def test_every_operation_runs_and_the_measurement_counts_distinct_outputs(audit, monkeypatch):
    monkeypatch.setattr(audit, "RUNS", 2)
    small = audit.inputs()
    for name, _, fn in audit.cases(small):
        report, first = audit.measure(fn)
        assert isinstance(report, str) or (report["runs"] == 2 and report["distinct"] >= 1), name
