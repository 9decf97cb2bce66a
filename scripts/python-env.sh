#!/usr/bin/env bash
# The Python tests' virtual environment, target/python-env, with the packages they use from
# PyPI (PyTorch on the CPU, NumPy, pytest, safetensors, and maturin to build the package).
# scripts/python-tests.sh runs it; scripts/test.sh starts it beside the Rust build, since the
# download waits on the network while the build waits on the cores. Running it again installs
# nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/python-env
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "torch==2.15.0" "numpy>=1.21" "pytest>=7" safetensors "maturin>=1.7,<2"
