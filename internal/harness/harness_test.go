package harness

import (
	"fmt"
	"net"
	"testing"
)

// A port from FreePort must be free to listen on and lie below the
// ephemeral range, where no outgoing connection can take it while the
// process that owns it restarts.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	lo, hi := freePortRange()
	if lo >= hi {
		t.Fatalf("empty range [%d, %d)", lo, hi)
	}
	seen := map[int]bool{}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < lo || port >= hi {
			t.Fatalf("port %d outside [%d, %d)", port, lo, hi)
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d from FreePort: %v", port, err)
		}
		l.Close()
	}
	if len(seen) < 10 {
		t.Fatalf("20 calls gave only %d distinct ports: %v", len(seen), seen)
	}
}
