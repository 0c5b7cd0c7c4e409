#!/usr/bin/env bash
# RebootProgram for the one-host test Slurm (start.sh): "reboots" the node whose slurmd runs this.
#
# slurmd runs the program through `sh -c` and sets no node-name variable, so walk up the parent
# processes to the slurmd (cmdline `slurmd ... -N <node>`), then, detached with setsid, stop that slurmd
# and start `slurmd -b` for the same node: -b makes slurmd report "node rebooted" when it starts, so the
# reboot completes in slurmctld as a real one would. Each reboot is logged to log/reboots.log.
# See /work/shared/notes/slurm-on-one-host.md, "Reboots on one host".
set -euo pipefail

pid=$PPID
while [ "$pid" -gt 1 ]; do
  mapfile -d '' args < "/proc/$pid/cmdline" || args=()
  if [ "${#args[@]}" -gt 0 ] && [ "$(basename "${args[0]}")" = slurmd ]; then
    break
  fi
  pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status")
done
[ "$pid" -gt 1 ] || { echo "reboot.sh: no slurmd above me" >&2; exit 1; }

exe=${args[0]} conf="" node=""
for ((i = 1; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    -f) conf=${args[$((i + 1))]} ;;
    -N) node=${args[$((i + 1))]} ;;
  esac
done
[ -n "$conf" ] && [ -n "$node" ] || { echo "reboot.sh: slurmd $pid has no -f/-N" >&2; exit 1; }

log="$(dirname "$(dirname "$conf")")/log/reboots.log"
echo "$(date -u +%FT%TZ) $node slurmd=$pid" >> "$log"
setsid bash -c "
  kill -TERM $pid
  for _ in \$(seq 1 200); do kill -0 $pid 2>/dev/null || break; sleep 0.05; done
  exec '$exe' -b -f '$conf' -N '$node'
" </dev/null >/dev/null 2>&1 &
