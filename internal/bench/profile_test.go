package bench

import (
	"os"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// cpuSince finds a process by its command line and measures the CPU it
// used: this test's own process, busy until the kernel's own count
// (getrusage) says it used 300 ms, however loaded the machine (under
// `make test/race` a wall-clock spin got less than 30% of a core). What
// cpuSince reports must agree with that count.
func TestCPUSinceMeasuresTheProcess(t *testing.T) {
	before, start := cpuTicks(os.Args[0]), time.Now()
	used0 := selfCPU(t)
	x := 0
	for selfCPU(t)-used0 < 300*time.Millisecond && time.Since(start) < 30*time.Second {
		for range 100_000 {
			x++
		}
	}
	elapsed, used := time.Since(start), selfCPU(t)-used0
	got := cpuSince(os.Args[0], before, elapsed)
	m := regexp.MustCompile(`bench\.test (\d+)%`).FindStringSubmatch(got)
	if m == nil {
		t.Fatalf("cpuSince = %q (busy loop ran %d times, used %s); want bench.test's share", got, x, used)
	}
	want := 100 * used.Seconds() / elapsed.Seconds()
	// /proc counts in ticks of 10 ms: allow two of them over the interval.
	slack := 100 * 0.02 / elapsed.Seconds()
	if pct, _ := strconv.Atoi(m[1]); float64(pct) < want-slack-1 || float64(pct) > want+slack+1 {
		t.Errorf("cpuSince = %q; want bench.test at %.0f%% (±%.0f), as getrusage counted (%s over %s)", got, want, slack+1, used, elapsed)
	}
}

// selfCPU is the CPU this process used so far, user and system, as the
// kernel counts it.
func selfCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
