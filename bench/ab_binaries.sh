#!/usr/bin/env bash
# Side-by-side speed of two `steadfast` binaries (say, before and after a change) on this
# machine, runs alternating so that both see the same noise: training steps/s (median of 3)
# for the MLP with one and four micro-batches, LeNet-5 and the GPT; a data-parallel job of
# 2 workers; an elastic job of 3 that loses a worker and replaces it (its wall time); and the
# all-reduce's bus bandwidth for 2 ranks. Prints a Markdown table.
#
#   bench/ab_binaries.sh OLD_BINARY NEW_BINARY
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 OLD_BINARY NEW_BINARY" >&2; exit 2; }
old=$1 new=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

steps_per_s() { # binary steps args...
  local bin=$1 steps=$2; shift 2
  rm -rf "$out/run"
  "$bin" train --steps "$steps" --eval-every 0 --out "$out/run" "$@" >/dev/null 2>&1
  python3 -c "import json,sys; s=[json.loads(l) for l in open(sys.argv[1]) if '\"summary\"' in l][0]; print(f'{int(sys.argv[2]) / s[\"train_seconds\"]:.1f}')" \
    "$out/run/metrics.jsonl" "$steps"
}
median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }

echo "| run | old | new | new / old |"
echo "|---|---|---|---|"
while IFS='|' read -r name steps args; do
  a=() b=()
  for _ in 1 2 3; do
    # shellcheck disable=SC2086
    a+=("$(RAYON_NUM_THREADS=1 steps_per_s "$old" "$steps" $args)")
    # shellcheck disable=SC2086
    b+=("$(RAYON_NUM_THREADS=1 steps_per_s "$new" "$steps" $args)")
  done
  ma=$(median "${a[@]}") mb=$(median "${b[@]}")
  echo "| $name, steps/s (1 thread) | $ma | $mb | $(python3 -c "print(f'{$mb / $ma:.3f}')") |"
done <<'RUNS'
mlp, batch 128 as 1 micro-batch|1000|--model mlp
mlp, batch 128 as 4 micro-batches, reproducible|300|--model mlp --micro-batch 32 --reduce reproducible
cnn, batch 128 as 4 micro-batches|100|--model cnn --micro-batch 32
gpt, batch 32|20|--model gpt
RUNS
ddp_steps_per_s() { # binary
  rm -rf "$out/ddp"
  RAYON_NUM_THREADS=1 "$1" launch --nproc 2 -- train --model mlp --steps 300 --micro-batch 32 --reduce reproducible \
    --eval-every 0 --out "$out/ddp" >/dev/null 2>&1
  python3 -c "import json,sys; s=[json.loads(l) for l in open(sys.argv[1]) if '\"summary\"' in l][0]; print(f'{300 / s[\"train_seconds\"]:.1f}')" \
    "$out/ddp/metrics.jsonl"
}
recovery_seconds() { # binary
  rm -rf "$out/rec"
  local t0 t1
  t0=$(date +%s.%N)
  RAYON_NUM_THREADS=1 "$1" launch --nproc 3 --heartbeat-timeout 1 --max-restarts 1 -- train --model mlp --data synthetic \
    --batch 48 --micro-batch 16 --steps 300 --reduce reproducible --eval-every 0 --out "$out/rec" \
    --fault 'crash:rank=1,step=150,phase=update' >/dev/null 2>&1
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.2f}')"
}
a=() b=()
for _ in 1 2 3; do a+=("$(ddp_steps_per_s "$old")"); b+=("$(ddp_steps_per_s "$new")"); done
ma=$(median "${a[@]}") mb=$(median "${b[@]}")
echo "| mlp, 2 workers (launch --nproc 2), batch 128 as 4 micro-batches, steps/s | $ma | $mb | $(python3 -c "print(f'{$mb / $ma:.3f}')") |"
a=() b=()
for _ in 1 2 3; do a+=("$(recovery_seconds "$old")"); b+=("$(recovery_seconds "$new")"); done
ma=$(median "${a[@]}") mb=$(median "${b[@]}")
echo "| elastic job of 3, a worker crashed and replaced, 300 steps, wall s (lower is better) | $ma | $mb | $(python3 -c "print(f'{$mb / $ma:.3f}')") |"
for mb in 16 64; do
  a=() b=()
  for _ in 1 2 3; do
    for side in old new; do
      bin=$old; [ $side = new ] && bin=$new
      v=$("$bin" bench allreduce --world 2 --mb "$mb" --repeats 5 | python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); print(f'{r[\"fast_bus_mb_per_s\"]:.0f} {r[\"reproducible_bus_mb_per_s\"]:.0f}')")
      if [ $side = old ]; then a+=("$v"); else b+=("$v"); fi
    done
  done
  for k in 1 2; do
    col() { for x in "$@"; do echo "$x" | cut -d' ' -f"$k"; done; }
    # shellcheck disable=SC2046
    ma=$(median $(col "${a[@]}")) mb2=$(median $(col "${b[@]}"))
    mode=fast; [ $k = 2 ] && mode=reproducible
    echo "| all-reduce $mode, $mb MB, 2 ranks, bus MB/s | $ma | $mb2 | $(python3 -c "print(f'{$mb2 / $ma:.3f}')") |"
  done
done
