package app

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

// The test-only crash hook lets the first n-1 provider answers through and
// crashes the process at the n-th, before its outcome is recorded; 0 means
// no hook at all.
func TestCrashAfterProviderCalls(t *testing.T) {
	if h := crashAfterProviderCalls(0, func() { t.Fatal("crashed without a hook") }); h != nil {
		t.Fatal("crashAfterProviderCalls(0) returned a hook")
	}
	crashes := 0
	h := crashAfterProviderCalls(3, func() { crashes++ })
	for i := 1; i <= 4; i++ {
		err := h(context.Background(), "payment_worker_charges", uuid.New())
		want := max(0, i-2) // every answer from the 3rd on crashes
		if crashes != want {
			t.Fatalf("after answer %d: %d crashes, want %d", i, crashes, want)
		}
		if i >= 3 && err == nil {
			t.Fatalf("answer %d: the hook let the outcome be recorded after crashing", i)
		}
	}
}
