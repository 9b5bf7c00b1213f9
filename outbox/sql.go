package outbox

// The relay's SQL, in one place: the relay runs these statements, and
// internal/bench renders the claim and the mark into the pgbench script that
// measures the database ceiling of a relay batch, so the two cannot drift.
const (
	// PartitionsTakeSQL takes up to $3 of the partitions $1, in order,
	// whose advisory lock ($2, partition) is free.
	PartitionsTakeSQL = `
SELECT p::smallint FROM unnest($1::int[]) AS p
WHERE pg_try_advisory_lock($2, p)
LIMIT $3`

	// PartitionsSurveySQL reads which of the partitions 0…$1-1 nobody
	// holds the advisory lock ($2, partition) of in this database, and
	// whether another session that ran a statement in the last $4 seconds
	// holds the shared lock ($3, 0) of a worker that wants more. pg_locks
	// shows another database's advisory locks too (the same keys, other
	// outboxes): they are not ours. A session that has run nothing for
	// that long (its process frozen, its host paused, while its connection
	// lives on) would never take what it wants; one whose activity is
	// hidden (track_activities off, another role) counts as not wanting,
	// which leaves the partitions with a relay that publishes them.
	PartitionsSurveySQL = `
WITH held AS (
    SELECT classid::int8 AS class, objid::int8 AS key, pid FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 2 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
SELECT
    ARRAY(SELECT p::smallint FROM generate_series(0, $1 - 1) AS p
          WHERE NOT EXISTS (SELECT FROM held WHERE class = $2 AND key = p)),
    EXISTS (SELECT FROM held JOIN pg_stat_activity AS a USING (pid)
            WHERE class = $3 AND key = 0 AND pid <> pg_backend_pid()
              AND a.state_change > now() - make_interval(secs => $4))`

	// PartitionsWantSQL says this session wants more partitions: it takes
	// the shared lock ($1, 0), true if it got it.
	PartitionsWantSQL = `SELECT pg_try_advisory_lock_shared($1, 0)`

	// PartitionsUnwantSQL says this session wants no more partitions: it
	// releases the shared lock ($1, 0), true if it held it.
	PartitionsUnwantSQL = `SELECT pg_advisory_unlock_shared($1, 0)`

	// PartitionsGiveBackSQL releases the advisory locks ($2, partition) of
	// the partitions $1.
	PartitionsGiveBackSQL = `SELECT pg_advisory_unlock($2, p) FROM unnest($1::int[]) AS p`

	// OutboxClaimSQL claims the $1 oldest unpublished rows of the
	// partitions $2, in seq order, with when each was written and its
	// trace context (NULL unless traced: no cost when tracing is off).
	OutboxClaimSQL = `
SELECT id, event_type, payload, created_at, traceparent, tracestate
FROM outbox
WHERE published_at IS NULL AND partition = ANY($2)
ORDER BY seq
LIMIT $1
FOR UPDATE SKIP LOCKED`

	// OutboxMarkPublishedSQL marks the rows $1 published.
	OutboxMarkPublishedSQL = `UPDATE outbox SET published_at = now() WHERE id = ANY($1)`

	// LeaseSettingsSQL sets up the relay's own connection (see lease). Its
	// statements are planned for their arguments each time: a generic plan
	// of the claim or the mark, made while the outbox was nearly empty,
	// scanned the whole outbox once it had grown (10 ms and growing, in the
	// first minute of `make bench`).
	LeaseSettingsSQL = `SET enable_bitmapscan = off; SET synchronous_commit = off; SET plan_cache_mode = force_custom_plan`

	// LeaseKeepaliveSQL makes PostgreSQL probe the relay's own connection
	// after 5 s of silence, every 2 s, 3 times, and give up on data it sent
	// that stays unacknowledged for 11 s: a relay whose host is cut off (no
	// FIN ever reaches the server) loses its session, and so its
	// partitions' locks, within about 11 s, not after the kernel's default
	// of over 2 hours of silence (or 15 minutes of retransmissions).
	LeaseKeepaliveSQL = `SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3; SET tcp_user_timeout = 11000`

	// OutboxPruneSQL deletes up to 1,000 rows published more than $1
	// seconds ago.
	OutboxPruneSQL = `
DELETE FROM outbox WHERE id IN (
    SELECT id FROM outbox
    WHERE published_at < now() - make_interval(secs => $1)
    ORDER BY published_at
    LIMIT 1000
    FOR UPDATE SKIP LOCKED)`

	// OutboxBacklogSQL reads how many rows wait and how old the oldest is.
	OutboxBacklogSQL = `
SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
FROM outbox WHERE published_at IS NULL`
)
