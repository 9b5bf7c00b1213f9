#!/usr/bin/env bash
# Local PostgreSQL for development, tests and e2e.
#
#   scripts/pg.sh start DIR PORT [--fast]   init (if needed) + start; creates database "orders"
#   scripts/pg.sh stop DIR                  stop (ok if not running)
#   scripts/pg.sh crash DIR                 stop like a crash (immediate: recovery at the next start)
#   scripts/pg.sh status DIR                exit 0 if a server is running on DIR
#   scripts/pg.sh check                     exit 0 if the server binaries are found; else say where to get them
#   scripts/pg.sh wipe DIR                  stop and delete DIR/data (and its /tmp target, if any)
#   scripts/pg.sh url PORT [DB]             print the connection URL (DB defaults to orders)
#
# State lives in DIR/data (possibly a symlink into /tmp, see below) and DIR/postgres.log.
# --fast disables durability (fsync, synchronous_commit, full_page_writes): tests only.
# PostgreSQL refuses to run as root, so as root the server tools run as user "postgres".
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

die() { echo "pg.sh: $*" >&2; exit 1; }

usage() {
	sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2
	exit 2
}

is_root() { [ "$(id -u)" = 0 ]; }

# as_server CMD...: run CMD as the server user (postgres when we are root).
as_server() {
	if is_root; then
		# cd / so the postgres user is not stuck in an unreadable cwd (e.g. /root/...).
		(cd / && runuser -u postgres -- "$@")
	else
		"$@"
	fi
}

find_pgbin() {
	if [ -n "${PG_BIN:-}" ]; then
		[ -x "$PG_BIN/pg_ctl" ] || die "PG_BIN=$PG_BIN does not contain pg_ctl"
		echo "$PG_BIN"
	elif [ -x /usr/lib/postgresql/15/bin/pg_ctl ]; then
		echo /usr/lib/postgresql/15/bin
	elif command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v pg_ctl)"
	else
		die "PostgreSQL 15 server binaries are needed (initdb, pg_ctl, postgres): install them (Debian: apt-get install postgresql-15) so that /usr/lib/postgresql/15/bin exists, put initdb on PATH, or set PG_BIN"
	fi
}

# check_tools PGBIN: what start needs besides the server binaries, checked
# before anything is created: psql, and (as root) the postgres user to run
# the server as.
check_tools() {
	[ -x "$1/psql" ] || command -v psql >/dev/null 2>&1 ||
		die "psql is needed: it is beside pg_ctl in PostgreSQL's bin folder ($1), or install postgresql-client"
	if is_root && ! id postgres >/dev/null 2>&1; then
		die "running as root, and there is no postgres user to run the server as (PostgreSQL refuses to run as root): create one (useradd -r postgres) or run as a normal user"
	fi
}

# psql_bin: the psql beside the server binaries, else the one on PATH.
psql_bin() {
	local pgbin
	pgbin=$(find_pgbin 2>/dev/null) || true
	if [ -n "$pgbin" ] && [ -x "$pgbin/psql" ]; then echo "$pgbin/psql"; else echo psql; fi
}

# data_dir DIR: the real data directory (symlink resolved), empty if none.
data_dir() {
	local link="$1/data"
	if [ -L "$link" ]; then
		local target
		target=$(readlink -f "$link" || true)
		if [ -n "$target" ] && [ -d "$target" ]; then echo "$target"; fi
	elif [ -d "$link" ]; then
		echo "$link"
	fi
}

running() { # running PGBIN DATA
	[ -n "$2" ] && [ -f "$2/PG_VERSION" ] && as_server "$1/pg_ctl" status -D "$2" >/dev/null 2>&1
}


cmd_start() {
	[ $# -ge 2 ] || usage
	local dir port fast=0
	dir=$(abs_dir "$1")
	port="$2"
	shift 2
	for a in "$@"; do
		case "$a" in
		--fast) fast=1 ;;
		*) die "unknown option: $a" ;;
		esac
	done
	[[ "$port" =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$port'"

	local pgbin data log serverlog
	pgbin=$(find_pgbin)
	check_tools "$pgbin"
	data=$(data_dir "$dir")
	log="$dir/postgres.log"

	if running "$pgbin" "$data"; then
		ensure_db "$port" "$log"
		return 0
	fi

	if [ -z "$data" ] || [ ! -f "$data/PG_VERSION" ]; then
		init_cluster "$pgbin" "$dir"
		data=$(data_dir "$dir")
	fi

	# Log file: pg_ctl (running as the server user) must be able to write it.
	if [ -L "$dir/data" ]; then
		# DIR is not reachable by the server user: keep the log next to the data
		# and expose it at DIR/postgres.log through a symlink.
		local reallog
		reallog="$(dirname "$data")/postgres.log"
		touch "$reallog"
		if is_root; then chown postgres: "$reallog"; fi
		ln -sfn "$reallog" "$log"
		serverlog="$reallog"
	else
		touch "$log"
		if is_root; then chown postgres: "$log"; fi
		serverlog="$log"
	fi

	# Unix socket directory: the data directory itself (writable by the server
	# user); fall back to /tmp when the path would be too long for a socket.
	local sockdir="$data"
	if [ $((${#sockdir} + 20)) -gt 100 ]; then sockdir=/tmp; fi

	local opts="-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='$sockdir' -c max_connections=200"
	if [ "$fast" = 1 ]; then
		opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	fi
	# PG_OPTS: more server settings, e.g. PG_OPTS="-c log_min_duration_statement=5ms".
	if [ -n "${PG_OPTS:-}" ]; then opts="$opts $PG_OPTS"; fi

	local out
	if ! out=$(as_server "$pgbin/pg_ctl" start -D "$data" -l "$serverlog" -w -t 60 -o "$opts" 2>&1); then
		echo "$out" | tail -n 5 >&2
		log_tail "$log"
		local fatal
		fatal=$(grep -m1 -E 'FATAL|PANIC' "$serverlog" 2>/dev/null || true)
		case "$fatal" in
		*incompatible*) die "PostgreSQL failed to start (DIR=$dir, port $port): ${fatal#*FATAL:  } (a data folder of another PostgreSQL version: scripts/pg.sh wipe $dir, or make clean, starts afresh); see $log" ;;
		?*) die "PostgreSQL failed to start (DIR=$dir, port $port): ${fatal#*FATAL:  }; see $log" ;;
		esac
		die "PostgreSQL failed to start (DIR=$dir, port $port); is the port already in use? see $log"
	fi
	ensure_db "$port" "$log"
}

init_cluster() { # init_cluster PGBIN DIR
	local pgbin="$1" dir="$2" base
	rm -f "$dir/data" 2>/dev/null || true # dangling symlink from an old /tmp dir
	[ ! -e "$dir/data" ] || [ -z "$(ls -A "$dir/data")" ] || die "$dir/data exists but is not a PostgreSQL data directory"

	base="$dir"
	if is_root && ! runuser -u postgres -- test -x "$dir" 2>/dev/null; then
		# The postgres user cannot traverse to DIR (e.g. a clone under /root with
		# mode 700): keep the cluster in /tmp and point DIR/data at it.
		base=$(mktemp -d /tmp/orders-pg.XXXXXX)
		chmod 755 "$base"
		mkdir -p "$base/data"
		ln -sfn "$base/data" "$dir/data"
	else
		mkdir -p "$dir/data"
	fi
	local data
	data=$(data_dir "$dir")
	chmod 700 "$data"
	if is_root; then chown postgres: "$data"; fi

	local initlog="$base/initdb.log"
	if ! as_server "$pgbin/initdb" -D "$data" --auth=trust -U postgres -E UTF8 --locale=C --no-sync >"$initlog" 2>&1; then
		log_tail "$initlog"
		die "initdb failed for $data"
	fi
}

ensure_db() { # ensure_db PORT LOG
	local port="$1" log="$2" exists
	local -a psql=("$(psql_bin)" -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1)
	command -v "${psql[0]}" >/dev/null 2>&1 || die "psql not found beside pg_ctl or on PATH (install postgresql-client)"
	if ! exists=$("${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'orders'" 2>&1); then
		log_tail "$log"
		die "cannot connect to PostgreSQL on 127.0.0.1:$port: $exists"
	fi
	if [ "$exists" != 1 ]; then
		local out
		if ! out=$("${psql[@]}" -c "CREATE DATABASE orders" 2>&1); then
			# Lost a race with a concurrent start? Fine if it exists now.
			[ "$("${psql[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = 'orders'")" = 1 ] ||
				die "could not create database orders: $out"
		fi
	fi
}

cmd_stop() {
	[ $# -ge 1 ] || usage
	local mode=${2:-fast}
	[ -d "$1" ] || return 0
	local dir pgbin data
	dir=$(abs_dir "$1")
	data=$(data_dir "$dir")
	[ -n "$data" ] && [ -f "$data/PG_VERSION" ] || return 0
	pgbin=$(find_pgbin)
	if running "$pgbin" "$data"; then
		if ! as_server "$pgbin/pg_ctl" stop -D "$data" -m "$mode" -w -t 60 >/dev/null 2>&1; then
			log_tail "$dir/postgres.log"
			die "could not stop PostgreSQL in $data"
		fi
	fi
}

cmd_status() {
	[ $# -eq 1 ] || usage
	[ -d "$1" ] || return 1
	local dir data pgbin
	dir=$(abs_dir "$1")
	data=$(data_dir "$dir")
	# without the binaries no server of ours can be running; `check` or
	# `start` says what is missing, once
	pgbin=$(find_pgbin 2>/dev/null) || return 1
	running "$pgbin" "$data"
}

cmd_wipe() {
	[ $# -eq 1 ] || usage
	[ -d "$1" ] || return 0
	cmd_stop "$1"
	local dir target
	dir=$(abs_dir "$1")
	if [ -L "$dir/data" ]; then
		target=$(readlink "$dir/data")
		case "$target" in
		/tmp/orders-pg.*/data) rm -rf "$(dirname "$target")" ;;
		esac
		rm -f "$dir/data" "$dir/postgres.log"
	fi
	rm -rf "$dir/data" "$dir/postgres.log" "$dir/initdb.log"
}

cmd_url() {
	[ $# -ge 1 ] && [ $# -le 2 ] || usage
	echo "postgres://postgres@127.0.0.1:$1/${2:-orders}?sslmode=disable"
}

[ $# -ge 1 ] || usage
sub="$1"
shift
case "$sub" in
start) cmd_start "$@" ;;
stop) cmd_stop "$@" ;;
crash) cmd_stop "$1" immediate ;; # like a crash: no checkpoint; recovery at the next start
status) cmd_status "$@" ;;
check)
	pgbin=$(find_pgbin) || exit 1
	check_tools "$pgbin"
	;;
wipe) cmd_wipe "$@" ;;
url) cmd_url "$@" ;;
-h | --help | help) usage ;;
*) usage ;;
esac
