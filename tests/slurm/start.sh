#!/usr/bin/env bash
# Start a throw-away multi-node Slurm on this host for tests: munged, slurmctld and one slurmd per node
# (gpu01..gpu04, 8 fake GPUs each), all on loopback ports, all state under STATE_DIR. `scontrol reboot`
# completes for real: RebootProgram=reboot.sh restarts the node's slurmd with -b ("node rebooted").
#
#   tests/slurm/start.sh STATE_DIR [CTLD_PORT [SLURMD_BASE_PORT]]
#
# Prints `SLURM_CONF=<path>` on success; stop everything with tests/slurm/stop.sh STATE_DIR.
# Needs root (SlurmUser=root) and the Debian packages slurmctld, slurmd, slurm-client, munge.
set -euo pipefail

dir=${1:?usage: start.sh STATE_DIR [CTLD_PORT [SLURMD_BASE_PORT]]}
ctld_port=${2:-16817}
slurmd_base=${3:-17001}
nodes=(gpu01 gpu02 gpu03 gpu04)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sbin() { command -v "$1" || { [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1"; } || { echo "missing $1" >&2; exit 3; }; }
munged=$(sbin munged); mungekey=$(sbin mungekey); slurmctld=$(sbin slurmctld); slurmd=$(sbin slurmd)

mkdir -p "$dir"/{munge,ctld,run,log,dev,etc}
chmod 0711 "$dir" "$dir/munge"
for n in "${nodes[@]}"; do mkdir -p "$dir/spool/$n"; done
for i in 0 1 2 3 4 5 6 7; do ln -sf /dev/null "$dir/dev/nvidia$i"; done

# munge: its own key and socket; the socket directory must be 0711.
[ -f "$dir/munge/munge.key" ] || "$mungekey" -c -k "$dir/munge/munge.key"
chmod 0600 "$dir/munge/munge.key"
"$munged" --socket="$dir/munge/munge.socket.2" --key-file="$dir/munge/munge.key" \
  --log-file="$dir/log/munged.log" --pid-file="$dir/run/munged.pid" --seed-file="$dir/munge/munge.seed"

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
conf="$dir/etc/slurm.conf"
cat >"$conf" <<CONF
ClusterName=healertest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1,batch_sched_delay=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
KillWait=2
MinJobAge=300
SlurmdTimeout=30
RebootProgram=$here/reboot.sh
ResumeTimeout=60
InactiveLimit=0
TopologyPlugin=topology/tree
GresTypes=gpu
# Failure domains from node features (#27): rack=r01 / rack=r02 as key=value, the PDU by a prefix.
NodeName=gpu[01-02] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$slurmd_base-$((slurmd_base + 1)) CPUs=1 RealMemory=100 Gres=gpu:8 Feature=h100,nvlink,rack=r01,pdu_p1 State=UNKNOWN
NodeName=gpu[03-04] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((slurmd_base + 2))-$((slurmd_base + 3)) CPUs=1 RealMemory=100 Gres=gpu:8 Feature=h100,nvlink,rack=r02,pdu_p1 State=UNKNOWN
PartitionName=gpu Nodes=gpu[01-04] Default=YES MaxTime=INFINITE State=UP
PartitionName=train Nodes=gpu[01-02] MaxTime=INFINITE State=UP
CONF
# Failure domains (#27): three nodes under one leaf switch, one under another, both under a spine.
cat >"$dir/etc/topology.conf" <<CONF
SwitchName=leaf-01 Nodes=gpu[01-03]
SwitchName=leaf-02 Nodes=gpu04
SwitchName=spine-1 Switches=leaf-[01-02]
CONF
cat >"$dir/etc/gres.conf" <<CONF
AutoDetect=off
NodeName=gpu[01-04] Name=gpu File=$dir/dev/nvidia[0-7]
CONF

export SLURM_CONF="$conf"
"$slurmctld" -f "$conf" -i
for n in "${nodes[@]}"; do "$slurmd" -f "$conf" -N "$n"; done

# Ready when every node answers as idle.
for _ in $(seq 1 100); do
  idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | sort -u | grep -c ' idle$' || true)  # a node per partition
  if [ "$idle" = "${#nodes[@]}" ]; then
    echo "SLURM_CONF=$conf"
    exit 0
  fi
  sleep 0.1
done
echo "slurm did not come up; logs in $dir/log" >&2
sinfo -N -o '%N %T %E' >&2 || true
exit 1
