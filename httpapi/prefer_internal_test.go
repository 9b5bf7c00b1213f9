package httpapi

import (
	"net/http/httptest"
	"testing"
	"time"
)

// A wait longer than any bound asks for the longest, never for less: wait=3601
// and up used to fall back to the default (2 s), shorter than wait=10's 10 s.
func TestPreferWaitPastAnyBoundIsTheLongest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		header string
		want   time.Duration
		ok     bool
	}{
		{"wait=0", 0, true},
		{"wait=10", 10 * time.Second, true},
		{"respond-async, wait=3600", time.Hour, true},
		{"wait=3601", time.Hour, true},
		{`wait="99999999999999999999999"`, time.Hour, true},
		{"wait=-1", 0, false},
		{"wait=1.5", 0, false},
		{"wait", 0, false},
		{"", 0, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if tt.header != "" {
			r.Header.Set("Prefer", tt.header)
		}
		if got, ok := preferWait(r); got != tt.want || ok != tt.ok {
			t.Errorf("Prefer: %s → %s, %v; want %s, %v", tt.header, got, ok, tt.want, tt.ok)
		}
	}
}
