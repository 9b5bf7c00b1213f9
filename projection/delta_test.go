package projection

import (
	"cmp"
	"fmt"
	"testing"
)

// deltaRows sums per key and visits the rows in key order, whatever order
// the batch touched them in.
func TestDeltaRowsSumAndVisitInKeyOrder(t *testing.T) {
	t.Parallel()
	d := newDeltaRows[string, int64](nil)
	if !d.empty() {
		t.Fatal("new deltas are not empty")
	}
	for _, k := range []string{"c", "a", "b", "a", "c", "a"} {
		*d.at(k)++
	}
	var keys []string
	var sums []int64
	d.inOrder(cmp.Compare[string], func(k string, n *int64) { keys, sums = append(keys, k), append(sums, *n) })
	if got, want := fmt.Sprint(keys, sums), "[a b c] [3 1 2]"; got != want {
		t.Fatalf("visited %s; want %s", got, want)
	}
}
