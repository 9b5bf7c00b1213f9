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
func TestAnUnknownLogLevelOrFormatIsRefusedAtStart(t *testing.T) {
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
	if err := CheckLogFlags("TEXT", "Debug"); err != nil {
		t.Errorf("CheckLogFlags(TEXT, Debug): %v, want nil (case is not checked)", err)
	}
}
