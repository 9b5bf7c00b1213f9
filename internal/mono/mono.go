// Package mono reads the monotonic clock as an int64, for a time kept in
// an atomic. A time.Time's UnixNano is the wall clock, which an NTP step
// moves: a duration measured between two of them grew or shrank by the
// step (a write just begun looked stalled for seconds).
package mono

import "time"

var base = time.Now()

// Now is the monotonic time since the process started, in nanoseconds. It
// is never 0, so 0 can stand for "not set".
func Now() int64 { return int64(time.Since(base)) + 1 }

// Since is the time elapsed since t, a value of Now.
func Since(t int64) time.Duration { return time.Duration(Now() - t) }
