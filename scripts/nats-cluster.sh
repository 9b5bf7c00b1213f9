#!/usr/bin/env bash
# A local 3-node NATS JetStream cluster (for streams at 3 replicas), from the
# same nats-server as everything else (go.mod's tool).
#
#   scripts/nats-cluster.sh start DIR BASEPORT   nodes DIR/node-{1,2,3}, client ports BASEPORT..+2,
#                                                cluster ports BASEPORT+10..+12; prints NATS_URL
#   scripts/nats-cluster.sh stop DIR [NODE]      stop every node (or just node NODE: 1, 2 or 3)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -ge 2 ] || usage

case "$1" in
start)
	dir=$2 base=${3:?BASEPORT}
	routes=""
	for i in 1 2 3; do routes="${routes:+$routes, }nats://127.0.0.1:$((base + 9 + i))"; done
	urls=""
	pids=()
	for i in 1 2 3; do
		NATS_SERVER_NAME="node-$i" NATS_CLUSTER_PORT=$((base + 9 + i)) NATS_ROUTES="$routes" \
			scripts/nats.sh start "$dir/node-$i" $((base + i - 1)) &
		pids+=($!)
		urls="${urls:+$urls,}nats://127.0.0.1:$((base + i - 1))"
	done
	for p in "${pids[@]}"; do wait "$p"; done
	echo "$urls"
	;;
stop)
	dir=$2
	for i in ${3:-1 2 3}; do scripts/nats.sh stop "$dir/node-$i"; done
	;;
*) usage ;;
esac
