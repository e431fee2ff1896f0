#!/usr/bin/env bash
# A one-node Slurm cluster on localhost (munged, slurmctld, slurmd) for tests and trying the sbatch
# script: brings it up, runs COMMAND with SLURM_CONF pointing at it, and tears it down at exit.
# Usage: scripts/slurm/local_cluster.sh [COMMAND [ARGS...]]   (no COMMAND: stays up until Ctrl-C)
#
# Needs root (slurmd starts jobs as their users) and Debian's slurmctld, slurmd, slurm-client and
# munge; no systemd: every daemon runs in the foreground as a child of this script. Everything it
# writes (key, config, state, logs) lives in one temporary directory, removed at exit unless
# FP8T_SLURM_KEEP=1; the system's /etc/slurm and /etc/munge are not touched, so it can run next to
# a real installation and twice at once (each copy picks free ports).
# Exit status: COMMAND's; 1 when the cluster did not come up (the daemons' logs are printed).
set -euo pipefail

log() { echo "[local_cluster] $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

[ "$(id -u)" = 0 ] || die "needs root: slurmd must be able to start jobs as their users (run with sudo)"
for tool in munged slurmctld slurmd sinfo scontrol scancel; do
  command -v "$tool" >/dev/null || die "$tool not found: apt-get install slurmctld slurmd slurm-client munge"
done

DIR=$(mktemp -d "${TMPDIR:-/tmp}/fp8t-slurm.XXXXXX")
chmod 700 "$DIR"
PIDS=()

# Stops whatever this copy started (jobs first, so no slurmstepd outlives its slurmd), once.
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -f "$DIR/slurm.conf" ] && [ ${#PIDS[@]} -gt 0 ]; then
    SLURM_CONF="$DIR/slurm.conf" scancel --full --quiet --user=root 2>/dev/null || true
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF="$DIR/slurm.conf" squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  local i
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do  # slurmd, slurmctld, then munged
    kill "${PIDS[i]}" 2>/dev/null || true
    wait "${PIDS[i]}" 2>/dev/null || true
  done
  if [ "${FP8T_SLURM_KEEP:-0}" = 1 ]; then
    log "kept $DIR"
  else
    rm -rf "$DIR"
  fi
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show_logs() {
  local f
  for f in "$DIR"/*.log; do
    [ -f "$f" ] || continue
    echo "---- $f (last 30 lines) ----" >&2
    tail -n 30 "$f" >&2
  done
}

# A TCP port nobody listens on, from `start` upwards.
free_port() {
  local p=$1
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
  echo "$p"
}

# ---- munge: a fresh key and a daemon on our own socket ----
mkdir -p "$DIR/munge"
chmod 700 "$DIR/munge"
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$DIR/munge/munge.key"
MUNGE_SOCKET="$DIR/munge/munge.socket"
munged --foreground --force --key-file="$DIR/munge/munge.key" --socket="$MUNGE_SOCKET" \
  --pid-file="$DIR/munge/munged.pid" --seed-file="$DIR/munge/munged.seed" --log-file="$DIR/munged.log" \
  >>"$DIR/munged.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do
  [ -S "$MUNGE_SOCKET" ] && break
  kill -0 "${PIDS[0]}" 2>/dev/null || { show_logs; die "munged exited"; }
  sleep 0.1
done
[ -S "$MUNGE_SOCKET" ] || { show_logs; die "munged did not create $MUNGE_SOCKET"; }

# ---- slurm.conf: this machine's real CPUs and memory, as slurmd itself reports them ----
NODE=$(hostname -s)
HW=$(slurmd -C | head -n 1)  # NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 ... RealMemory=24105
HW=${HW#NodeName=* }
CPUS=$(sed -n 's/.*\bCPUs=\([0-9]*\).*/\1/p' <<<"$HW")
EXTRA=""
if [ "${CPUS:-0}" -lt 2 ]; then
  # Two tasks need two slots; on a one-CPU machine declare two and let the config win.
  log "warning: this machine has ${CPUS:-?} CPU(s); declaring 2 slots (oversubscribed)"
  HW="CPUs=2 $(sed -n 's/.*\(RealMemory=[0-9]*\).*/\1/p' <<<"$HW")"
  EXTRA="SlurmdParameters=config_overrides"
fi
CTLD_PORT=$(free_port "${FP8T_SLURM_PORT:-6817}")
SLURMD_PORT=$(free_port $((CTLD_PORT + 1)))
mkdir -p "$DIR/state" "$DIR/spool"
cat >"$DIR/slurm.conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: one node, no accounting, no cgroups.
ClusterName=fp8t-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
# Finished jobs are never purged (scontrol show job reports their exit), and sbatch --wait then polls
# every 2 s instead of backing off to 32 s.
MinJobAge=0
$EXTRA
NodeName=$NODE NodeAddr=127.0.0.1 $HW State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
: >"$DIR/plugstack.conf"  # not the system's /etc/slurm/plugstack.conf
export SLURM_CONF="$DIR/slurm.conf"

# ---- the daemons, in the foreground, as children of this script ----
slurmctld -D -i -f "$SLURM_CONF" >>"$DIR/slurmctld.out.log" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" -N "$NODE" >>"$DIR/slurmd.out.log" 2>&1 &
PIDS+=($!)

state=""
for _ in $(seq 120); do
  state=$(sinfo -h -N -n "$NODE" -o %t 2>/dev/null || true)
  [ "$state" = idle ] && break
  for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null || { show_logs; die "a daemon exited (pid $pid)"; }; done
  sleep 0.5
done
[ "$state" = idle ] || { show_logs; die "node $NODE is '${state:-unknown}', not idle, after 60 s"; }
log "up: node $NODE ($HW), SLURM_CONF=$SLURM_CONF"

if [ $# -eq 0 ]; then
  log "export SLURM_CONF=$SLURM_CONF in another shell to use it; Ctrl-C stops it"
  while :; do sleep 3600; done
fi
set +e
"$@"
