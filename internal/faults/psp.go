package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/acme/orders/fakepsp"
)

// pspClient talks to fakepsp's /_ledger and /_admin endpoints (no key).
var pspClient = &http.Client{Timeout: 10 * time.Second}

// pspGet decodes the JSON answer of GET path on fakepsp into v.
func (s *stack) pspGet(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.pspURL("")+path, nil)
	if err != nil {
		return err
	}
	res, err := pspClient.Do(req)
	if err != nil {
		return fmt.Errorf("fakepsp GET %s: %w", path, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		return fmt.Errorf("fakepsp GET %s: %d %s", path, res.StatusCode, b)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		return fmt.Errorf("fakepsp GET %s: decode: %w", path, err)
	}
	return nil
}

// pspStats returns fakepsp's counters since it last started.
func (s *stack) pspStats(ctx context.Context) (fakepsp.Stats, error) {
	var st fakepsp.Stats
	return st, s.pspGet(ctx, "/_admin/stats", &st)
}

// pspLedger returns every charge and refund fakepsp ever made.
func (s *stack) pspLedger(ctx context.Context) (fakepsp.Ledger, error) {
	var l fakepsp.Ledger
	return l, s.pspGet(ctx, "/_ledger", &l)
}

// setPSPFaults replaces the faults fakepsp injects (the zero value: none).
func (s *stack) setPSPFaults(ctx context.Context, f fakepsp.Faults) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.pspURL("")+"/_admin/faults", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := pspClient.Do(req)
	if err != nil {
		return fmt.Errorf("fakepsp POST /_admin/faults: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode/100 != 2 {
		b, _ := io.ReadAll(res.Body)
		return fmt.Errorf("fakepsp POST /_admin/faults: %d %s", res.StatusCode, b)
	}
	return nil
}

// lostResponsesTotal is how many provider answers fakepsp lost in this run,
// over all its lives.
func (s *stack) lostResponsesTotal(ctx context.Context) (int64, error) {
	st, err := s.pspStats(ctx)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lostResponses + st.LostResponses, nil
}
