#!/usr/bin/env bash
# Install, start, check and stop a real single-node Slurm cluster (Debian 12, Slurm 22.05)
# on a machine without systemd: the daemons are started and stopped by hand, as root.
#
# Usage:  scripts/slurm_cluster.sh up|down|status
#   up      install slurmctld/slurmd/slurm-client/munge if missing, write /etc/slurm/slurm.conf,
#           start munged, slurmctld, slurmd, wait until the node is idle. Idempotent: running
#           daemons are kept, unless slurm.conf changed (then slurmctld/slurmd restart).
#   down    stop slurmd, slurmctld, munged via their pid files and wait for them to exit.
#   status  exit 0 iff sinfo answers and the node is idle/mixed/allocated/completing.
#
# CTS_SLURM_DIR (default /var/lib/cts-slurm) holds state/, spool/, run/, log/ (slurmctld.log,
# slurmd.log, munged.log, jobcomp.log) and gpu/: the node has GPUS (4) GRES `gpu` on dummy
# device files gpu/nvidia0..3 (gres.conf, AutoDetect=off), so a job that asks for GPUs gets them
# and a CUDA_VISIBLE_DEVICES from Slurm, as on a GPU cluster (no GPU is there to use).
# No slurmdbd, hence no sacct: finished jobs stay in `scontrol show job` for MinJobAge (300 s)
# and are appended to log/jobcomp.log. `sbatch --wait` polls with back-off (2, 8, 32 s...),
# so poll squeue instead.
set -euo pipefail

DIR="${CTS_SLURM_DIR:-/var/lib/cts-slurm}"
CONF=/etc/slurm/slurm.conf
GRES_CONF=/etc/slurm/gres.conf
PARTITION=debug
GPUS=4
MUNGE_PID=/run/munge/munged.pid
SLURMCTLD_PID="$DIR/run/slurmctld.pid"
SLURMD_PID="$DIR/run/slurmd.pid"
NODE="$(hostname -s)"

log() { printf '[slurm_cluster] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
alive() { [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
  local pkgs=(slurmctld slurmd slurm-client munge) missing="" b
  for b in slurmctld slurmd sinfo munged; do command -v "$b" >/dev/null || missing=1; done
  [[ -n "$missing" ]] || return 0
  export DEBIAN_FRONTEND=noninteractive
  log "installing ${pkgs[*]}"
  # Only refresh the package lists when installing from the current ones fails.
  if ! apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null; then
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${pkgs[@]}" >/dev/null
  fi
}

setup_munge() {
  [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
    || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -m 0755 "$DIR/log"
  [[ -e "$DIR/log/munged.log" ]] || install -o munge -g munge -m 0640 /dev/null "$DIR/log/munged.log"
}

# Print the slurm.conf for this machine on stdout. Hardware comes from `slurmd -C`.
render_conf() {
  local hw cpus boards sockets cores threads mem
  hw="$(slurmd -C | head -n1)"
  get() { sed -n "s/.*[[:space:]]$1=\([0-9]*\).*/\1/p" <<<"$hw"; }
  cpus=$(get CPUs) boards=$(get Boards) sockets=$(get SocketsPerBoard)
  cores=$(get CoresPerSocket) threads=$(get ThreadsPerCore) mem=$(get RealMemory)
  [[ -n "$cpus" && -n "$mem" ]] || die "cannot parse 'slurmd -C': $hw"
  mem=$((mem - mem / 50))  # a little below the total, so small fluctuations never drain the node
  cat <<EOF
# Written by scripts/slurm_cluster.sh -- single-node test cluster, do not edit by hand.
ClusterName=cts
SlurmctldHost=$NODE(127.0.0.1)
# Dummy GPUs (gres.conf): jobs asking for them get CUDA_VISIBLE_DEVICES as on a GPU node.
GresTypes=gpu
AuthType=auth/munge
# A requeued job may only restart cred_expire seconds later (default 120 s).
AuthInfo=cred_expire=10
SlurmUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/slurmd
SlurmctldPidFile=$SLURMCTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
# No cgroups here (and none needed): plain /proc process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, CR_*_Memory gives a job all the node's memory, serializing every job.
DefMemPerCPU=1024
# Start jobs right at submit, and run the full scheduling pass (which is what starts
# jobs whose begin time passed, e.g. requeued ones) every 2 s instead of every 60 s.
SchedulerParameters=batch_sched_delay=0,sched_interval=2
# Reject impossible requests at submit time instead of leaving them pending forever.
EnforcePartLimits=ALL
# Cancel jobs whose dependency can never be satisfied (e.g. afterok on a failed job).
DependencyParameters=kill_invalid_depend
MailProg=/bin/true
# No slurmdbd: record finished jobs in a text file instead.
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
ReturnToService=2
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus Boards=$boards SocketsPerBoard=$sockets CoresPerSocket=$cores ThreadsPerCore=$threads RealMemory=$mem Gres=gpu:$GPUS State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
}

# Print the gres.conf: GPUS GPUs on dummy devices (links to /dev/null, no driver, no
# autodetection: nothing probes them; Slurm only hands their indices to jobs).
render_gres() {
  cat <<EOF
# Written by scripts/slurm_cluster.sh -- dummy GPUs of the single-node test cluster.
AutoDetect=off
NodeName=$NODE Name=gpu File=$DIR/gpu/nvidia[0-$((GPUS - 1))]
EOF
}

stop_pid() {  # stop_pid NAME PIDFILE: SIGTERM, wait up to 30 s, then SIGKILL
  local name=$1 pidfile=$2 pid i
  alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid="$(cat "$pidfile")"
  log "stopping $name (pid $pid)"
  kill "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then log "$name did not exit, killing"; kill -9 "$pid" || true; sleep 0.5; fi
  rm -f "$pidfile"
}

node_state() { timeout 15 sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1; }

cmd_status() {
  local st; st="$(node_state || true)"
  [[ "$st" =~ ^(idle|mixed|allocated|completing)$ ]] || { log "node state: '${st:-no answer}'"; return 1; }
}

# True once slurmd (started at epoch $1 or later) has registered with slurmctld. Right after
# a restart slurmctld reports the node state it saved, before slurmd has registered.
registered() {
  local t; t="$(scontrol show node "$NODE" 2>/dev/null | sed -n 's/.*SlurmdStartTime=\([^ ]*\).*/\1/p')"
  [[ -n "$t" && "$t" != None ]] && (($(date -d "$t" +%s) >= $1))
}

cmd_up() {
  [[ $EUID -eq 0 ]] || die "must run as root"
  install_packages
  getent hosts "$NODE" >/dev/null || echo "127.0.0.1 $NODE" >>/etc/hosts
  setup_munge
  install -d -m 0755 "$DIR/state" "$DIR/spool/slurmd" "$DIR/run" "$DIR/gpu" /etc/slurm
  # Slurm wants character devices: links to /dev/null (no mknod, which containers may forbid).
  local i f made=""; for ((i = 0; i < GPUS; i++)); do
    f="$DIR/gpu/nvidia$i"; [[ -L "$f" && -c "$f" ]] || { rm -f "$f"; ln -s /dev/null "$f"; made=1; }
  done
  local new gres; new="$(render_conf)" gres="$(render_gres)"
  if [[ -n "$made" ]] || [[ ! -f "$CONF" ]] || [[ "$(cat "$CONF")" != "$new" ]] \
    || [[ ! -f "$GRES_CONF" ]] || [[ "$(cat "$GRES_CONF")" != "$gres" ]]; then
    stop_pid slurmd "$SLURMD_PID"; stop_pid slurmctld "$SLURMCTLD_PID"
    printf '%s\n' "$new" >"$CONF"; printf '%s\n' "$gres" >"$GRES_CONF"; log "wrote $CONF and $GRES_CONF"
  fi
  alive "$MUNGE_PID" || runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID" \
    --log-file="$DIR/log/munged.log"
  munge -n | unmunge >/dev/null || die "munge does not work; see $DIR/log/munged.log"
  alive "$SLURMCTLD_PID" || slurmctld
  local t_slurmd=0
  alive "$SLURMD_PID" || { t_slurmd=$(date +%s); slurmd; }
  local deadline=$((SECONDS + 60)) st=""
  until cmd_status 2>/dev/null && registered "$t_slurmd"; do
    st="$(node_state || true)"
    if ((SECONDS >= deadline)) || [[ "$st" == *drain* || "$st" == inval* ]]; then
      log "node '$NODE' not idle after $((SECONDS - deadline + 60)) s (state: '${st:-no answer}')"
      for f in slurmctld slurmd munged; do log "--- tail $DIR/log/$f.log"; tail -n 20 "$DIR/log/$f.log" >&2 || true; done
      die "cluster did not come up"
    fi
    sleep 0.5
  done
  sinfo -h -N -n "$NODE" -o 'slurm up: node=%N cpus=%c memory=%mMB gres=%G partition=%P state=%T' \
    | head -n1 | sed "s|\$| logs=$DIR/log|"
}

cmd_down() {
  stop_pid slurmd "$SLURMD_PID"
  stop_pid slurmctld "$SLURMCTLD_PID"
  stop_pid munged "$MUNGE_PID"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
