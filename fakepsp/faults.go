package fakepsp

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"
)

// Lose modes of Faults.LoseMode.
const (
	// LoseClose commits, then closes the connection without an answer.
	LoseClose = "close"
	// LoseStall commits, then holds the connection without an answer until
	// the client gives up (its timeout) or Config.MaxStall passes, then
	// closes it.
	LoseStall = "stall"
)

// Faults are the failures the fake injects on purpose. The zero value
// injects none. They apply to the /v1 API only, never to /_ledger or /_admin.
type Faults struct {
	// LatencyMS delays every /v1 answer by this many milliseconds; a POST
	// waits while it holds its idempotency key, so a retry sent meanwhile
	// gets 409 idempotency_key_in_use.
	LatencyMS int `json:"latency_ms"`
	// ErrorRate is the share (0 to 1) of /v1 requests answered 500 api_error
	// before anything executes: nothing is written or stored under the key,
	// so a retry with the same key executes anew.
	ErrorRate float64 `json:"error_rate"`
	// LoseResponseRate is the share (0 to 1) of POSTs whose outcome is
	// committed (ledger and key) and whose answer is then lost (LoseMode).
	LoseResponseRate float64 `json:"lose_response_rate"`
	// LoseNext loses the answers of the next LoseNext POSTs for certain,
	// counted down as they happen (deterministic, for tests).
	LoseNext int `json:"lose_next"`
	// LoseMode is how an answer is lost: LoseClose (the default when empty)
	// or LoseStall.
	LoseMode string `json:"lose_mode"`
	// FailNextRefunds makes the next FailNextRefunds refunds fail (status
	// failed, failure_reason "declined"), whatever the card, counted down
	// as they are made (deterministic, for tests of a refund asked again).
	FailNextRefunds int `json:"fail_next_refunds"`
	// StoreErrorNext makes the next StoreErrorNext POSTs with a key fail
	// once their endpoint began: 500 api_error, nothing charged or
	// refunded, and the 500 stored under the key, so every retry with it
	// is answered that 500 again (Idempotent-Replayed: true) until the key
	// expires, as Stripe does. Counted down as they happen.
	StoreErrorNext int `json:"store_error_next"`
}

// Validate reports the first field that is out of range.
func (f Faults) Validate() error {
	switch {
	case f.LatencyMS < 0 || f.LatencyMS > 600_000:
		return fmt.Errorf("latency_ms must be 0 to 600000, got %d", f.LatencyMS)
	case f.ErrorRate < 0 || f.ErrorRate > 1:
		return fmt.Errorf("error_rate must be 0 to 1, got %v", f.ErrorRate)
	case f.LoseResponseRate < 0 || f.LoseResponseRate > 1:
		return fmt.Errorf("lose_response_rate must be 0 to 1, got %v", f.LoseResponseRate)
	case f.LoseNext < 0:
		return fmt.Errorf("lose_next must not be negative, got %d", f.LoseNext)
	case f.FailNextRefunds < 0:
		return fmt.Errorf("fail_next_refunds must not be negative, got %d", f.FailNextRefunds)
	case f.StoreErrorNext < 0:
		return fmt.Errorf("store_error_next must not be negative, got %d", f.StoreErrorNext)
	case f.LoseMode != "" && f.LoseMode != LoseClose && f.LoseMode != LoseStall:
		return fmt.Errorf("lose_mode must be %q or %q, got %q", LoseClose, LoseStall, f.LoseMode)
	}
	return nil
}

// Stats counts what the fake did since it started (not persisted).
type Stats struct {
	Requests              int64 `json:"requests"`
	InjectedErrors        int64 `json:"injected_errors"`
	LostResponses         int64 `json:"lost_responses"`
	Replays               int64 `json:"replays"`
	IdempotencyConflicts  int64 `json:"idempotency_conflicts"`
	IdempotencyMismatches int64 `json:"idempotency_mismatches"`
}

type counters struct {
	requests, injectedErrors, lostResponses, replays, conflicts, mismatches atomic.Int64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Requests: c.requests.Load(), InjectedErrors: c.injectedErrors.Load(), LostResponses: c.lostResponses.Load(),
		Replays: c.replays.Load(), IdempotencyConflicts: c.conflicts.Load(), IdempotencyMismatches: c.mismatches.Load(),
	}
}

// SetFaults replaces the injected faults.
func (s *Server) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if f.LoseMode == "" {
		f.LoseMode = LoseClose
	}
	s.mu.Lock()
	s.faults = f
	s.mu.Unlock()
	return nil
}

// Faults returns the faults injected now (LoseNext and FailNextRefunds
// counted down so far).
func (s *Server) Faults() Faults {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults
}

// Stats returns the counters since the server started.
func (s *Server) Stats() Stats { return s.count.snapshot() }

func (s *Server) latency() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(s.faults.LatencyMS) * time.Millisecond
}

func (s *Server) injectError() bool {
	s.mu.Lock()
	rate := s.faults.ErrorRate
	s.mu.Unlock()
	return rate > 0 && rand.Float64() < rate
}

// loseNow decides whether to lose this answer and how.
func (s *Server) loseNow() (bool, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.faults.LoseNext > 0 {
		s.faults.LoseNext--
		return true, s.faults.LoseMode
	}
	return s.faults.LoseResponseRate > 0 && rand.Float64() < s.faults.LoseResponseRate, s.faults.LoseMode
}

// failRefundNow decides whether the refund being made fails
// (FailNextRefunds).
func (s *Server) failRefundNow() bool { return s.countDown(&s.faults.FailNextRefunds) }

// storeErrorNow decides whether the keyed request executing now fails with
// a stored 500 (StoreErrorNext).
func (s *Server) storeErrorNow() bool { return s.countDown(&s.faults.StoreErrorNext) }

// countDown takes one from the fault counter n, if it is above 0, and says
// whether it did.
func (s *Server) countDown(n *int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *n > 0 {
		*n--
		return true
	}
	return false
}

// loseResponse drops the connection of r without an answer, at once or
// after stalling until the client gives up.
func (s *Server) loseResponse(w http.ResponseWriter, r *http.Request, mode string) {
	s.count.lostResponses.Add(1)
	if mode == LoseStall {
		t := time.NewTimer(s.cfg.MaxStall)
		select {
		case <-r.Context().Done():
		case <-t.C:
		}
		t.Stop()
	}
	if hj, ok := w.(http.Hijacker); ok {
		if conn, _, err := hj.Hijack(); err == nil {
			_ = conn.Close() // losing the answer is the point; a close error changes nothing
			return
		}
	}
	panic(http.ErrAbortHandler) // net/http closes the connection without an answer
}
