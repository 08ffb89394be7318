#!/usr/bin/env bash
# (Copied from the project's shared tools so that CI checkouts have it: tests/tests/slurm.rs starts it.)
# A real Slurm cluster of N nodes on this one machine (Debian's slurm-wlm runs one slurmd per node
# name, each on its own port), for tests that need srun/sbatch/scancel and SLURM_* as they are.
# Seen working on Debian 12 (slurm-wlm 22.05.8) as root, with no cgroups (proctrack/linuxproc).
#   local-cluster.sh start [NODES=2] [DIR=/tmp/local-slurm]   install if missing, start, wait for idle
#   local-cluster.sh stop  [DIR]                              stop the daemons this script started
# After start: srun -N2 -n2 bash -c 'echo $SLURM_NODEID'   prints 0 and 1 (nodes n1, n2).
# Environment for the jobs: KillWait is 10 s (scancel: SIGTERM, then SIGKILL 10 s later).
set -euo pipefail
cmd=${1:-start}
if [ "$cmd" = stop ]; then
  dir=${2:-/tmp/local-slurm}
  for f in "$dir"/run/*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  exit 0
fi
nodes=${2:-2}; dir=${3:-/tmp/local-slurm}
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq slurm-wlm munge >/dev/null
fi
host=$(hostname -s); cpus=$(nproc)
mkdir -p "$dir"/{state,run,log}
for i in $(seq "$nodes"); do mkdir -p "$dir/spool.n$i"; done
conf=/etc/slurm/slurm.conf
$SUDO mkdir -p /etc/slurm
$SUDO tee "$conf" >/dev/null <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool.%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
ReturnToService=2
KillWait=10
NodeName=n[1-$nodes] NodeHostname=$host Port=17001-$((17000 + nodes)) CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
# munge: one key, owned by the munge user; started once per machine.
if ! pgrep -x munged >/dev/null; then
  $SUDO mkdir -p /etc/munge /run/munge /var/log/munge /var/lib/munge
  [ -f /etc/munge/munge.key ] || $SUDO dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  $SUDO chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  $SUDO chmod 400 /etc/munge/munge.key
  $SUDO munged --force 2>/dev/null
fi
[ -f "$dir/run/slurmctld.pid" ] && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null || $SUDO slurmctld
for i in $(seq "$nodes"); do
  [ -f "$dir/run/slurmd.n$i.pid" ] && kill -0 "$(cat "$dir/run/slurmd.n$i.pid")" 2>/dev/null || $SUDO slurmd -N "n$i"
done
for _ in $(seq 60); do
  [ "$(sinfo -h -o '%T' 2>/dev/null | sort -u)" = idle ] && { sinfo; exit 0; }
  sleep 0.5
done
echo "local Slurm did not come up: see $dir/log/" >&2; sinfo >&2 || true; exit 1
