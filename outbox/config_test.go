package outbox_test

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/acme/orders/outbox"
)

// NewRelay takes the defaults for zero fields and refuses a Config out of
// range with an error that names the field.
func TestNewRelayValidatesConfig(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct {
		cfg   outbox.Config
		field string // "" when valid
	}{
		{outbox.Config{}, ""},
		{outbox.Config{BatchSize: outbox.MaxBatchSize, MaxPartitions: 3, Workers: 3}, ""},
		{outbox.Config{MaxPartitions: 1}, ""}, // the default workers shrink to the partitions
		{outbox.Config{BatchSize: -1}, "BatchSize"},
		{outbox.Config{BatchSize: outbox.MaxBatchSize + 1}, "BatchSize"},
		{outbox.Config{PollInterval: -time.Second}, "PollInterval"},
		{outbox.Config{AckTimeout: -time.Second}, "AckTimeout"},
		{outbox.Config{MaxPartitions: outbox.Partitions + 1}, "MaxPartitions"},
		{outbox.Config{MaxPartitions: 4, Workers: 5}, "Workers"},
		{outbox.Config{Workers: -1}, "Workers"},
		{outbox.Config{TakeoverInterval: -time.Second}, "TakeoverInterval"},
		{outbox.Config{Retention: -time.Second}, "Retention"},
		{outbox.Config{StreamReplicas: 6}, "StreamReplicas"},
		{outbox.Config{DuplicateWindow: -time.Second}, "DuplicateWindow"},
		{outbox.Config{Linger: -time.Millisecond}, "Linger"},
		{outbox.Config{Linger: 2 * time.Second}, "Linger"},
		{outbox.Config{MinAtomicBatch: 1}, "MinAtomicBatch"},
		{outbox.Config{MinAtomicBatch: -2}, "MinAtomicBatch"},
		{outbox.Config{MinAtomicBatch: 2}, ""},
	} {
		_, err := outbox.NewRelay(nil, nil, logger, tc.cfg)
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%+v: %v; want no error", tc.cfg, err)
		case tc.field != "" && (err == nil || !strings.Contains(err.Error(), tc.field)):
			t.Errorf("%+v: error %v; want one naming %s", tc.cfg, err, tc.field)
		}
	}
}
