#!/usr/bin/env bash
# Installs what Steadfast needs on a fresh Debian machine, skipping what is present (with sudo
# when not root). Without arguments: what building and the main job need (the data sets,
# libhdf5 for `.h5` files, pkg-config, Open MPI and libclang for the MPI engine's bindings,
# protoc for the etcd client's).
# With `tests`: also the peers the tests compare with (Python's safetensors, NumPy and h5py),
# a headless Chromium for the report, iproute2 for the multi-host test, and Slurm with munge
# for the one-host Slurm cluster that a test starts, etcd for the jobs that meet in it, and
# qemu-user, whose emulated older CPUs run training under other instruction sets.
set -euo pipefail

need=()
[ -d /usr/share/datasets/fashion-mnist ] || need+=(dataset-fashion-mnist)
[ -d /usr/share/games/fortunes ] || need+=(fortunes)
dpkg -s libhdf5-dev >/dev/null 2>&1 || need+=(libhdf5-dev)
command -v pkg-config >/dev/null || need+=(pkg-config)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null || need+=(openmpi-bin)
dpkg -s libclang-dev >/dev/null 2>&1 || need+=(libclang-dev)
command -v protoc >/dev/null || need+=(protobuf-compiler)
if [ "${1:-}" = tests ]; then
  command -v chromium >/dev/null || need+=(chromium)
  command -v ip >/dev/null || need+=(iproute2)
  command -v slurmctld >/dev/null || need+=(slurm-wlm)
  command -v munged >/dev/null || need+=(munge)
  command -v etcd >/dev/null || need+=(etcd-server)
  command -v qemu-x86_64 >/dev/null || need+=(qemu-user)
fi
if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${need[@]}"
fi
if [ "${1:-}" = tests ]; then
  python3 -c 'import safetensors.numpy, numpy, h5py' 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore safetensors numpy h5py
fi
