package command

import (
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// The two create statements share their order writes (orderWritesSQL):
// each must use every one of its parameters, and no other.
func TestCreateStatementsUseEachParameter(t *testing.T) {
	for name, c := range map[string]struct {
		sql string
		n   int
	}{"OrderCreateSQL": {OrderCreateSQL, 15}, "KeyedOrderCreateSQL": {KeyedOrderCreateSQL, 26}} {
		var used []int
		for _, p := range regexp.MustCompile(`\$([0-9]+)`).FindAllStringSubmatch(c.sql, -1) {
			n, _ := strconv.Atoi(p[1])
			used = append(used, n)
		}
		slices.Sort(used)
		used = slices.Compact(used)
		want := make([]int, c.n)
		for i := range want {
			want[i] = i + 1
		}
		if !slices.Equal(used, want) {
			t.Errorf("%s uses parameters %v, want 1 to %d", name, used, c.n)
		}
	}
	if got := shiftParams("$1, $9, $10 and $19::int[]", 10); got != "$11, $19, $20 and $29::int[]" {
		t.Errorf("shiftParams = %q", got)
	}
}
