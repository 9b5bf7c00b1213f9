package noisy

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestReportViolations applies each threshold on its own: a report that
// meets them all has no violation, and each one crossed is named.
func TestReportViolations(t *testing.T) {
	ms := time.Millisecond
	alone := Workload{Total: 300, P99: 10 * ms, MaxLag: 50 * ms}
	ok := func() AttackResult {
		return AttackResult{
			Name: "burst", Shed: http.StatusTooManyRequests, Attempts: 1,
			Bound:   Bound(alone.P99),
			Quiet:   Workload{Total: 2000, Failed: 1, P99: 30 * ms, MaxLag: 300 * ms},
			Hostile: map[int]int{http.StatusOK: 10, http.StatusTooManyRequests: 5},
		}
	}
	tests := []struct {
		name   string
		change func(r *Report)
		want   []string // substrings, one per violation; none for a clean report
	}{
		{"clean", func(r *Report) {}, nil},
		{"success rate under 99.9%", func(r *Report) { r.Attacks[0].Quiet.Failed = 3 }, []string{"burst: quiet tenant success rate 0.9985"}},
		{"p99 over the bound", func(r *Report) { r.Attacks[0].Quiet.P99 = 31 * ms }, []string{"burst: quiet tenant p99 31ms"}},
		{"view lag over 2 s", func(r *Report) { r.Attacks[0].Quiet.MaxLag = 2001 * ms }, []string{"burst: quiet tenant's read model 2.001s behind"}},
		{"attack not shed", func(r *Report) { delete(r.Attacks[0].Hostile, http.StatusTooManyRequests) }, []string{"burst: no 429 among"}},
		{"no quiet request measured", func(r *Report) { r.Attacks[0].Quiet = Workload{} }, []string{"burst: quiet tenant made no request"}},
		{"alone failed", func(r *Report) { r.Alone.Failed = 1; r.Alone.Errors = []string{"create: 500"} }, []string{"quiet tenant alone: 1 of 300 failed"}},
		{"alone lagged", func(r *Report) { r.Alone.MaxLag = 3 * time.Second }, []string{"quiet tenant alone: read model 3s behind"}},
		{"two at once", func(r *Report) {
			r.Attacks = append(r.Attacks, ok())
			r.Attacks[1].Name = "flood"
			r.Attacks[1].Quiet.P99 = time.Second
			r.Attacks[0].Quiet.Failed = 10
		}, []string{"burst: quiet tenant success rate", "flood: quiet tenant p99 1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Report{Alone: alone, Attacks: []AttackResult{ok()}}
			tt.change(&r)
			got := r.Violations()
			if len(got) != len(tt.want) {
				t.Fatalf("Violations() = %q, want %d violations like %q", got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("violation %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestBound is the p99 bound: twice the p99 alone, but never less than
// 20 ms above it.
func TestBound(t *testing.T) {
	ms := time.Millisecond
	for _, tt := range []struct{ alone, want time.Duration }{
		{5 * ms, 25 * ms},
		{20 * ms, 40 * ms},
		{50 * ms, 100 * ms},
	} {
		if got := Bound(tt.alone); got != tt.want {
			t.Errorf("Bound(%s) = %s, want %s", tt.alone, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{API: "http://127.0.0.1:1", QuietToken: "q", HostileToken: "h"}
	if err := good.withDefaults().validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for name, c := range map[string]Config{
		"API":          {QuietToken: "q", HostileToken: "h"},
		"QuietToken":   {API: "http://x", HostileToken: "h"},
		"HostileToken": {API: "http://x", QuietToken: "q"},
		"Phase":        {API: "http://x", QuietToken: "q", HostileToken: "h", Phase: -time.Second},
		"same tokens":  {API: "http://x", QuietToken: "q", HostileToken: "q"},
	} {
		err := c.withDefaults().validate()
		if err == nil || !strings.Contains(err.Error(), strings.Fields(name)[0]) && name != "same tokens" {
			t.Errorf("%s: validate() = %v, want an error naming it", name, err)
		}
	}
}
