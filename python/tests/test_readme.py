"""Every Python example of python/README.md runs as written."""
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_examples():
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_example_runs(index):
    exec(compile(BLOCKS[index], f"README.md example {index + 1}", "exec"), {})
