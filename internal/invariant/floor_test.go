package invariant

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestUUIDV7FloorOrdersWithEventIDs(t *testing.T) {
	before := uuidV7Floor(time.Now().Add(-time.Millisecond))
	id, err := uuid.NewV7()
	if err != nil {
		t.Fatal(err)
	}
	after := uuidV7Floor(time.Now().Add(time.Second))
	if bytes.Compare(before[:], id[:]) > 0 || bytes.Compare(id[:], after[:]) >= 0 {
		t.Fatalf("floor(now-1ms)=%s, id=%s, floor(now+1s)=%s: not in order", before, id, after)
	}
}
