package projection

import (
	"maps"
	"slices"
)

// deltaRows sums one batch's changes per read-model row, for the projections
// built from deltas (CustomerSummaries, DailySales): at returns a row's
// delta, and inOrder visits the rows in key order, the order in which every
// worker writes (and so locks) shared rows, so that concurrent batches
// cannot deadlock.
type deltaRows[K comparable, D any] struct {
	rows   map[K]*D
	newRow func() *D
}

// newDeltaRows returns empty deltas; newRow makes a row's zero delta (nil:
// new(D)).
func newDeltaRows[K comparable, D any](newRow func() *D) *deltaRows[K, D] {
	if newRow == nil {
		newRow = func() *D { return new(D) }
	}
	return &deltaRows[K, D]{rows: map[K]*D{}, newRow: newRow}
}

// at returns the delta of row k, adding it if the batch had none yet.
func (d *deltaRows[K, D]) at(k K) *D {
	row := d.rows[k]
	if row == nil {
		row = d.newRow()
		d.rows[k] = row
	}
	return row
}

// inOrder calls visit for every row, in the order of compare.
func (d *deltaRows[K, D]) inOrder(compare func(a, b K) int, visit func(k K, row *D)) {
	for _, k := range slices.SortedFunc(maps.Keys(d.rows), compare) {
		visit(k, d.rows[k])
	}
}

// empty reports whether the batch changed no row.
func (d *deltaRows[K, D]) empty() bool { return len(d.rows) == 0 }
