package bench

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// cpuSince finds a process by its command line and measures the CPU it
// used: this test's own process, busy for a while.
func TestCPUSinceMeasuresTheProcess(t *testing.T) {
	before, start := cpuTicks(os.Args[0]), time.Now()
	x := 0
	for time.Since(start) < 300*time.Millisecond {
		x++
	}
	got := cpuSince(os.Args[0], before, time.Since(start))
	m := regexp.MustCompile(`bench\.test (\d+)%`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("cpuSince = %q (busy loop ran %d times); want bench.test's share", got, x)
	}
	if pct, _ := strconv.Atoi(m[1]); pct < 30 {
		t.Errorf("cpuSince = %q; want bench.test ≥ 30%% of a core while it spun", got)
	}
}
