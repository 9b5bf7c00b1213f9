// Package command runs the service's writes: one handler per use case
// (create, update, pay, ship, cancel an order), the idempotency store that
// claims and replays keys, the order repository and the outbox writer, all
// on one pgx.Tx so that the key, the order and its events commit together.
package command
