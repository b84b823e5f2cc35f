#!/usr/bin/env bash
# A real Slurm on this one machine, for the tests: munged, slurmctld and two
# slurmd (node1 and node2, on ports 17001 and 17002), everything under
# $MUSTER_SLURM_DIR (default /tmp/muster-slurm) but munged's socket. Needs
# root, slurm-wlm and munge (scripts/setup installs them).
#
# munged runs as a cluster's does: as the munge user, on its default socket
# (/run/munge/munge.socket.2, the one every program finds with no flag),
# in a directory of munge's that anyone may enter.
#
#   tests/slurm/cluster.sh start   # prints the SLURM_CONF to export
#   tests/slurm/cluster.sh stop
#
# node1 and node2 resolve to 127.0.0.1 through lines this script adds to
# /etc/hosts (marked, and removed by stop).
set -euo pipefail
dir=${MUSTER_SLURM_DIR:-/tmp/muster-slurm}
conf=$dir/slurm.conf
marker="# muster test cluster"
socket=/run/munge/munge.socket.2

stop() {
  for pidfile in "$dir"/slurmd-node1.pid "$dir"/slurmd-node2.pid "$dir"/slurmctld.pid "$dir"/munge/munged.pid; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    pgrep -f "$conf" >/dev/null || break
    sleep 0.1
  done
  pkill -9 -f "$conf" 2>/dev/null || true
  [ -f "$dir/munge/munged.pid" ] && kill -9 "$(cat "$dir/munge/munged.pid")" 2>/dev/null || true
  sed -i "/$marker/d" /etc/hosts
}

start() {
  stop
  rm -rf "$dir"
  mkdir -p "$dir/ctld" "$dir/spool-node1" "$dir/spool-node2" "$dir/munge"
  grep -q "$marker" /etc/hosts || echo "127.0.0.1 node1 node2 $marker" >> /etc/hosts
  if [ -S "$socket" ] && munge -n -s "$socket" >/dev/null 2>&1; then
    echo "a munged already answers on $socket; stop it first (this script runs its own)" >&2
    return 1
  fi
  install -d -o munge -g munge -m 0755 "$(dirname "$socket")"
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chown -R munge:munge "$dir/munge"
  chmod 700 "$dir/munge"
  chmod 400 "$dir/munge/munge.key"
  runuser -u munge -- munged --key-file="$dir/munge/munge.key" --socket="$socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
    --seed-file="$dir/munge/seed"
  cat > "$conf" <<CONF
ClusterName=muster
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001 CPUs=2 RealMemory=1000 State=UNKNOWN
NodeName=node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=17002 CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
  export SLURM_CONF=$conf
  slurmctld -f "$conf" -i
  slurmd -f "$conf" -N node1
  slurmd -f "$conf" -N node2
  for _ in $(seq 100); do
    if [ "$(sinfo -h -o '%T' 2>/dev/null | sort -u | tr -d '\n')" = "idle" ]; then
      echo "SLURM_CONF=$conf"
      return 0
    fi
    sleep 0.2
  done
  echo "the test cluster did not come up; logs in $dir" >&2
  sinfo >&2 || true
  return 1
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
