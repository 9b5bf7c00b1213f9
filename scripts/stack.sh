#!/usr/bin/env bash
# Runs the whole system (PostgreSQL, NATS, api, projector, payment worker and
# the local payment provider fakepsp) in the foreground.
#
#   scripts/stack.sh run   dev stack: state in .local/run, api on :8080, projector on :8081,
#                          worker on :8082, fakepsp on :12111 (its database "fakepsp").
#                          DATABASE_URL / NATS_URL, if set, are used instead of local servers;
#                          PAYMENT_PROVIDER_URL (+ _KEY), if set, instead of fakepsp.
#                          Ctrl-C stops everything it started (and nothing else).
#                          Refuses (exit 1, one line) if a stack already runs in its
#                          folder or any of its ports is taken.
#   scripts/stack.sh e2e   fresh stack in .local/e2e (api :18080, projector :18081, worker
#                          :18082, fakepsp :12121), runs
#                          api.http with httpyac against it, then README.md's shell blocks
#                          (scripts/readme.sh), stops everything, exits non-zero if either failed.
# STACK_DIR, PG_PORT, NATS_PORT, API_PORT, PROJECTOR_PORT, WORKER_PORT and
# FAKEPSP_PORT override the state
# folder and the ports of either mode (e.g. to run a second stack beside the first).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT"

MODE="${1:-}"
case "$MODE" in
run)
	STATE=.local/run PG_PORT=${PG_PORT:-54329} NATS_PORT=${NATS_PORT:-14222}
	API_PORT=${API_PORT:-8080} PROJ_PORT=${PROJECTOR_PORT:-8081}
	WORKER_PORT=${WORKER_PORT:-8082} PSP_PORT=${FAKEPSP_PORT:-12111}
	;;
e2e)
	STATE=.local/e2e PG_PORT=${PG_PORT:-54339} NATS_PORT=${NATS_PORT:-14232}
	API_PORT=${API_PORT:-18080} PROJ_PORT=${PROJECTOR_PORT:-18081}
	WORKER_PORT=${WORKER_PORT:-18082} PSP_PORT=${FAKEPSP_PORT:-12121}
	unset DATABASE_URL NATS_URL PAYMENT_PROVIDER_URL PAYMENT_PROVIDER_KEY # e2e always uses its own servers
	;;
*)
	sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
for p in "$PG_PORT" "$NATS_PORT" "$API_PORT" "$PROJ_PORT" "$WORKER_PORT" "$PSP_PORT"; do
	[[ "$p" =~ ^[0-9]+$ ]] || { echo "stack: ports must be numbers, got '$p'" >&2; exit 2; }
done
STATE="${STACK_DIR:-$ROOT/$STATE}"

# ---- what must be installed (before anything is created or started) ---------
GO_WANT=$(sed -n 's/^go //p' go.mod)
command -v go >/dev/null 2>&1 || { echo "stack: go not found on PATH: the services are built from source with Go $GO_WANT or later (https://go.dev/dl)" >&2; exit 1; }
command -v flock >/dev/null 2>&1 || { echo "stack: flock (util-linux) is needed" >&2; exit 1; }
command -v curl >/dev/null 2>&1 || { echo "stack: curl is needed (it asks each service whether it is ready)" >&2; exit 1; }
if [ "$MODE" = e2e ]; then command -v npx >/dev/null 2>&1 || { echo "stack: npx (Node.js 18 or later) is needed: e2e sends api.http with httpyac" >&2; exit 1; }; fi
if [ -z "${DATABASE_URL:-}" ]; then scripts/pg.sh check || exit 1; fi
# NEW_STATE: this run creates the folder (judged on the path as resolved, so
# new/.. is not new), so a run that starts nothing while it holds the
# folder's lock (a refusal, a missing tool) removes it again and leaves no
# trace. A run that never got the lock removes nothing: the folder is the
# other run's.
NEW_STATE=0
if resolved=$(realpath -m -- "$STATE" 2>/dev/null) && [ ! -e "$resolved" ]; then NEW_STATE=1; fi
STATE=$(abs_dir "$STATE")
if [ "$NEW_STATE" = 1 ] && [ "$STATE" != "$resolved" ]; then NEW_STATE=0; fi
BIN="$STATE/bin" # per stack, so two stacks never rebuild each other's binaries
READY_TIMEOUT="${READY_TIMEOUT:-60}"

say() { echo "stack: $*" >&2; }

# SHOWN_STATE: the state folder as the user knows it (relative to the project).
SHOWN_STATE=${STATE#"$ROOT"/}

# ---- cleanup: stop everything we started, in reverse order ----------------
STARTED_PG=0 STARTED_NATS=0 PG_RUNNING=0 NATS_RUNNING=0 API_PID="" PROJ_PID="" WORKER_PID="" PSP_PID="" TAIL_PIDS=()
# RUN_PSP: start the local provider (unless PAYMENT_PROVIDER_URL names another)
RUN_PSP=1
if [ -n "${PAYMENT_PROVIDER_URL:-}" ]; then RUN_PSP=0; fi
CLEANED=0 LOCKED=0

stop_proc() { # stop_proc NAME PID
	local name="$1" pid="$2" i
	[ -n "$pid" ] || return 0
	kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
	kill -TERM "$pid" 2>/dev/null || true
	# Up to 35 s for a graceful shutdown: a payment worker finishes the
	# intents in hand for up to 30 s (settle.DefaultShutdownTimeout).
	for i in $(seq 1 350); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	if kill -0 "$pid" 2>/dev/null; then
		say "$name (pid $pid) did not stop within 35s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	wait "$pid" 2>/dev/null || true
}

cleanup() {
	local rc=$?
	[ "$CLEANED" = 0 ] || return 0
	CLEANED=1
	trap '' INT TERM # finish cleaning up even if Ctrl-C is pressed again
	if [ -n "$PROJ_PID$API_PID$WORKER_PID$PSP_PID" ] || [ "$STARTED_NATS$STARTED_PG" != 00 ]; then
		say "stopping..."
	fi
	stop_proc worker "$WORKER_PID"
	stop_proc projector "$PROJ_PID"
	stop_proc api "$API_PID"
	stop_proc fakepsp "$PSP_PID"
	# log printers (tail --pid) end by themselves shortly after their service;
	# give them a moment to flush the last lines, then stop their groups.
	local p i
	for p in ${TAIL_PIDS[@]+"${TAIL_PIDS[@]}"}; do
		for i in $(seq 1 20); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
		kill -TERM -- "-$p" 2>/dev/null || true
		wait "$p" 2>/dev/null || true
	done
	if [ "$STARTED_NATS" = 1 ]; then
		if scripts/nats.sh stop "$STATE"; then say "NATS stopped"; else rc=1; fi
	elif [ "$NATS_RUNNING" = 1 ]; then
		say "the NATS server an earlier run left stays running (scripts/nats.sh stop $SHOWN_STATE stops it)"
	fi
	if [ "$STARTED_PG" = 1 ]; then
		if scripts/pg.sh stop "$STATE"; then say "PostgreSQL stopped"; else rc=1; fi
	elif [ "$PG_RUNNING" = 1 ]; then
		say "the PostgreSQL an earlier run left stays running (scripts/pg.sh stop $SHOWN_STATE stops it)"
	fi
	if [ "$LOCKED" = 1 ]; then rm -f "$STATE/stack.info"; fi
	if [ "$NEW_STATE$LOCKED" = 11 ] && [ "$STARTED_PG$STARTED_NATS" = 00 ] && [ -z "$PROJ_PID$API_PID$WORKER_PID$PSP_PID" ]; then
		rm -rf "$STATE"
	fi
	exit "$rc"
}
trap cleanup EXIT
if [ "$MODE" = run ]; then
	trap 'exit 0' INT TERM # stopping `make run` is the normal way to end it
else
	trap 'exit 130' INT
	trap 'exit 143' TERM
fi


# ---- one stack per folder --------------------------------------------------
# The lock on $STATE/stack.lock is held (fd 9) for as long as this script runs;
# the processes it starts do not inherit it (9>&-), so a leftover server never
# holds it. stack.info tells a second invocation where the first one answers.
exec 9>>"$STATE/stack.lock"
if ! flock -n 9; then
	read -r other_pid other_api other_proj _ 2>/dev/null <"$STATE/stack.info" || true
	if [ -n "${other_pid:-}" ]; then
		say "a stack is already running from $SHOWN_STATE (pid $other_pid): api http://localhost:$other_api, projector http://localhost:$other_proj; use it, or stop it with Ctrl-C in its terminal (or kill $other_pid)"
	else
		say "a stack is already starting or running from $SHOWN_STATE; use it, or stop it with Ctrl-C in its terminal"
	fi
	exit 1
fi
LOCKED=1
echo "$$ $API_PORT $PROJ_PORT" >"$STATE/stack.info"

# ---- state ----------------------------------------------------------------
if [ "$MODE" = e2e ]; then
	# fresh state every time; stop leftovers from an interrupted run first
	scripts/nats.sh stop "$STATE" || true
	scripts/pg.sh wipe "$STATE" || true
	find "$STATE" -mindepth 1 -maxdepth 1 ! -name stack.lock ! -name stack.info -exec rm -rf {} +
fi
mkdir -p "$BIN"

# ---- ports: refuse before starting anything if one is taken -----------------
# Servers of this folder left running by an earlier, killed run are used (and
# left running on exit), so their ports do not count as taken.
PG_RUNNING=0 NATS_RUNNING=0
if [ -z "${DATABASE_URL:-}" ] && scripts/pg.sh status "$STATE"; then PG_RUNNING=1; fi
if [ -z "${NATS_URL:-}" ] && scripts/nats.sh status "$STATE"; then NATS_RUNNING=1; fi
# A leftover server listens where the earlier run put it: reusing it under
# another port would connect to nothing.
if [ "$PG_RUNNING" = 1 ]; then
	left=$(sed -n 4p "$STATE/data/postmaster.pid" 2>/dev/null || true)
	if [ -n "$left" ] && [ "$left" != "$PG_PORT" ]; then
		say "the PostgreSQL left running in $SHOWN_STATE by an earlier run listens on $left, not PG_PORT=$PG_PORT: run with PG_PORT=$left, or stop it first (scripts/pg.sh stop $SHOWN_STATE)"
		exit 1
	fi
fi
if [ "$NATS_RUNNING" = 1 ]; then
	left=$(sed -n 's/^listen: 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$STATE/nats.conf" 2>/dev/null || true)
	if [ -n "$left" ] && [ "$left" != "$NATS_PORT" ]; then
		say "the NATS server left running in $SHOWN_STATE by an earlier run listens on $left, not NATS_PORT=$NATS_PORT: run with NATS_PORT=$left, or stop it first (scripts/nats.sh stop $SHOWN_STATE)"
		exit 1
	fi
fi
busy=() leftover=() own_ports=0
check_port() { # check_port PORT WHAT: add PORT to busy if something listens there
	port_in_use "$1" || return 0
	local pids pid exe
	pids=$(listener_pids "$1" | paste -sd, -)
	busy+=("$1 ($2${pids:+, held by pid $pids})")
	# a service this folder's stack built and started, left running when that
	# run was killed (kill -9 gives it no chance to stop them)
	local own=0
	for pid in ${pids//,/ }; do
		exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
		case "$exe" in "$BIN"/*) leftover+=("$pid"); own=1 ;; esac
	done
	own_ports=$((own_ports + own))
}
check_port "$API_PORT" api
check_port "$PROJ_PORT" projector
check_port "$WORKER_PORT" worker
if [ "$RUN_PSP" = 1 ]; then check_port "$PSP_PORT" fakepsp; fi
if [ -z "${DATABASE_URL:-}" ] && [ "$PG_RUNNING" = 0 ]; then check_port "$PG_PORT" PostgreSQL; fi
if [ -z "${NATS_URL:-}" ] && [ "$NATS_RUNNING" = 0 ]; then check_port "$NATS_PORT" NATS; fi
if [ ${#busy[@]} -gt 0 ]; then
	list=$(printf ', %s' "${busy[@]}")
	list=${list#, }
	if [ ${#busy[@]} = 1 ]; then what="port $list is"; else what="ports $list are"; fi
	if [ ${#leftover[@]} -gt 0 ] && [ "$own_ports" = ${#busy[@]} ]; then
		say "$what held by services an earlier run from $SHOWN_STATE left running (it was killed before it could stop them): stop them with \`kill ${leftover[*]}\`, then run again"
		exit 1
	fi
	hint=""
	if port_in_use "$API_PORT"; then hint=" (if it is another stack, its api is http://localhost:$API_PORT)"; fi
	if [ ${#leftover[@]} -gt 0 ]; then hint="$hint (pids ${leftover[*]} were left running by an earlier run from $SHOWN_STATE: kill them)"; fi
	say "$what already in use$hint; stop it (Ctrl-C in the terminal of that \`make run\`, or kill the pid) or choose free ports with API_PORT, PROJECTOR_PORT, WORKER_PORT, FAKEPSP_PORT, PG_PORT, NATS_PORT"
	exit 1
fi

# ---- infrastructure -------------------------------------------------------
if [ -z "${DATABASE_URL:-}" ]; then
	if [ "$PG_RUNNING" = 1 ]; then
		say "using the PostgreSQL already running in $SHOWN_STATE (left by an earlier run; it stays running after this one; scripts/pg.sh stop $SHOWN_STATE stops it)"
		scripts/pg.sh start "$STATE" "$PG_PORT" 9>&- # only makes sure database "orders" exists
	else
		say "starting PostgreSQL on 127.0.0.1:$PG_PORT ($SHOWN_STATE)"
		STARTED_PG=1
		if [ "$MODE" = e2e ]; then
			scripts/pg.sh start "$STATE" "$PG_PORT" --fast 9>&-
		else
			scripts/pg.sh start "$STATE" "$PG_PORT" 9>&-
		fi
	fi
	DATABASE_URL=$(scripts/pg.sh url "$PG_PORT")
else
	say "using DATABASE_URL from the environment"
fi
if [ -z "${NATS_URL:-}" ]; then
	if [ "$NATS_RUNNING" = 1 ]; then
		say "using the NATS server already running in $SHOWN_STATE (left by an earlier run; it stays running after this one; scripts/nats.sh stop $SHOWN_STATE stops it)"
	else
		say "starting NATS on 127.0.0.1:$NATS_PORT"
		STARTED_NATS=1
		scripts/nats.sh start "$STATE" "$NATS_PORT" 9>&-
	fi
	NATS_URL=$(scripts/nats.sh url "$NATS_PORT")
else
	say "using NATS_URL from the environment"
fi
export DATABASE_URL NATS_URL
export HTTP_ADDR=":$API_PORT" PROJECTOR_HTTP_ADDR="127.0.0.1:$PROJ_PORT" WORKER_HTTP_ADDR="127.0.0.1:$WORKER_PORT"
if [ "$RUN_PSP" = 1 ]; then
	export FAKEPSP_ADDR="127.0.0.1:$PSP_PORT" PAYMENT_PROVIDER_URL="http://127.0.0.1:$PSP_PORT" PAYMENT_PROVIDER_KEY=sk_test_local
fi
# readable logs in the terminal; e2e keeps JSON in its log files
if [ "$MODE" = run ]; then export LOG_FORMAT="${LOG_FORMAT:-text}"; fi

# ---- build ----------------------------------------------------------------
say "building ./cmd/api, ./cmd/projector, ./cmd/worker and ./cmd/fakepsp"
go build -o "$BIN/api" ./cmd/api
go build -o "$BIN/projector" ./cmd/projector
go build -o "$BIN/worker" ./cmd/worker
go build -o "$BIN/fakepsp" ./cmd/fakepsp

# ---- services -------------------------------------------------------------
# start_svc NAME: runs $BIN/NAME in its own session (so Ctrl-C reaches only this
# script, which then stops things in order) with output to $STATE/NAME.log.
# In run mode the log is also echoed to the terminal with a [NAME] prefix.
# Sets SVC_PID.
start_svc() {
	local name="$1" log="$STATE/$1.log"
	: >"$log"
	setsid "$BIN/$name" >>"$log" 2>&1 </dev/null 9>&- &
	SVC_PID=$!
	if [ "$MODE" = run ]; then
		# own process group, so cleanup can stop tail and sed together
		setsid bash -c 'tail -n +1 -F --pid="$1" "$2" 2>/dev/null | sed -u "s/^/[$3] /"' \
			printer "$SVC_PID" "$log" "$name" </dev/null 9>&- &
		TAIL_PIDS+=("$!")
	fi
}

# died NAME PID: if PID has exited, report it and return 0.
died() {
	local name="$1" pid="$2" st=0
	kill -0 "$pid" 2>/dev/null && return 1
	wait "$pid" 2>/dev/null || st=$?
	say "$name exited unexpectedly (status $st)"
	log_tail "$STATE/$name.log" 40
	return 0
}

# answered_by_us PID PORT: exit 0 if PID is what listens on PORT (when ss can
# tell; otherwise if PID is still alive).
answered_by_us() {
	local pids
	pids=$(listener_pids "$2")
	if [ -z "$pids" ]; then kill -0 "$1" 2>/dev/null; else grep -qx "$1" <<<"$pids"; fi
}

# wait_ready NAME PID PORT [PATH]: wait until PID answers 200 on PORT/PATH
# (default /readyz).
wait_ready() {
	local name="$1" pid="$2" port="$3" deadline=$((SECONDS + READY_TIMEOUT))
	local url="http://127.0.0.1:$port${4:-/readyz}"
	until curl -fsS -o /dev/null -m 2 "$url" 2>/dev/null && answered_by_us "$pid" "$port"; do
		if died "$name" "$pid"; then
			case "$name" in
			api) API_PID="" ;; projector) PROJ_PID="" ;; worker) WORKER_PID="" ;; fakepsp) PSP_PID="" ;;
			esac
			say "$name died during start-up"
			exit 1
		fi
		if [ $SECONDS -ge $deadline ]; then
			log_tail "$STATE/$name.log" 40
			say "$name did not become ready ($url != 200) within ${READY_TIMEOUT}s"
			exit 1
		fi
		sleep 0.3
	done
}


if [ "$RUN_PSP" = 1 ]; then
	say "starting fakepsp, the local payment provider (FAKEPSP_ADDR=$FAKEPSP_ADDR, database fakepsp)"
	start_svc fakepsp
	PSP_PID=$SVC_PID
	wait_ready fakepsp "$PSP_PID" "$PSP_PORT" /healthz
else
	say "using PAYMENT_PROVIDER_URL from the environment"
fi
say "starting api (HTTP_ADDR=$HTTP_ADDR), projector (PROJECTOR_HTTP_ADDR=$PROJECTOR_HTTP_ADDR) and worker (WORKER_HTTP_ADDR=$WORKER_HTTP_ADDR)"
start_svc api
API_PID=$SVC_PID
start_svc projector
PROJ_PID=$SVC_PID
start_svc worker
WORKER_PID=$SVC_PID

wait_ready api "$API_PID" "$API_PORT"
wait_ready projector "$PROJ_PID" "$PROJ_PORT"
wait_ready worker "$WORKER_PID" "$WORKER_PORT"

# ---- a dev token: created on first start, kept in $STATE/dev-token ----------
# (re-created if the database it was made for is gone, e.g. another DATABASE_URL)
TOKEN_FILE="$STATE/dev-token"
# How `make http` finds this stack when it is not the default one.
HTTP_ARGS=""
if [ -n "${STACK_DIR:-}" ]; then HTTP_ARGS+=" STACK_DIR=$STACK_DIR"; fi
if [ "$API_PORT" != 8080 ]; then HTTP_ARGS+=" API_PORT=$API_PORT"; fi
token_works() {
	[ -s "$TOKEN_FILE" ] || return 1
	local code
	code=$(curl -s -o /dev/null -w '%{http_code}' -m 5 -H "Authorization: Bearer $(cat "$TOKEN_FILE")" \
		"http://127.0.0.1:$API_PORT/v1/idempotency-keys/token-check")
	[ "$code" != 401 ]
}
if ! token_works; then
	"$BIN/api" token create -tenant dev -name "make $MODE" >"$TOKEN_FILE.new"
	mv "$TOKEN_FILE.new" "$TOKEN_FILE"
	chmod 600 "$TOKEN_FILE"
	say "created a dev token for tenant 'dev' in $TOKEN_FILE"
fi
TOKEN=$(cat "$TOKEN_FILE")

# ---- e2e: run api.http, then the README's shell blocks; exit non-zero if one failed
if [ "$MODE" = e2e ]; then
	say "stack ready; running api.http with httpyac against http://127.0.0.1:$API_PORT"
	st=0
	npx --yes httpyac@6 send api.http --all --var "baseUrl=http://127.0.0.1:$API_PORT" --var "token=$TOKEN" || st=$?
	if [ "$st" != 0 ]; then
		say "httpyac failed (status $st)"
	else
		# the README's shell blocks, against the same stack, so it cannot drift from the code
		scripts/readme.sh "http://127.0.0.1:$API_PORT" "$TOKEN_FILE" README.md 9>&- || st=$?
		if [ "$st" != 0 ]; then say "README.md's shell blocks failed (status $st)"; fi
	fi
	if [ "$st" != 0 ]; then
		say "service logs are in $STATE"
		log_tail "$STATE/api.log" 40
		log_tail "$STATE/projector.log" 40
		log_tail "$STATE/worker.log" 40
		if [ "$RUN_PSP" = 1 ]; then log_tail "$STATE/fakepsp.log" 40; fi
	else
		say "e2e passed"
	fi
	exit "$st"
fi

# ---- run: banner, then wait until Ctrl-C or a service dies -------------------
PSP_LINE=""
if [ "$RUN_PSP" = 1 ]; then
	PSP_LINE="    fakepsp    http://localhost:$PSP_PORT   (log: $STATE/fakepsp.log; ledger: curl localhost:$PSP_PORT/_ledger)
"
fi
# A shell that starts a job in the background without job control makes it
# ignore SIGINT, and a signal ignored at start cannot be trapped: say so.
STOP_LINE="Ctrl-C stops everything this run started."
if [ $(( 0x$(awk '/^SigIgn:/ {print $2}' /proc/$$/status 2>/dev/null || echo 0) & 2 )) -ne 0 ]; then
	STOP_LINE="This run ignores Ctrl-C (its shell started it in the background): kill $$ stops everything it started."
fi
cat >&2 <<BANNER

==> orders stack is up
    api        http://localhost:$API_PORT   (log: $STATE/api.log)
    projector  http://localhost:$PROJ_PORT   (log: $STATE/projector.log)
    worker     http://localhost:$WORKER_PORT   (log: $STATE/worker.log; payments go to $PAYMENT_PROVIDER_URL)
${PSP_LINE}    DATABASE_URL=$DATABASE_URL
    NATS_URL=$NATS_URL

Your dev token (tenant 'dev', kept in $TOKEN_FILE):
    export TOKEN=$TOKEN

Try it:
    curl -i -X POST localhost:$API_PORT/v1/orders -H "Authorization: Bearer \$TOKEN" -H 'Idempotency-Key: demo-1' -H 'Content-Type: application/json' -d '{"customer_id":"c-1","currency":"EUR","items":[{"sku":"sku-1","quantity":2,"unit_price":1250}]}'
or, in another terminal:
    make http$HTTP_ARGS

Another tenant's token (the api's CLI on this stack's database):
    DATABASE_URL='$DATABASE_URL' go run ./cmd/api token create -tenant NAME

Dead letters (the projector's and the worker's CLIs on this stack; the worker's asks this stack's provider):
    DATABASE_URL='$DATABASE_URL' go run ./cmd/projector dead-letters list
    DATABASE_URL='$DATABASE_URL' PAYMENT_PROVIDER_URL='$PAYMENT_PROVIDER_URL' go run ./cmd/worker dead-letters list

$STOP_LINE

BANNER

while :; do
	if died api "$API_PID"; then API_PID=""; exit 1; fi
	if died projector "$PROJ_PID"; then PROJ_PID=""; exit 1; fi
	if died worker "$WORKER_PID"; then WORKER_PID=""; exit 1; fi
	if [ -n "$PSP_PID" ] && died fakepsp "$PSP_PID"; then PSP_PID=""; exit 1; fi
	sleep 1 &
	wait $! || true
done
