package harness

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// A port from FreePort must be free to listen on and lie below the
// ephemeral range, where no outgoing connection can take it while the
// process that owns it restarts.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	var first, last int
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatalf("read the ephemeral range: %v", err)
	}
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil {
		t.Fatalf("parse the ephemeral range %q: %v", b, err)
	}
	seen := map[int]bool{}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port >= first && port <= last {
			t.Fatalf("port %d inside the ephemeral range [%d, %d]", port, first, last)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d from FreePort: %v", port, err)
		}
		l.Close()
	}
}
