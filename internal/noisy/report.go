package noisy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// The thresholds of issue #10's acceptance, applied by Report.Violations.
const (
	// MinSuccessRate is the share of the quiet tenant's requests that must
	// succeed under each attack.
	MinSuccessRate = 0.999
	// MaxViewLag is how far behind its own writes the quiet tenant's read
	// model may be: a read-your-writes read (min_version) that took longer
	// is a violation.
	MaxViewLag = 2 * time.Second
	// BoundSlack is the least the p99 bound lies above the p99 alone (see
	// Bound).
	BoundSlack = 20 * time.Millisecond
)

// Bound is the most the quiet tenant's p99 under an attack may be, given
// its p99 alone: twice that, but at least BoundSlack more. On a 2-core
// machine a p99 of a few milliseconds doubles from scheduling noise alone
// (the attacking clients run on the same cores as the api), so a bound of
// 2× a 5 ms p99 would measure the scheduler, not the api's isolation.
func Bound(alone time.Duration) time.Duration {
	return max(2*alone, alone+BoundSlack)
}

// Workload is what the quiet tenant saw in one measured phase.
type Workload struct {
	Total, Failed int
	P99           time.Duration
	// MaxLag is the longest read-your-writes read (GET with min_version of
	// the order just created): how far its read model was behind.
	MaxLag time.Duration
	// Errors are the first few failures ("create: 429").
	Errors []string
}

// SuccessRate is the share of requests that succeeded (0 if none was made).
func (w Workload) SuccessRate() float64 {
	if w.Total == 0 {
		return 0
	}
	return float64(w.Total-w.Failed) / float64(w.Total)
}

// AttackResult is one attack's outcome.
type AttackResult struct {
	Name string
	// Shed is the hostile status that proves the api refused the attack's
	// excess (or, for an attack with nothing to shed, that it was made).
	Shed int
	// Quiet is the quiet tenant's last measured phase under the attack;
	// Attempts how many phases were measured (more than 1 if the first was over
	// Bound: see Run).
	Quiet    Workload
	Attempts int
	Bound    time.Duration
	// Hostile counts the hostile tenant's answers by status (0: transport
	// error; 408: body cut off; 4291: a 429 that was not the key quota's,
	// for the key flood).
	Hostile map[int]int
}

// String is the attack's one-line summary.
func (a AttackResult) String() string {
	var hostile []string
	for _, st := range slices.Sorted(maps.Keys(a.Hostile)) {
		hostile = append(hostile, fmt.Sprintf("%d×%d", st, a.Hostile[st]))
	}
	return fmt.Sprintf("%-22s quiet %d req, %.2f%% ok, p99 %s (bound %s, attempt %d), lag ≤ %s; hostile %s",
		a.Name, a.Quiet.Total, 100*a.Quiet.SuccessRate(), a.Quiet.P99.Round(100*time.Microsecond),
		a.Bound.Round(100*time.Microsecond), a.Attempts, a.Quiet.MaxLag.Round(time.Millisecond), strings.Join(hostile, " "))
}

// Report is what Run measured: the quiet tenant alone, then under each
// attack.
type Report struct {
	Alone   Workload
	Attacks []AttackResult
}

// Violations applies the acceptance thresholds and returns one sentence
// per threshold crossed (none if the report passes).
func (r Report) Violations() []string {
	var out []string
	switch {
	case r.Alone.Total == 0:
		out = append(out, "quiet tenant alone made no request")
	case r.Alone.Failed > 0:
		out = append(out, fmt.Sprintf("quiet tenant alone: %d of %d failed: %v (no attack was run)", r.Alone.Failed, r.Alone.Total, r.Alone.Errors))
	}
	if r.Alone.MaxLag > MaxViewLag {
		out = append(out, fmt.Sprintf("quiet tenant alone: read model %s behind its writes, want at most %s", r.Alone.MaxLag, MaxViewLag))
	}
	for _, a := range r.Attacks {
		q := a.Quiet
		if q.Total == 0 {
			out = append(out, fmt.Sprintf("%s: quiet tenant made no request", a.Name))
		} else if rate := q.SuccessRate(); rate < MinSuccessRate {
			out = append(out, fmt.Sprintf("%s: quiet tenant success rate %.4f (%d of %d failed: %v), want ≥ %v",
				a.Name, rate, q.Failed, q.Total, q.Errors, MinSuccessRate))
		}
		if q.P99 > a.Bound {
			out = append(out, fmt.Sprintf("%s: quiet tenant p99 %s, alone %s; want at most %s", a.Name, q.P99, r.Alone.P99, a.Bound))
		}
		if q.MaxLag > MaxViewLag {
			out = append(out, fmt.Sprintf("%s: quiet tenant's read model %s behind its writes, want at most %s", a.Name, q.MaxLag, MaxViewLag))
		}
		if a.Hostile[a.Shed] == 0 {
			out = append(out, fmt.Sprintf("%s: no %d among the hostile tenant's responses %v: the attack was not shed (or not made)", a.Name, a.Shed, a.Hostile))
		}
	}
	return out
}
