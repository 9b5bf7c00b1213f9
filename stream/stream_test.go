package stream

import "testing"

func TestOlderThanAtomic(t *testing.T) {
	for version, want := range map[string]bool{
		"2.10.22": true, "2.11.9": true, "2.12.0": false, "2.15.2": false, "3.0.0": false, "": true, "garbage": true,
	} {
		if got := olderThanAtomic(version); got != want {
			t.Errorf("olderThanAtomic(%q) = %v, want %v", version, got, want)
		}
	}
}
