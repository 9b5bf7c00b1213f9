package mono

import (
	"testing"
	"time"
)

func TestNowIsNeverZeroAndSinceGrows(t *testing.T) {
	a := Now()
	if a == 0 {
		t.Fatal("Now() = 0, which callers read as not set")
	}
	if d := Since(a); d < 0 || d > time.Minute {
		t.Fatalf("Since(Now()) = %s", d)
	}
	if b := Now(); b < a {
		t.Fatalf("Now went back: %d then %d", a, b)
	}
}
