#!/usr/bin/env bash
# Stop the test Slurm started by start.sh: cancel its jobs, then SIGTERM slurmd → slurmctld → munged by
# the PIDs in their pid files under STATE_DIR (never by name: other Slurms on the host are left alone).
#
#   tests/slurm/stop.sh STATE_DIR
set -uo pipefail

dir=${1:?usage: stop.sh STATE_DIR}
[ -f "$dir/etc/slurm.conf" ] && SLURM_CONF="$dir/etc/slurm.conf" timeout 5 scancel --user="$(id -un)" 2>/dev/null

# Each daemon takes ~2 s to exit, so each group is signalled together, then waited for.
stop_pidfiles() {
  local f pid pids=()
  for f in "$@"; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

stop_pidfiles "$dir"/run/slurmd-*.pid
stop_pidfiles "$dir/run/slurmctld.pid" "$dir/run/munged.pid"
exit 0
