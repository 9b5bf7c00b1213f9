// Package domain holds the Order aggregate and its state machine, money,
// the events and their JSON envelope, and the domain error kinds. It is
// pure: no I/O, no SQL, no HTTP.
package domain
