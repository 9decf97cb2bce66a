#!/usr/bin/env bash
# Chaos from outside: elastic training jobs hit at random moments, every result checked.
#
#   scripts/chaos.sh [TRIALS] [SEED]       # default 14 trials, seed 1
#   BIN=path/to/steadfast STEPS=300 scripts/chaos.sh 200 7 | tee chaos.txt
#
# Each trial draws a kind and a moment from the seed, runs a job, hits it, and checks:
#   kill1          SIGKILL one worker of `launch --max-restarts 2`: the job ends with the
#                  single-process fingerprint on every worker.
#   kill2          SIGKILL two workers, one after the other: the same.
#   stop-worker    SIGSTOP one worker and leave it stopped: it is declared lost, killed
#                  and replaced; the same fingerprints.
#   stop-cont      SIGSTOP one worker for 0.5 to 4 s, then SIGCONT: the same fingerprints.
#   launcher-cont  SIGSTOP the launcher for 1 to 5 s, then SIGCONT: the same fingerprints,
#                  and no worker replaced (a paused monitor kills nobody).
#   launcher-kill  SIGSTOP the launcher and never continue it; SIGKILL it 2 s later: every
#                  worker exits within 15 s (none is left orphaned).
#   cut-link       a job across three hosts (network namespaces; a standalone elastic
#                  coordinator on host 0, one worker per host), host 2's link cut: the two
#                  survivors end with the single-process fingerprint.
#   full-disk      `train` checkpointing every 5 steps onto a small tmpfs that fills: the
#                  run ends (or fails with a clear error, never a panic), every committed
#                  checkpoint verifies, and after the disk is enlarged `--resume latest`
#                  ends with the uninterrupted run's fingerprint.
#   two-jobs       a second elastic job started on the checkpoint directory of a running
#                  one (the same command, or another seed): it is refused within 30 s,
#                  saying why; the first ends with the single-process fingerprint and every
#                  checkpoint under the root is of one configuration and verifies.
#   wrong-secret   strangers with a wrong secret dial the job's coordinator (at the address
#                  given with `launch --coordinator`), one after another while the job runs
#                  (at least 10, at most 30): each is refused within 10 s after one attempt,
#                  the job's log says so in at most 10 lines, and the job ends with the
#                  single-process fingerprint.
#   node0-lost     a job of two launchers (nodes) that meet in etcd, node 0 (workers 0 and 1,
#                  and the coordinator role) killed whole: node 1's workers elect a new
#                  coordinator and end with the single-process fingerprint.
# Kinds that cannot run here (not root, no namespaces, no tmpfs, no etcd) are reported as
# skipped.
# Prints one line per trial and a table; exits 1 if any trial failed. Logs of failed
# trials stay in the directory it names.
set -uo pipefail
cd "$(dirname "$0")/.."
trials=${1:-14}
seed=${2:-1}
bin=$(realpath "${BIN:-target/release/steadfast}")
steps=${STEPS:-300}
[ -x "$bin" ] || { echo "no binary at $bin (cargo build --release, or set BIN)"; exit 2; }
kinds=(kill1 kill2 stop-worker stop-cont launcher-cont launcher-kill cut-link full-disk two-jobs wrong-secret node0-lost)
logs=$(mktemp -d /tmp/chaos.XXXXXX)

job=(train --model mlp --data synthetic --batch 48 --micro-batch 16 --eval-every 0 --reduce reproducible)

# The single-process fingerprint of `steps` steps, the reference of every trial.
reference() {
  "$bin" "${job[@]}" --steps "$1" --out "$logs/ref-$1" 2>/dev/null | sed -n 's/^fingerprint: \([0-9a-f]*\).*/\1/p'
}
ref=$(reference "$steps")
[ -n "$ref" ] || { echo "the reference run failed"; exit 2; }

# Waits (at most 60 s) until the run writing `$1/metrics.jsonl` has logged `$2` steps.
wait_steps() {
  for _ in $(seq 1 600); do
    [ -f "$1/metrics.jsonl" ] && [ "$(grep -c '"kind":"train"' "$1/metrics.jsonl")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}

# The pid of worker `$2` named in launcher log `$1` (its newest process).
worker_pid() { sed -n "s/.*worker $2 started: process [0-9]* (pid \([0-9]*\)).*/\1/p" "$1" | tail -1; }

# Every fingerprint in `$1` equals the reference, and there are `$2` of them.
fingerprints_ok() {
  local n
  n=$(grep -c "fingerprint: $ref" "$1")
  [ "$n" = "$2" ] && ! grep "fingerprint: " "$1" | grep -vq "fingerprint: $ref"
}

# How many workers were hit after the job's final state (launcher log `$1`): a SIGKILL
# that lands while a worker evaluates the finished state, or a SIGSTOP that holds it there
# until the launcher kills it, after which the job ends well without that worker's
# fingerprint.
killed_after_the_end() {
  awk '/every member holds the final state/ {done = 1}
    done && /worker [0-9]+ \(process [0-9]+\) exited with signal: 9/ {late[$5] = 1}
    done && /killing worker [0-9]+: still running after the job ended/ {w = $6; sub(":", "", w); late[w] = 1}
    END {n = 0; for (w in late) n++; print n}' "$1"
}

# Waits for pid `$1` at most `$2` seconds; returns 1 if it is still running.
wait_pid() {
  for _ in $(seq 1 $(($2 * 10))); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  return 1
}

# Runs `launch` in the background (its own process group); sets $lpid.
start_launch() {
  setsid "$bin" launch --nproc 3 --heartbeat-timeout 1 --max-restarts 2 -- "${job[@]}" --steps "$steps" \
    --out "$1/out" >"$1/launch.log" 2>&1 &
  lpid=$!
  for _ in $(seq 1 100); do [ -n "$(worker_pid "$1/launch.log" 2)" ] && break; sleep 0.1; done
}

trial_launch() { # kind dir
  local kind=$1 dir=$2 at victim other pid
  start_launch "$dir"
  at=$((10 + RANDOM % (steps / 2)))
  wait_steps "$dir/out" "$at" || { echo "never reached step $at"; return 1; }
  victim=$((RANDOM % 3))
  pid=$(worker_pid "$dir/launch.log" "$victim")
  case $kind in
    kill1) kill -KILL "$pid" ;;
    kill2)
      kill -KILL "$pid"
      other=$(((victim + 1 + RANDOM % 2) % 3))
      sleep "0.$((RANDOM % 10))"
      kill -KILL "$(worker_pid "$dir/launch.log" "$other")" 2>/dev/null || true  # it may have ended
      ;;
    stop-worker)
      kill -STOP "$pid"
      # A stop that lands after the job's final state can test no replacement: the worker
      # is continued at once rather than left for the launcher to kill after its grace.
      if grep -q "every member holds the final state" "$dir/launch.log"; then kill -CONT "$pid"; fi
      ;;
    stop-cont) kill -STOP "$pid"; sleep "$((RANDOM % 4)).$((5 + RANDOM % 5))"; kill -CONT "$pid" 2>/dev/null ;;
    launcher-cont) kill -STOP "$lpid"; sleep "$((1 + RANDOM % 4)).$((RANDOM % 10))"; kill -CONT "$lpid" ;;
    launcher-kill)
      local pids
      pids=$(for w in 0 1 2; do worker_pid "$dir/launch.log" "$w"; done)
      kill -STOP "$lpid"; sleep 2; kill -KILL "$lpid"
      for p in $pids; do
        wait_pid "$p" 15 || { echo "worker pid $p still runs 15 s after its launcher was killed"; kill -KILL -- -"$lpid"; return 1; }
      done
      return 0
      ;;
  esac
  if ! wait_pid "$lpid" 120; then echo "the job did not end within 120 s"; kill -KILL -- -"$lpid"; return 1; fi
  wait "$lpid"; local rc=$?
  [ "$rc" = 0 ] || { echo "launch exited $rc"; return 1; }
  # Every worker prints the reference fingerprint, but one that a kill hit after the job
  # had ended (the job runs fast: even the first kill may come after its last step).
  local expected
  expected=$((3 - $(killed_after_the_end "$dir/launch.log")))
  fingerprints_ok "$dir/launch.log" "$expected" || { echo "fingerprints differ from $ref"; return 1; }
  if [ "$kind" = launcher-cont ] && ! grep -q "with 0 replacement(s)" "$dir/launch.log"; then
    echo "a paused launcher replaced a healthy worker"; return 1
  fi
  return 0
}

trial_cut() { # dir
  local dir=$1
  (
    . scripts/netns-hosts.sh
    make_hosts 3 >/dev/null
    export STEADFAST_SECRET=chaos-secret
    coord="$net.10:29500"
    on_host 0 "$bin" coordinator --elastic --bind "$coord" --world-size 3 --heartbeat-timeout 1 \
      >"$dir/coord.log" 2>&1 &
    for i in 0 1 2; do
      on_host "$i" "$bin" "${job[@]}" --steps "$steps" --elastic --rank "$i" --world-size 3 --coordinator "$coord" \
        --bind "$net.$((10 + i))" --out "$dir/out$i" >"$dir/w$i.log" 2>&1 &
      eval "pid$i=$!"
    done
    wait_steps "$dir/out0" $((10 + RANDOM % (steps / 2))) || { echo "never started"; exit 1; }
    cut_host 2
    status=0
    for i in 0 1; do
      p="pid$i"
      if ! wait_pid "${!p}" 120; then echo "survivor $i did not end"; status=1; break; fi
      wait "${!p}" || { echo "survivor $i failed"; status=1; break; }
      fingerprints_ok "$dir/w$i.log" 1 || { echo "survivor $i: fingerprint differs from $ref"; status=1; break; }
    done
    # The worker cut off stays alive until it hears from nobody for long: end it, and the
    # coordinator, before the hosts are taken down.
    pkill -KILL -f -- "--out $dir/out" 2>/dev/null
    pkill -KILL -f -- "coordinator --elastic --bind $coord" 2>/dev/null
    wait 2>/dev/null
    exit $status
  )
  local rc=$?
  [ "$rc" = 77 ] && return 77
  return "$rc"
}

trial_disk() { # dir
  local dir=$1 rc
  mkdir -p "$dir/disk"
  mount -t tmpfs -o size=$((2 + RANDOM % 6))m tmpfs "$dir/disk" 2>/dev/null || return 77
  local ck=(--checkpoint-every 5 --checkpoint-dir "$dir/disk/ckpt" --keep-last 4)
  "$bin" "${job[@]}" --steps "$steps" "${ck[@]}" --out "$dir/run1" >"$dir/run1.log" 2>&1
  rc=$?
  if grep -q "panicked" "$dir/run1.log" || { [ "$rc" != 0 ] && [ "$rc" != 2 ]; }; then
    echo "the run on a full disk exited $rc"; umount "$dir/disk"; return 1
  fi
  # Every committed checkpoint verifies (none at all is an error that says so: exit 2).
  "$bin" ckpt verify "$dir/disk/ckpt" >"$dir/verify.log" 2>&1
  rc=$?
  if [ "$rc" = 1 ]; then echo "a committed checkpoint does not verify"; umount "$dir/disk"; return 1; fi
  mount -o remount,size=256m "$dir/disk"
  "$bin" "${job[@]}" --steps "$steps" "${ck[@]}" --resume auto --out "$dir/run2" >"$dir/run2.log" 2>&1
  rc=$?
  umount "$dir/disk"
  [ "$rc" = 0 ] || { echo "the resume failed"; return 1; }
  fingerprints_ok "$dir/run2.log" 1 || { echo "the resume's fingerprint differs from $ref"; return 1; }
  if grep -q "os error 28" "$dir/run1.log"; then
    echo "disk full: $(grep -c '^OK' "$dir/verify.log") checkpoint(s) verified, resumed"
  else
    echo "the disk did not fill"
  fi
}

# A free TCP port on the loopback interface.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Each step of the jobs below lasts at least 5 ms, so that a second actor (a second job,
# strangers, a kill) arrives while the job still runs, however fast the machine.
pace=(env STEADFAST_FAILPOINTS=step_begin=sleep:5)

trial_two_jobs() { # dir
  local dir=$1 ck=$1/ckpt at apid rc second=() started took
  setsid "${pace[@]}" "$bin" launch --nproc 2 --heartbeat-timeout 1 --max-restarts 1 -- "${job[@]}" --steps "$steps" \
    --checkpoint-dir "$ck" --checkpoint-every 20 --out "$dir/a" >"$dir/a.log" 2>&1 &
  apid=$!
  at=$((10 + RANDOM % (steps / 2)))
  wait_steps "$dir/a" "$at" || { echo "never reached step $at"; kill -KILL -- -"$apid"; return 1; }
  # The same command but for its output, or another seed (another configuration).
  ((RANDOM % 2)) && second=(--seed 99)
  started=$(date +%s)
  "${pace[@]}" "$bin" launch --nproc 2 --heartbeat-timeout 1 --max-restarts 1 -- "${job[@]}" --steps "$steps" \
    --checkpoint-dir "$ck" --checkpoint-every 20 --out "$dir/b" "${second[@]}" >"$dir/b.log" 2>&1
  rc=$?
  took=$(($(date +%s) - started))
  if ! wait_pid "$apid" 120; then echo "the first job did not end"; kill -KILL -- -"$apid"; return 1; fi
  wait "$apid" || { echo "the first job failed"; return 1; }
  [ "$rc" != 0 ] || { echo "the second job ran beside the first"; return 1; }
  ((took <= 30)) || { echo "the second job was refused after $took s"; return 1; }
  grep -qE "in use by|another configuration" "$dir/b.log" || { echo "the second job does not say why"; return 1; }
  fingerprints_ok "$dir/a.log" 2 || { echo "the first job's fingerprints differ from $ref"; return 1; }
  "$bin" ckpt verify "$ck" >"$dir/verify.log" 2>&1 || { echo "the root does not verify (or mixes runs)"; return 1; }
  echo "refused after $took s (${second[*]:-same command}), at step $at"
}

trial_wrong_secret() { # dir
  local dir=$1 port lpid at i t0 t1 slow=0 lines sent=0
  port=$(free_port)
  # Slower steps than the other trials': the job must outlast the strangers.
  setsid env STEADFAST_FAILPOINTS=step_begin=sleep:20 "$bin" launch --nproc 3 --heartbeat-timeout 1 --max-restarts 2 --coordinator "127.0.0.1:$port" \
    -- "${job[@]}" --steps "$steps" --out "$dir/out" >"$dir/launch.log" 2>&1 &
  lpid=$!
  at=$((10 + RANDOM % (steps / 3)))
  wait_steps "$dir/out" "$at" || { echo "never reached step $at"; kill -KILL -- -"$lpid"; return 1; }
  for i in $(seq 1 30); do
    kill -0 "$lpid" 2>/dev/null && ! grep -q "every member holds the final state" "$dir/launch.log" || break
    sent=$i
    t0=$(date +%s%N)
    STEADFAST_SECRET="wrong-$i" timeout 20 "$bin" "${job[@]}" --steps "$steps" --elastic --rank 1 --world-size 3 \
      --coordinator "127.0.0.1:$port" --out "$dir/stranger" >>"$dir/stranger.log" 2>&1 \
      && { echo "a stranger with a wrong secret was let in"; kill -KILL -- -"$lpid"; return 1; }
    t1=$(date +%s%N)
    (((t1 - t0) / 1000000 > 10000)) && slow=$((slow + 1))
  done
  ((sent >= 10)) || { echo "the job ended before 10 strangers came ($sent)"; kill -KILL -- -"$lpid"; return 1; }
  ((slow == 0)) || { echo "$slow stranger(s) took more than 10 s to be refused"; kill -KILL -- -"$lpid"; return 1; }
  grep -qi "secret" "$dir/stranger.log" || { echo "the strangers are not told it is the secret"; kill -KILL -- -"$lpid"; return 1; }
  if ! wait_pid "$lpid" 120; then echo "the job did not end within 120 s"; kill -KILL -- -"$lpid"; return 1; fi
  wait "$lpid" || { echo "the job failed"; return 1; }
  lines=$(grep -ci "secret" "$dir/launch.log")
  ((lines <= 10)) || { echo "the job's log has $lines lines about refused peers"; return 1; }
  fingerprints_ok "$dir/launch.log" 3 || { echo "fingerprints differ from $ref"; return 1; }
  echo "$sent strangers refused from step $at; $lines line(s) of it in the job's log"
}

trial_node0_lost() { # dir
  local dir=$1 client peer url n0 n1 at rc
  command -v etcd >/dev/null || return 77
  client=$(free_port); peer=$(free_port)
  etcd --name default --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$client" \
    --advertise-client-urls "http://127.0.0.1:$client" --listen-peer-urls "http://127.0.0.1:$peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer" --initial-cluster "default=http://127.0.0.1:$peer" \
    >"$dir/etcd.log" 2>&1 &
  local epid=$!
  local health="import sys, urllib.request as u; sys.exit(b'true' not in u.urlopen('http://127.0.0.1:$client/health', timeout=1).read())"
  for _ in $(seq 1 300); do python3 -c "$health" 2>/dev/null && break; sleep 0.1; done
  url="etcd://127.0.0.1:$client/chaos?ttl=2"
  node() { # rank
    setsid env STEADFAST_SECRET=chaos-etcd "${pace[@]}" "$bin" launch --nnodes 2 --node-rank "$1" --nproc-per-node 2 \
      --rendezvous "$url" --heartbeat-timeout 2 --max-restarts 2 --min-nproc 2 -- "${job[@]}" --steps "$steps" \
      --out "$dir/node$1" >"$dir/node$1.log" 2>&1 &
  }
  node 0; n0=$!
  for _ in $(seq 1 300); do grep -q "holds the coordinator role" "$dir/node0.log" && break; sleep 0.1; done
  node 1; n1=$!
  at=$((10 + RANDOM % (steps / 2)))
  if ! wait_steps "$dir/node0" "$at"; then
    echo "never reached step $at"; kill -KILL -- -"$n0" -"$n1"; kill "$epid"; return 1
  fi
  kill -KILL -- -"$n0"
  wait "$n0" 2>/dev/null
  if ! wait_pid "$n1" 120; then echo "node 1 did not end within 120 s"; kill -KILL -- -"$n1"; kill "$epid"; return 1; fi
  wait "$n1"; rc=$?
  kill "$epid"; wait "$epid" 2>/dev/null
  [ "$rc" = 0 ] || { echo "node 1 exited $rc"; return 1; }
  # Node 0 may have been killed after the job's final state: then node 1 ends all the same.
  fingerprints_ok "$dir/node1.log" 2 || { echo "node 1's fingerprints differ from $ref"; return 1; }
  echo "node 0 lost at step $at"
}

declare -A ran passed skipped
for k in "${kinds[@]}"; do ran[$k]=0; passed[$k]=0; skipped[$k]=0; done
failed=0
for ((t = 1; t <= trials; t++)); do
  # Each trial's draws follow from the seed and its number alone (a trial runs in a
  # subshell, whose draws do not advance the caller's). The first trials take each kind
  # once; then the kinds are drawn.
  RANDOM=$((seed * 7919 + t))
  if ((t <= ${#kinds[@]})); then kind=${kinds[$((t - 1))]}; else kind=${kinds[$((RANDOM % ${#kinds[@]}))]}; fi
  dir="$logs/$t-$kind"
  mkdir -p "$dir"
  started=$(date +%s)
  case $kind in
    cut-link) why=$(trial_cut "$dir") ;;
    full-disk) why=$(trial_disk "$dir") ;;
    two-jobs) why=$(trial_two_jobs "$dir") ;;
    wrong-secret) why=$(trial_wrong_secret "$dir") ;;
    node0-lost) why=$(trial_node0_lost "$dir") ;;
    *) why=$(trial_launch "$kind" "$dir") ;;
  esac
  rc=$?
  took=$(($(date +%s) - started))
  if [ "$rc" = 77 ]; then
    skipped[$kind]=$((skipped[$kind] + 1))
    printf '%4d %-14s skipped (cannot run here) %4d s\n' "$t" "$kind" "$took"
    rm -rf "$dir"
    continue
  fi
  ran[$kind]=$((ran[$kind] + 1))
  if [ "$rc" = 0 ]; then
    passed[$kind]=$((passed[$kind] + 1))
    printf '%4d %-14s ok      %4d s  %s\n' "$t" "$kind" "$took" "$why"
    rm -rf "$dir"
  else
    failed=$((failed + 1))
    printf '%4d %-14s FAILED  %4d s  %s (logs: %s)\n' "$t" "$kind" "$took" "$why" "$dir"
  fi
done

echo
echo "chaos: $trials trials, seed $seed, $steps steps, reference fingerprint $ref"
printf '| %-14s | %6s | %6s | %6s | %7s |\n' kind trials passed failed skipped
printf '|%s|%s|%s|%s|%s|\n' "----------------" "--------" "--------" "--------" "---------"
for k in "${kinds[@]}"; do
  printf '| %-14s | %6d | %6d | %6d | %7d |\n' "$k" "${ran[$k]}" "${passed[$k]}" $((ran[$k] - passed[$k])) "${skipped[$k]}"
done
total_passed=0
for k in "${kinds[@]}"; do total_passed=$((total_passed + passed[$k])); done
echo "$total_passed passed, $failed failed"
[ "$failed" = 0 ] && rm -rf "$logs"
[ "$failed" = 0 ]
