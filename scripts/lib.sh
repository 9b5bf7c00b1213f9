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
