#!/usr/bin/env bash
# Makes docs/dashboard.png from a real run: starts a stack (scripts/stack.sh run)
# in .local/dashshot on ports of its own, drives and scrapes it with
# cmd/dashshot for DURATION (default 90s), renders the dashboard's panels,
# then stops the stack (always, also on failure or Ctrl-C).
# STACK_DIR, API_PORT, PROJECTOR_PORT, WORKER_PORT, FAKEPSP_PORT, PG_PORT and
# NATS_PORT override the state folder and the ports; DURATION and RATE
# (journeys/s) the load; OUT the picture (default docs/dashboard.png).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"

export STACK_DIR=$(abs_dir "${STACK_DIR:-$ROOT/.local/dashshot}")
export API_PORT=${API_PORT:-18180} PROJECTOR_PORT=${PROJECTOR_PORT:-18181} WORKER_PORT=${WORKER_PORT:-18182}
export FAKEPSP_PORT=${FAKEPSP_PORT:-12141} PG_PORT=${PG_PORT:-54359} NATS_PORT=${NATS_PORT:-14252}
# always its own PostgreSQL, NATS and fakepsp, whatever the environment says
unset DATABASE_URL NATS_URL PAYMENT_PROVIDER_URL PAYMENT_PROVIDER_KEY
READY_TIMEOUT=${READY_TIMEOUT:-180}

say() { echo "dashboard-png: $*" >&2; }

LOG="$STACK_DIR/stack.out"
: >"$LOG"
say "starting a stack in ${STACK_DIR#"$ROOT"/} (api :$API_PORT; its output in ${LOG#"$ROOT"/})"
scripts/stack.sh run >"$LOG" 2>&1 </dev/null &
STACK_PID=$!
stop_stack() {
	local rc=$?
	trap '' INT TERM
	if kill -0 "$STACK_PID" 2>/dev/null; then
		say "stopping the stack"
		kill -TERM "$STACK_PID" 2>/dev/null || true
	fi
	wait "$STACK_PID" 2>/dev/null || true
	exit "$rc"
}
trap stop_stack EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

deadline=$((SECONDS + READY_TIMEOUT))
until grep -q 'orders stack is up' "$LOG"; do
	if ! kill -0 "$STACK_PID" 2>/dev/null; then
		log_tail "$LOG" 40
		say "the stack did not start"
		exit 1
	fi
	if [ $SECONDS -ge $deadline ]; then
		log_tail "$LOG" 40
		say "the stack was not up within ${READY_TIMEOUT}s"
		exit 1
	fi
	sleep 0.5
done

go run ./cmd/dashshot \
	-api "http://127.0.0.1:$API_PORT" -projector "http://127.0.0.1:$PROJECTOR_PORT" \
	-worker "http://127.0.0.1:$WORKER_PORT" -token-file "$STACK_DIR/dev-token" \
	-duration "${DURATION:-90s}" ${RATE:+-rate "$RATE"} -out "${OUT:-docs/dashboard.png}"
