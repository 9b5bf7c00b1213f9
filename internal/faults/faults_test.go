package faults

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/internal/noisy"
)

// The report prints the quiet tenant alone and one line per attack of the
// noisy-neighbour run and the payment line (lost provider answers, second
// charges), and its violations make the run FAIL.
func TestReportPrintsNoisyNeighbour(t *testing.T) {
	rep := Report{Ops: map[string]int{}, Faults: map[string]int{}, LostResponses: 7, WindowCrashes: 2, Noisy: noisy.Report{
		Alone: noisy.Workload{Total: 400, P99: 8 * time.Millisecond},
		Attacks: []noisy.AttackResult{
			{Name: "waiting readers", Shed: 429, Attempts: 1, Bound: 28 * time.Millisecond,
				Quiet: noisy.Workload{Total: 380, P99: 9 * time.Millisecond}, Hostile: map[int]int{429: 2000}},
			{Name: "readyz flood", Shed: 200, Attempts: 2, Bound: 28 * time.Millisecond,
				Quiet: noisy.Workload{Total: 300, P99: 40 * time.Millisecond}, Hostile: map[int]int{http.StatusOK: 9000}},
		},
	}}
	rep.Violations = rep.Noisy.Violations()
	var out strings.Builder
	rep.print(&out)
	got := out.String()
	for _, want := range []string{
		"noisy       quiet tenant alone 400 req, p99 8ms",
		"\n  waiting readers ", "hostile 429×2000\n",
		"\n  readyz flood ", "(bound 28ms, attempt 2)",
		"\npayments    lost responses 7, second charges 0; workers crashed between provider answer and commit 2\n",
		"  - readyz flood: quiet tenant p99 40ms", "\nFAIL\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
