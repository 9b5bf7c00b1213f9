// Package metrics is the Prometheus plumbing every process shares: a
// registry with the Go runtime and process collectors, its /metrics
// handler, the histogram options our latency metrics use, and Collector, which
// turns values read from the components at scrape time (counters kept in
// memory, a cached lag reading) into Prometheus series. Every metric name
// starts with Namespace ("orders_").
package metrics

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric of ours.
const Namespace = "orders"

// LatencyBuckets are the classic buckets of every _seconds histogram, from
// a millisecond to a minute (a native histogram is kept beside them for
// scrapers that ask for it).
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// BatchBuckets are the buckets of the batch size histograms (events).
var BatchBuckets = []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000}

// NewRegistry returns a registry holding the Go runtime and process
// collectors; each process registers its own metrics on it.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Handler serves reg in the Prometheus exposition format. A collector that
// fails leaves its series out and the rest are served.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, Timeout: 10 * time.Second})
}

// HistogramOpts returns the options of histogram name (without the
// namespace): buckets as given, plus a native histogram.
func HistogramOpts(name, help string, buckets []float64) prometheus.HistogramOpts {
	return prometheus.HistogramOpts{
		Namespace: Namespace, Name: name, Help: help, Buckets: buckets,
		NativeHistogramBucketFactor: 1.1, NativeHistogramMaxBucketNumber: 100, NativeHistogramMinResetDuration: time.Hour,
	}
}

// Sample is one value of a metric, with its labels ("projection" → "order_views").
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Metric is one series family whose values are read at scrape time; Read
// is called at every scrape and must be cheap and bounded.
type Metric struct {
	Name    string // without the "orders_" prefix
	Help    string
	Counter bool     // else a gauge
	Labels  []string // the label names every Sample carries
	Read    func() []Sample
}

// One is a Read for a single unlabelled value.
func One[T int64 | float64 | uint64](f func() T) func() []Sample {
	return func() []Sample { return []Sample{{Value: float64(f())}} }
}

// Register registers a Collector of ms on reg; it fails if a name is taken.
func Register(reg prometheus.Registerer, ms ...Metric) error {
	if err := reg.Register(Collector(ms)); err != nil {
		return fmt.Errorf("register metrics: %w", err)
	}
	return nil
}

// Collector returns a prometheus.Collector that reads ms at each scrape.
func Collector(ms []Metric) prometheus.Collector {
	c := readCollector{ms: ms, descs: make([]*prometheus.Desc, len(ms))}
	for i, m := range ms {
		c.descs[i] = prometheus.NewDesc(Namespace+"_"+m.Name, m.Help, m.Labels, nil)
	}
	return c
}

type readCollector struct {
	ms    []Metric
	descs []*prometheus.Desc
}

func (c readCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c readCollector) Collect(ch chan<- prometheus.Metric) {
	for i, m := range c.ms {
		kind := prometheus.GaugeValue
		if m.Counter {
			kind = prometheus.CounterValue
		}
		for _, s := range m.Read() {
			values := make([]string, len(m.Labels))
			for j, l := range m.Labels {
				values[j] = s.Labels[l]
			}
			pm, err := prometheus.NewConstMetric(c.descs[i], kind, s.Value, values...)
			if err != nil {
				pm = prometheus.NewInvalidMetric(c.descs[i], err)
			}
			ch <- pm
		}
	}
}
