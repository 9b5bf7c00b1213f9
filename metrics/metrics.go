// Package metrics serves counters and gauges in the Prometheus text format,
// read from the components at scrape time (no client library needed).
package metrics

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// Sample is one value of a metric, with its labels ("projection" → "order_views").
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Metric is one named series family; Read is called at every scrape.
type Metric struct {
	Name    string // without the "orders_" prefix
	Help    string
	Counter bool // else a gauge
	Read    func() []Sample
}

// One is a Read for a single unlabelled value.
func One[T int64 | float64 | uint64](f func() T) func() []Sample {
	return func() []Sample { return []Sample{{Value: float64(f())}} }
}

// Handler serves ms.
func Handler(ms []Metric) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		sorted := append([]Metric(nil), ms...)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
		for _, m := range sorted {
			kind := "gauge"
			if m.Counter {
				kind = "counter"
			}
			fmt.Fprintf(w, "# HELP orders_%s %s\n# TYPE orders_%s %s\n", m.Name, m.Help, m.Name, kind)
			for _, s := range m.Read() {
				fmt.Fprintf(w, "orders_%s%s %g\n", m.Name, labels(s.Labels), s.Value)
			}
		}
	}
}

func labels(l map[string]string) string {
	if len(l) == 0 {
		return ""
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, l[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}
