package settle

import (
	"fmt"
	"testing"
	"time"
)

// A full memory of spent keys drops the ones past spentKeyTTL to make
// room, so a long-lived worker keeps settling new spent keys; it never
// reports a key it could not remember as spent for long.
func TestSpentKeysDropTheOldOnesWhenFull(t *testing.T) {
	var s spentKeys
	start := time.Now()
	for i := range maxSpentKeys {
		s.since(fmt.Sprint("old-", i), start)
	}
	later := start.Add(spentKeyTTL + time.Minute)
	if got := s.since("new", later); got != 0 {
		t.Fatalf("a new key is known spent for %s, want 0", got)
	}
	if got := s.since("new", later.Add(time.Hour)); got != time.Hour {
		t.Fatalf("the new key, met again an hour later: known spent for %s, want 1h (it was not remembered)", got)
	}
	if len(s.first) != 1 {
		t.Fatalf("%d keys remembered, want only the new one", len(s.first))
	}
	// Full of keys younger than the TTL: a new one is not remembered.
	var young spentKeys
	for i := range maxSpentKeys {
		young.since(fmt.Sprint("k-", i), start)
	}
	young.since("new", start.Add(time.Minute))
	if got := young.since("new", start.Add(time.Hour)); got != 0 {
		t.Fatalf("a key that could not be remembered is known spent for %s, want 0", got)
	}
}
