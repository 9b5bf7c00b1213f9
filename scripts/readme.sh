#!/usr/bin/env bash
# Runs the shell blocks of a README, top to bottom, as one script, so the
# README cannot drift from the code (make e2e runs it against its stack).
#
#   scripts/readme.sh BASE_URL TOKEN_FILE [README]   run the blocks (default README: the project's)
#   scripts/readme.sh -print [README]                print the script it would run
#
# A runnable block is a fenced block whose info string starts with "sh"; a
# block marked "```sh no-run" is shown to readers but skipped here (starting
# servers such as `make run`, or commands that need state a fresh stack does
# not have). Other fences (```json, plain ```) are skipped too.
#
# The blocks run in the README's folder, in ONE bash process with
# `set -euo pipefail`, so variables set by an earlier block are seen by later
# ones (as in a terminal where a reader pastes them in order), and the first
# failing command, pipeline or unset variable stops the run with a non-zero
# status. BASE_URL and TOKEN_FILE are exported for the blocks, which default
# them to `make run`'s (http://localhost:8080, .local/run/dev-token). On a
# failure it names the README line that failed and prints it. The whole run
# is stopped after README_TIMEOUT seconds (default 300; the project's README
# takes a few), so a block that starts a server without no-run cannot hang CI.
set -euo pipefail

usage() { sed -n '5,6p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
PRINT=0
if [ "${1:-}" = -print ]; then
	PRINT=1
	shift
	[ $# -le 1 ] || usage
else
	[ $# -ge 2 ] && [ $# -le 3 ] || usage
	export BASE_URL="$1" TOKEN_FILE="$2"
	shift 2
fi
README="${1:-$ROOT/README.md}"
README_TIMEOUT="${README_TIMEOUT:-300}"
[[ "$README_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "readme: README_TIMEOUT must be a number of seconds, got '$README_TIMEOUT'" >&2; exit 2; }
[ -r "$README" ] || { echo "readme: cannot read $README" >&2; exit 2; }

# extract: line N of the output is line N of the README if it belongs to a
# runnable block, else empty; so bash's $LINENO is the README's line number.
# Line 1 (a heading in any README worth running) carries the prelude: strict
# mode, and a report of the README line that failed.
extract() {
	awk -v prelude="$1" '
		NR == 1 { print prelude; if ($0 ~ /^```/) { print "readme: line 1 opens a block; start the README with text" > "/dev/stderr"; exit 3 } next }
		!open && /^```/ {
			open = 1; opened = NR
			info = substr($0, 4)
			run = (info ~ /^sh([ \t]|$)/ && info !~ /(^|[ \t])no-run([ \t]|$)/)
			print ""; next
		}
		open && /^```[ \t]*$/ { open = 0; print ""; next }
		{ print (open && run) ? $0 : "" }
		END { if (open) { print "readme: the block opened on line " opened " is never closed" > "/dev/stderr"; exit 3 } }
	' "$README"
}

# The prelude, on line 1: strict mode; remember the line of each command (not
# line 1: that is the prelude and the EXIT trap itself); on a non-zero exit
# name that line and print it.
NAME=$(basename "$README")
PRELUDE='set -euo pipefail; README_LINE=0; trap '\''[ "$LINENO" = 1 ] || README_LINE=$LINENO'\'' DEBUG; trap '\''rc=$?; if [ "$rc" != 0 ]; then echo "readme: '"$NAME"':$README_LINE failed (status $rc): $(sed -n "${README_LINE}p" "$README_FILE")" >&2; fi'\'' EXIT'

if [ "$PRINT" = 1 ]; then
	extract "$PRELUDE"
	exit 0
fi

for tool in curl timeout; do
	command -v "$tool" >/dev/null 2>&1 || { echo "readme: $tool is needed" >&2; exit 1; }
done
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
extract "$PRELUDE" >"$TMP/readme-blocks.sh"
cd "$(dirname "$README")"
echo "readme: running the shell blocks of $README against $BASE_URL" >&2
# timeout signals the blocks' whole process group (a `make run` stops itself)
st=0
README_FILE="$(pwd -P)/$NAME" timeout -k 15 "$README_TIMEOUT" bash "$TMP/readme-blocks.sh" </dev/null || st=$?
if [ "$st" = 124 ] || [ "$st" = 137 ]; then
	echo "readme: the blocks of $NAME did not finish within README_TIMEOUT=${README_TIMEOUT}s; a block that starts a server must be marked no-run" >&2
fi
[ "$st" = 0 ] || exit "$st"
echo "readme: every shell block of $NAME ran" >&2
