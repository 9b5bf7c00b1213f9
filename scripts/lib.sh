# Helpers shared by the scripts in this folder; source it, do not run it:
#   . "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# abs_dir DIR: create DIR if needed and print its absolute, physical path.
abs_dir() { mkdir -p "$1" && (cd "$1" && pwd -P); }

# log_tail FILE [LINES]: show the end of a log on stderr, if it is there.
log_tail() {
	if [ -r "$1" ]; then
		echo "---- last lines of $1 ----" >&2
		tail -n "${2:-30}" "$1" >&2 || true
		echo "----" >&2
	fi
}

# port_in_use PORT: exit 0 if something listens on TCP PORT (any address).
port_in_use() {
	if command -v ss >/dev/null 2>&1; then
		[ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]
	else
		(exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
	fi
}

# listener_pids PORT: print the pids of the processes listening on TCP PORT,
# one per line (nothing if ss is missing or cannot tell).
listener_pids() {
	command -v ss >/dev/null 2>&1 || return 0
	ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u
}
