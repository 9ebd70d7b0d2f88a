#!/usr/bin/env bash
# `make demo`: run vgpud with mock GPUs (no GPU, no root needed), show its inventory and health,
# then stop it with SIGTERM and show that it left nothing behind. Until the local node environment
# exists (see the issues), this is the main job a newcomer can watch end to end.
# Interactive: runs until Ctrl-C. Otherwise (CI, pipes): stops after DEMO_SECONDS (default 5).
set -euo pipefail
cd "$(dirname "$0")/.."
VGPUD=.venv/bin/vgpud
PROFILE=${DEMO_PROFILE:-a100-40gb-x2}
root=$(mktemp -d /tmp/vgpud-demo.XXXXXX)
port=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
log=$root/vgpud.log
pid=

cleanup() {
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then kill -TERM "$pid"; wait "$pid" || true; fi
  rm -rf "$root"
}
trap cleanup EXIT

section() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

section "GPUs vgpud would publish (mock profile $PROFILE)"
$VGPUD gpus --gpu-backend mock --gpu-profile "$PROFILE"

section "Starting: vgpud run --gpu-backend mock --root-prefix $root (health on 127.0.0.1:$port)"
$VGPUD run --gpu-backend mock --gpu-profile "$PROFILE" --root-prefix "$root" --node-name demo-node \
  --healthcheck-address 127.0.0.1 --healthcheck-port "$port" >"$log" 2>&1 &
pid=$!

status=
for _ in $(seq 1 50); do
  status=$($VGPUD health --address "127.0.0.1:$port" --timeout 1 || true)
  [ "$status" = SERVING ] && break
  kill -0 "$pid" 2>/dev/null || { echo "vgpud exited early:"; cat "$log"; exit 1; }
  sleep 0.2
done
section "Health (grpc.health.v1, service 'liveness'): $status"
section "vgpud log ($log)"
cat "$log"

if [ -t 0 ]; then
  section "vgpud is running (pid $pid). Press Ctrl-C to stop it."
  trap 'echo' INT
  wait "$pid" 2>/dev/null || true
  trap - INT
else
  sleep "${DEMO_SECONDS:-5}"
fi

section "Stopping vgpud with SIGTERM"
kill -TERM "$pid" 2>/dev/null || true
rc=0; wait "$pid" || rc=$?
pid=
tail -n 5 "$log"
echo "exit code: $rc"
left=$(find "$root" -type s)
if [ -n "$left" ]; then echo "sockets left behind: $left"; exit 1; fi
echo "no sockets left behind under $root"
exit "$rc"
