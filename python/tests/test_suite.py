"""The suite as a user runs it: `pip install "./python[test]"` brings every package the
tests import, and a test whose binary or data set is missing is skipped with how to get
it, or fails where the environment says it is required."""
import ast
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).resolve().parent
PYTHON = HERE.parent
ROOT = PYTHON.parent
# Modules of this repository that the tests import: the package, the examples beside each
# other, the benchmark drivers under bench/.
LOCAL = {"steadfast", "exact_restart", "reproducible_ddp", "study", "verdict", "worker", "common", "torch_train",
         "torch_determinism", "conftest"} | {p.stem for p in HERE.glob("*.py")}
# The import name of each distribution the tests may name.
DISTRIBUTION = {"torch": "torch", "numpy": "numpy", "pytest": "pytest", "safetensors": "safetensors",
                "h5py": "h5py", "yaml": "pyyaml"}


def imported(path, module_level_only=False):
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module.split(".")[0]


def test_the_test_extra_holds_every_package_the_tests_import():
    tomllib = pytest.importorskip("tomllib")   # Python 3.11 on
    project = tomllib.loads((PYTHON / "pyproject.toml").read_text())["project"]
    declared = {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
                for r in project["dependencies"] + project["optional-dependencies"]["test"]}
    names = set()
    for path in [*HERE.glob("*.py"), *(PYTHON / "examples").glob("*.py")]:
        names.update(imported(path))
    # The benchmark drivers the tests load: what they import when loaded (their plotting and
    # Horovod imports sit inside the functions the tests do not call).
    for path in [ROOT / "bench" / "sdc" / "study.py", ROOT / "bench" / "sdc" / "verdict.py",
                 ROOT / "bench" / "torch_determinism.py", ROOT / "bench" / "common.py", ROOT / "bench" / "torch_train.py"]:
        if path.exists():
            names.update(imported(path, module_level_only=True))
    third_party = {n for n in names if n not in sys.stdlib_module_names and n not in LOCAL and n != "__future__"}
    unknown = third_party - DISTRIBUTION.keys()
    assert not unknown, f"name the distribution of {sorted(unknown)} in DISTRIBUTION"
    missing = {DISTRIBUTION[n] for n in third_party} - declared
    assert not missing, f"the tests import {sorted(missing)}, which python/pyproject.toml's test extra lacks"


NEEDS = """
def test_needs_the_binary(cli):
    pass


def test_needs_fashion_mnist(fashion_mnist):
    pass
"""


def run_needing(tmp_path, **env):
    # The suite's conftest in a tree of its own, without a built binary beside it.
    tests = tmp_path / "checkout" / "python" / "tests"
    tests.mkdir(parents=True)
    shutil.copy(HERE / "conftest.py", tests)
    (tests / "test_needs.py").write_text(NEEDS)
    base = {k: v for k, v in os.environ.items() if not k.startswith("STEADFAST_")}
    base.update(PATH=str(tmp_path), STEADFAST_FASHION_MNIST=str(tmp_path / "no-data"), **env)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tests)],
                          capture_output=True, text=True, env=base, cwd=tmp_path, timeout=120)


def test_a_missing_binary_or_data_set_is_skipped_with_how_to_get_it(tmp_path):
    r = run_needing(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 skipped" in r.stdout, r.stdout
    assert "cargo build --release" in r.stdout and "STEADFAST_BIN" in r.stdout
    assert "scripts/install-deps.sh tests" in r.stdout


def test_a_required_binary_or_data_set_that_is_missing_fails(tmp_path):
    r = run_needing(tmp_path, STEADFAST_REQUIRE_BINARY="1", STEADFAST_REQUIRE_DATA="1")
    assert r.returncode == 1 and "2 errors" in r.stdout, r.stdout + r.stderr
    assert "STEADFAST_REQUIRE_BINARY=1 requires it" in r.stdout
    assert "STEADFAST_REQUIRE_DATA=1 requires it" in r.stdout
    # A STEADFAST_BIN that names nothing runnable is a mistake, never a skip.
    r = run_needing(tmp_path / "again", STEADFAST_BIN=str(tmp_path / "nothing"))
    assert "is not an executable file" in r.stdout and "1 error" in r.stdout, r.stdout
