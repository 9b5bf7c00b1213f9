package app

import (
	"context"
	"io"
	"strings"
	"testing"
)

// A mistyped log level or format stops each process at start with a
// message naming the variable, before it connects to anything: it was
// silently taken as info (or JSON) before.
func TestMistypedOrZeroSettingsAreRefusedAtStart(t *testing.T) {
	t.Parallel()
	runs := map[string]func(context.Context, []string, func(string) string, io.Writer) error{
		"api": RunAPI, "projector": RunProjector, "worker": RunWorker,
	}
	for name, run := range runs {
		for _, env := range []map[string]string{{"LOG_LEVEL": "degub"}, {"LOG_FORMAT": "yaml"}} {
			getenv := func(k string) string { return env[k] }
			err := run(context.Background(), []string{name}, getenv, io.Discard)
			var want string
			for k := range env {
				want = k
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s with %v: err %v, want one naming %s", name, env, err, want)
			}
		}
	}
	// A 0 where a Config's 0 means the default is refused as well: the user
	// asked for something else.
	for _, tt := range []struct {
		run  func(context.Context, []string, func(string) string, io.Writer) error
		name string
		env  map[string]string
	}{
		{RunProjector, "projector", map[string]string{"INBOX_RETENTION": "0s"}},
		{RunAPI, "api", map[string]string{"IDEMPOTENCY_KEY_QUOTA": "0"}},
		{RunAPI, "api", map[string]string{"IDEMPOTENCY_KEY_QUOTA_BYTES": "0"}},
	} {
		var want string
		for k := range tt.env {
			want = k
		}
		err := tt.run(context.Background(), []string{tt.name}, func(k string) string { return tt.env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s with %v: err %v, want one naming %s", tt.name, tt.env, err, want)
		}
	}
	// Values past what the process can compute with are refused, not
	// wrapped: a pool of 2^32 + 1 connections was a pool of one, and a
	// redelivery horizon past time.Duration's range went negative.
	for _, tt := range []struct {
		run       func(context.Context, []string, func(string) string, io.Writer) error
		name, key string
		value     string
		flag      string
	}{
		{RunAPI, "api", "DB_POOL_SIZE", "4294967297", "-db-pool-size"},
		{RunProjector, "projector", "DB_POOL_SIZE", "4294967300", "-db-pool-size"},
		{RunWorker, "worker", "DB_POOL_SIZE", "2147483648", "-db-pool-size"},
		{RunProjector, "projector", "PROJECTOR_MAX_DELIVER", "200000000", "-max-deliver"},
		{RunProjector, "projector", "PROJECTOR_ACK_WAIT", "1000000h", "-ack-wait"},
		{RunWorker, "worker", "WORKER_ACK_WAIT", "2000000h", "AckWait"},
		{RunWorker, "worker", "WORKER_MAX_DELIVER", "200000000", "MaxDeliver"},
	} {
		err := tt.run(context.Background(), []string{tt.name}, func(k string) string {
			if k == tt.key {
				return tt.value
			}
			return ""
		}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.flag) {
			t.Errorf("%s with %s=%s: err %v, want one naming %s", tt.name, tt.key, tt.value, err, tt.flag)
		}
	}
	if err := CheckLogFlags("TEXT", "Debug"); err != nil {
		t.Errorf("CheckLogFlags(TEXT, Debug): %v, want nil (case is not checked)", err)
	}
}
