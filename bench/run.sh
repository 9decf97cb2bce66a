#!/usr/bin/env bash
# Runs Steadfast's benchmarks and rewrites their sections of docs/benchmarks.md.
# Benchmarks are not tests: they take minutes and need peers (PyTorch) that CI lacks.
#
#   bench/run.sh            # every benchmark
#   bench/run.sh train      # training steps/s against PyTorch
#   bench/run.sh ckpt       # checkpoint save/load/stall against dd, torch.save, safetensors
#   bench/run.sh train-sweep  # the same by shape: MLP widths, LeNet-5, GPT widths, depths, contexts, micro-batches
#   bench/run.sh overhead   # training throughput with a checkpoint every N steps
#   bench/run.sh sum        # reproducible sum against naive, pairwise, xsum, accurate
#   bench/run.sh allreduce  # all-reduce bus bandwidth against loopback TCP
#   bench/run.sh ddp        # data-parallel steps/s for 1, 2, 4 workers against PyTorch DDP (gloo)
#   bench/run.sh kernels    # the fixed-order matrix product against the framework's, per instruction set
#   bench/run.sh hash       # XXH3-64 per instruction set against the xxhash-rust crate, in cache and not
#   bench/run.sh engines    # all-reduce and data-parallel steps/s: Steadfast's mesh, MPI, gloo (1, 2, 4 ranks)
#   bench/run.sh engines-pairs  # elastic against static, one rank against train, Steadfast against MPI, as interleaved pairs
#   bench/run.sh engines-hosts  # the all-reduce across namespace hosts against Open MPI's TCP and the ring bound (root)
#   bench/run.sh repro-cost  # fast, reproducible and reproducible32 all-reduces and training steps on every transport (root for the shaped hosts)
#   bench/run.sh campaign   # 1000 bit-flip trials on the MLP against altering checkpoint files
#   bench/run.sh sdc-lab    # 1000 bit-flip trials of the study's MLP in PyTorch (steadfast.lab) beside steadfast campaign
#   bench/run.sh recovery   # state transfer from live replicas, a recovery timeline, the failure-free cost
#   bench/run.sh recovery-hosts  # the recovery timeline across namespace hosts over tc-shaped links (root)
#   bench/run.sh pipeline   # pipeline steps/s by stage count, boundary logging's cost, recovery times
#   bench/run.sh study [--quick]  # the checkpoint/restart study across systems (docs/checkpoint-study.md)
#   bench/run.sh python-ckpt  # a PyTorch loop's checkpoint stall against torch.save and DCP; load against torch.load; the first async save
#   bench/run.sh python-ddp   # the reproducible DDP hook and steadfast.elastic against DDP's default, and their bits on 1/2/4 processes
#   bench/run.sh torchft      # steadfast.elastic beside torchft under repeated kills: steps, skipped samples, recovery, bits
#   bench/run.sh torch-determinism  # PyTorch's deterministic mode on the CPU audited (a section of docs/fpna.md)
#   bench/run.sh sdc-study [--quick]  # checkpoint alteration in PyTorch DDP and Horovod jobs beside Steadfast's campaigns (docs/sdc-study.md)
#
# PyTorch from PyPI is the CUDA build (about 2.5 GB with its dependencies); it is
# installed on demand into bench/.venv (or the environment BENCH_VENV names, e.g. the
# tests' target/python-env). No benchmark here needs a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."

which=${1:-all}
venv=${BENCH_VENV:-bench/.venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, numpy, xxhash, matplotlib' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.15.0 numpy safetensors xxhash matplotlib
fi
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "Fashion-MNIST is missing: apt-get install dataset-fashion-mnist" >&2
  exit 1
fi
cargo build --release --locked

mkdir -p bench/out
case "$which" in
  train) "$venv/bin/python" bench/train_vs_pytorch.py ;;
  train-sweep) "$venv/bin/python" bench/train_sweep.py ;;
  ckpt) "$venv/bin/python" bench/ckpt_vs_peers.py ;;
  overhead) "$venv/bin/python" bench/ckpt_training_overhead.py ;;
  sum) "$venv/bin/python" bench/sum_vs_peers.py ;;
  allreduce) "$venv/bin/python" bench/allreduce.py ;;
  ddp) "$venv/bin/python" bench/ddp_vs_pytorch.py ;;
  engines) "$venv/bin/python" bench/engines.py ;;
  engines-pairs) python3 bench/engines_pairs.py ;;
  kernels) python3 bench/kernels.py ;;
  hash) cargo bench --locked -q -p steadfast-kernels --bench hash ;;
  campaign) "$venv/bin/python" bench/campaign_speed.py ;;
  recovery) "$venv/bin/python" bench/recovery.py ;;
  recovery-hosts) python3 bench/recovery_hosts.py ;;
  engines-hosts) python3 bench/engines_hosts.py ;;
  repro-cost) python3 bench/repro_cost.py ;;
  pipeline) python3 bench/pipeline.py ;;  # runs PyTorch from bench/.venv
  study) "$venv/bin/python" bench/study/study.py "${@:2}" ;;
  sdc-study) "$venv/bin/python" bench/sdc/study.py "${@:2}" ;;  # installs its pinned PyTorch and Horovod in bench/.venv-horovod
  torchft)
    # The Python package, as below; torchft in an environment of its own that shares the
    # bench's PyTorch (torchft's declared dependencies would pull another 5 GB build of it).
    "$venv/bin/pip" install -q "maturin>=1.7,<2"
    PATH="$PWD/$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps ./python
    tf=bench/.venv-torchft
    if [ ! -x "$tf/bin/torchft_lighthouse" ]; then
      python3 -m venv "$tf"
      shared=$("$venv/bin/python" -c 'import site; print(site.getsitepackages()[0])')
      echo "$shared" > "$("$tf/bin/python" -c 'import site; print(site.getsitepackages()[0])')/bench-venv.pth"
      "$tf/bin/pip" install -q --no-deps torchft==0.2.0
      "$tf/bin/pip" install -q "opentelemetry-exporter-otlp-proto-http>=1.39.0" "opentelemetry-sdk>=1.39.0"
    fi
    PATH="$PWD/$tf/bin:$PATH" "$tf/bin/python" bench/side_by_side_torchft.py ;;
  python-ckpt|python-ddp|torch-determinism|sdc-lab)
    # The Python package, built into this environment (maturin shares target/).
    "$venv/bin/pip" install -q "maturin>=1.7,<2"
    PATH="$PWD/$venv/bin:$PATH" "$venv/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps ./python
    case "$which" in
      sdc-lab) "$venv/bin/python" bench/sdc_lab_speed.py ;;
      *) "$venv/bin/python" "bench/${which//-/_}.py" ;;
    esac
    if [ "$which" = python-ckpt ]; then "$venv/bin/python" bench/python_ckpt_load.py; fi ;;
  all)
    "$venv/bin/python" bench/train_vs_pytorch.py
    "$venv/bin/python" bench/train_sweep.py
    "$venv/bin/python" bench/ckpt_vs_peers.py
    "$venv/bin/python" bench/ckpt_training_overhead.py
    "$venv/bin/python" bench/sum_vs_peers.py
    "$venv/bin/python" bench/allreduce.py
    "$venv/bin/python" bench/ddp_vs_pytorch.py
    "$venv/bin/python" bench/engines.py
    python3 bench/kernels.py
    cargo bench --locked -q -p steadfast-kernels --bench hash
    "$venv/bin/python" bench/campaign_speed.py
    "$venv/bin/python" bench/recovery.py
    python3 bench/pipeline.py
    python3 bench/recovery_hosts.py
    python3 bench/engines_hosts.py
    "$venv/bin/python" bench/study/study.py
    ;;
  *) echo "unknown benchmark: $which (expected: all, train, train-sweep, ckpt, overhead, sum, allreduce, ddp, engines, engines-pairs, engines-hosts, repro-cost, kernels, hash, campaign, sdc-lab, recovery, recovery-hosts, study, sdc-study, python-ckpt, python-ddp, torchft, torch-determinism)" >&2; exit 2 ;;
esac
