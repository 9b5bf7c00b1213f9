// Package dashshot renders a picture of the Grafana dashboard
// (docs/grafana-dashboard.json) from a real run: it scrapes the processes'
// /metrics into an in-memory store, evaluates every panel's queries with
// Prometheus's own PromQL engine and draws the panels in the dashboard's
// grid layout into a PNG. It is not Grafana: the drawing is its own, the
// numbers are Prometheus's.
package dashshot

import (
	"context"
	"sort"
	"sync"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// Store holds float samples in memory, series by series, and serves them
// to the PromQL engine as a storage.Queryable. It keeps everything it is
// given (a run of a few minutes is a few hundred thousand samples), so it
// suits short runs only. It is safe for concurrent use.
type Store struct {
	mu     sync.Mutex
	series map[string]*memSeries // by labels.Labels.String()
}

type memSeries struct {
	lset    labels.Labels
	samples []chunks.Sample
}

var _ storage.Queryable = (*Store)(nil)

// NewStore returns an empty Store.
func NewStore() *Store {
	return &Store{series: map[string]*memSeries{}}
}

// Append adds the sample (t in milliseconds since the epoch) to the series
// lset. A sample not after the series' last one is dropped, as Prometheus
// drops out-of-order samples; Append reports whether it was kept.
func (s *Store) Append(lset labels.Labels, t int64, v float64) bool {
	key := lset.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	ms, ok := s.series[key]
	if !ok {
		ms = &memSeries{lset: lset}
		s.series[key] = ms
	}
	if n := len(ms.samples); n > 0 && ms.samples[n-1].T() >= t {
		return false
	}
	ms.samples = append(ms.samples, fsample{t: t, f: v})
	return true
}

// Len returns the number of series and of samples held.
func (s *Store) Len() (series, samples int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ms := range s.series {
		samples += len(ms.samples)
	}
	return len(s.series), samples
}

// Querier returns a querier over the samples in [mint, maxt] as they are
// now; later appends do not show in it.
func (s *Store) Querier(mint, maxt int64) (storage.Querier, error) {
	return &querier{s: s, mint: mint, maxt: maxt}, nil
}

type querier struct {
	s          *Store
	mint, maxt int64
}

func (q *querier) Select(_ context.Context, _ bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	mint, maxt := q.mint, q.maxt
	if hints != nil {
		mint, maxt = max(mint, hints.Start), min(maxt, hints.End)
	}
	q.s.mu.Lock()
	var out []storage.Series
	for _, m := range q.s.series {
		if !matches(m.lset, ms) {
			continue
		}
		lo := sort.Search(len(m.samples), func(i int) bool { return m.samples[i].T() >= mint })
		hi := sort.Search(len(m.samples), func(i int) bool { return m.samples[i].T() > maxt })
		if lo >= hi {
			continue
		}
		// Appends only ever extend the slice, so this window of it stays
		// valid; the copy keeps the querier independent of them anyway.
		out = append(out, storage.NewListSeries(m.lset, append([]chunks.Sample(nil), m.samples[lo:hi]...)))
	}
	q.s.mu.Unlock()
	// The engine merges and groups sorted series; sorting always is cheap here.
	sort.Slice(out, func(i, j int) bool { return labels.Compare(out[i].Labels(), out[j].Labels()) < 0 })
	return &seriesSet{series: out, i: -1}
}

func (q *querier) LabelValues(_ context.Context, name string, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q.s.mu.Lock()
	defer q.s.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range q.s.series {
		if v := m.lset.Get(name); v != "" && matches(m.lset, ms) {
			seen[v] = true
		}
	}
	return sortedKeys(seen), nil, nil
}

func (q *querier) LabelNames(_ context.Context, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	q.s.mu.Lock()
	defer q.s.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range q.s.series {
		if matches(m.lset, ms) {
			m.lset.Range(func(l labels.Label) { seen[l.Name] = true })
		}
	}
	return sortedKeys(seen), nil, nil
}

func (q *querier) Close() error { return nil }

func matches(lset labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type seriesSet struct {
	series []storage.Series
	i      int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i < len(s.series) }
func (s *seriesSet) At() storage.Series                { return s.series[s.i] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

// fsample is a float sample (the only kind a text-format scrape yields).
type fsample struct {
	t int64
	f float64
}

func (s fsample) T() int64                      { return s.t }
func (s fsample) F() float64                    { return s.f }
func (s fsample) H() *histogram.Histogram       { return nil }
func (s fsample) FH() *histogram.FloatHistogram { return nil }
func (s fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
