#!/usr/bin/env bash
# A one-host Slurm cluster in a directory, for tests and trials: munged, slurmctld and
# slurmd, configured to run as root with every file under DIR (nothing under /etc).
#
#   scripts/slurm-one-host.sh start DIR [CPUS]   # then: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm-one-host.sh stop DIR
#
# The node claims CPUS CPUs (8 by default) whatever the machine has, so that a 2-core
# machine runs 4 tasks. Needs root and Debian's slurm-wlm and munge. Exit status 77:
# cannot run here (not root, or the packages are missing).
set -euo pipefail
cmd=${1:?usage: slurm-one-host.sh start|stop DIR [CPUS]}
dir=$(realpath -m "${2:?usage: slurm-one-host.sh start|stop DIR [CPUS]}")
cpus=${3:-8}

stop() {
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/pid"; do
    for _ in $(seq 50); do [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null || break; sleep 0.1; done
  done
}

if [ "$cmd" = stop ]; then stop; exit 0; fi
[ "$cmd" = start ] || { echo "usage: slurm-one-host.sh start|stop DIR [CPUS]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "a one-host Slurm cluster needs root"; exit 77; }
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install slurm-wlm munge)"; exit 77; }
done

node=$(hostname -s)
mkdir -p "$dir"/{munge,state,spool,log}
chmod 755 "$dir" "$dir/munge"
[ -f "$dir/munge/munge.key" ] || head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chmod 600 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/sock" --pid-file="$dir/munge/pid" \
  --log-file="$dir/munge/log" --seed-file="$dir/munge/seed"

cat >"$dir/slurm.conf" <<CONF
ClusterName=steadfast
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$dir/munge/sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
# Ready when the node takes jobs.
for _ in $(seq 100); do
  state=$(sinfo -h -n "$node" -o %t 2>/dev/null || true)
  case "$state" in idle*|mix*|alloc*) echo "slurm is up: export SLURM_CONF=$SLURM_CONF"; exit 0 ;; esac
  sleep 0.2
done
echo "slurm did not come up; logs in $dir/log"; tail -n 20 "$dir"/log/*.log; stop; exit 1
