#!/usr/bin/env bash
# Makes docs/dashboard.png from a real run (make dashboard-png):
#   1. starts a stack (scripts/stack.sh run) in $DASH_DIR on ports 56300–56320,
#   2. starts Prometheus scraping its api, projector and worker every 2 s,
#   3. puts ~${LOAD_DURATION:-90s} of orders load on it through package client
#      (creates, pays, reads, ships, cancels; go run ./scripts/dashshot load),
#   4. evaluates every panel of docs/grafana-dashboard.json over the run with
#      Prometheus's query_range API into HTML (dashshot render), and
#   5. screenshots that with headless Chromium, re-encoded with a 256-colour
#      palette (dashshot shrink) into docs/dashboard.png.
# Needs: prometheus (PROMETHEUS, default: on PATH or in $(go env GOPATH)/bin;
#   go install -tags remove_all_sd github.com/prometheus/prometheus/cmd/prometheus@v0.316.0)
#   and chromium (CHROMIUM; apt-get install chromium).
# Stops everything it started on exit.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"

DIR=$(abs_dir "${DASH_DIR:-/tmp/dash-stack}")
OUT=${OUT:-docs/dashboard.png}
BASE=${DASH_PORT_BASE:-56300}
export PG_PORT=$((BASE + 1)) NATS_PORT=$((BASE + 2)) API_PORT=$((BASE + 10)) PROJECTOR_PORT=$((BASE + 11))
export WORKER_PORT=$((BASE + 12)) FAKEPSP_PORT=$((BASE + 13))
PROM_PORT=$((BASE + 20))
PROMETHEUS=${PROMETHEUS:-$(command -v prometheus || echo "$(go env GOPATH)/bin/prometheus")}
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || echo chromium)}
[ -x "$PROMETHEUS" ] || { echo "dashboard-png: no prometheus at $PROMETHEUS (see the header of $0)" >&2; exit 1; }
command -v "$CHROMIUM" >/dev/null || { echo "dashboard-png: no chromium ($CHROMIUM; apt-get install chromium)" >&2; exit 1; }

say() { echo "dashboard-png: $*" >&2; }
STACK_PID="" PROM_PID=""
cleanup() {
	local rc=$?
	if [ -n "$PROM_PID" ]; then kill -TERM "$PROM_PID" 2>/dev/null || true; wait "$PROM_PID" 2>/dev/null || true; fi
	# TERM, not INT: a background job of a non-interactive shell ignores SIGINT.
	if [ -n "$STACK_PID" ]; then kill -TERM "$STACK_PID" 2>/dev/null || true; wait "$STACK_PID" 2>/dev/null || true; fi
	exit "$rc"
}
trap cleanup EXIT INT TERM

say "building the tool"
go build -o "$DIR/dashshot" ./scripts/dashshot

say "starting the stack in $DIR/stack (api :$API_PORT, projector :$PROJECTOR_PORT, worker :$WORKER_PORT)"
STACK_DIR="$DIR/stack" scripts/stack.sh run >"$DIR/stack.log" 2>&1 &
STACK_PID=$!
for _ in $(seq 1 240); do
	grep -q "orders stack is up" "$DIR/stack.log" 2>/dev/null && break
	kill -0 "$STACK_PID" 2>/dev/null || { log_tail "$DIR/stack.log"; exit 1; }
	sleep 0.5
done
grep -q "orders stack is up" "$DIR/stack.log" || { log_tail "$DIR/stack.log"; exit 1; }

cat >"$DIR/prometheus.yml" <<YML
global: {scrape_interval: 2s, evaluation_interval: 2s}
scrape_configs:
  - {job_name: api, static_configs: [{targets: ['127.0.0.1:$API_PORT']}]}
  - {job_name: projector, static_configs: [{targets: ['127.0.0.1:$PROJECTOR_PORT']}]}
  - {job_name: worker, static_configs: [{targets: ['127.0.0.1:$WORKER_PORT']}]}
YML
rm -rf "$DIR/prom"
say "starting Prometheus on :$PROM_PORT"
"$PROMETHEUS" --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/prom" \
	--web.listen-address="127.0.0.1:$PROM_PORT" >"$DIR/prometheus.log" 2>&1 &
PROM_PID=$!
for _ in $(seq 1 60); do
	curl -fs "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 && break
	sleep 0.5
done
curl -fs "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null || { log_tail "$DIR/prometheus.log"; exit 1; }

START=$(date +%s)
sleep 10 # a quiet start
say "load for ${LOAD_DURATION:-90s}"
"$DIR/dashshot" load -api "http://127.0.0.1:$API_PORT" -token "$(cat "$DIR/stack/dev-token")" -duration "${LOAD_DURATION:-90s}"
sleep 15 # the tail: rates fall back, lag drains
END=$(date +%s)

say "rendering"
"$DIR/dashshot" render -prom "http://127.0.0.1:$PROM_PORT" -start "$START" -end "$END" -out "$DIR/dashboard.html"
H=$(grep -o 'height:[0-9]*px;position:relative' "$DIR/dashboard.html" | grep -o '[0-9]*')
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
	--disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$DIR/chromium" \
	--window-size="1600,$H" --screenshot="$DIR/screenshot.png" "file://$DIR/dashboard.html" >"$DIR/chromium.log" 2>&1 ||
	{ log_tail "$DIR/chromium.log"; exit 1; }
"$DIR/dashshot" shrink -in "$DIR/screenshot.png" -out "$ROOT/$OUT"
say "wrote $OUT ($(wc -c <"$ROOT/$OUT") bytes)"
