package domain_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	o, ev, err := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", validOrder(), now)
	if err != nil {
		t.Fatal(err)
	}
	env, err := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, ev, now)
	if err != nil {
		t.Fatal(err)
	}
	if env.Type != "order.created" || env.AggregateID != o.ID || env.AggregateVersion != 1 || env.SchemaVersion != 1 {
		t.Fatalf("envelope = %+v", env)
	}
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	got, err := domain.DecodeEnvelope(b)
	if err != nil {
		t.Fatal(err)
	}
	var data domain.OrderCreated
	if err := got.Decode(&data); err != nil {
		t.Fatal(err)
	}
	if got.ID != env.ID || data.Total != o.Total || !data.CreatedAt.Equal(now) {
		t.Fatalf("round trip lost data: %+v %+v", got, data)
	}
}

func TestDecodeEnvelopeMalformed(t *testing.T) {
	t.Parallel()
	const id = `"0193b1a8-7c2e-7000-8000-000000000001"`
	tests := map[string]string{
		"not json":         `{"id":`,
		"no id":            `{"type":"order.created","tenant_id":"t","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
		"no type":          `{"id":` + id + `,"tenant_id":"t","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
		"no tenant":        `{"id":` + id + `,"type":"order.created","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
		"no aggregate":     `{"id":` + id + `,"type":"order.created","tenant_id":"t","aggregate_version":1,"data":{}}`,
		"version 0":        `{"id":` + id + `,"type":"order.created","tenant_id":"t","aggregate_id":` + id + `,"aggregate_version":0,"data":{}}`,
		"no data":          `{"id":` + id + `,"type":"order.created","tenant_id":"t","aggregate_id":` + id + `,"aggregate_version":1}`,
		"bad id":           `{"id":"nope","type":"order.created","tenant_id":"t","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
		"version a string": `{"id":` + id + `,"type":"order.created","tenant_id":"t","aggregate_id":` + id + `,"aggregate_version":"1","data":{}}`,
	}
	for name, in := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := domain.DecodeEnvelope([]byte(in)); !errors.Is(err, domain.ErrMalformedEvent) {
				t.Fatalf("DecodeEnvelope(%s) err = %v, want ErrMalformedEvent", in, err)
			}
		})
	}
}

// AppendJSON writes what json.Marshal writes, byte for byte, whatever the
// strings hold (quotes, control characters, HTML, non-ASCII, invalid
// UTF-8), and fails where it fails.
func FuzzEnvelopeAppendJSON(f *testing.F) {
	f.Add("order.created", "t1", int64(1), int64(0), []byte(`{"total":"10.00"}`))
	f.Add(`a"b\c`, "<tenant>&\u2028\x01", int64(-7), int64(1<<62), []byte(`[1,"x"]`))
	f.Add("ünïcode", "\xff\xfe", int64(1<<63-1), int64(-1<<62), []byte(nil))
	f.Fuzz(func(t *testing.T, typ, tenant string, version, nanos int64, data []byte) {
		if len(data) > 0 && !json.Valid(data) {
			data = nil
		}
		if len(data) > 0 { // as NewEnvelopeAt's: compact, HTML-escaped (json.Marshal's own)
			var err error
			if data, err = json.Marshal(json.RawMessage(data)); err != nil {
				t.Fatal(err)
			}
		}
		env := domain.Envelope{ID: uuid.New(), Type: typ, SchemaVersion: domain.SchemaVersion, TenantID: tenant,
			AggregateID: uuid.New(), AggregateVersion: version, OccurredAt: time.Unix(0, nanos).UTC(), Data: data}
		want, wantErr := json.Marshal(env)
		got, err := env.AppendJSON([]byte("prefix"))
		if (err != nil) != (wantErr != nil) {
			t.Fatalf("AppendJSON error %v, json.Marshal error %v", err, wantErr)
		}
		if err == nil && string(got) != "prefix"+string(want) {
			t.Fatalf("AppendJSON wrote\n%s\njson.Marshal writes\n%s", got[len("prefix"):], want)
		}
	})
}

// An instant json.Marshal cannot encode fails AppendJSON too.
func TestEnvelopeAppendJSONFailsOnAYearPast9999(t *testing.T) {
	t.Parallel()
	env := domain.Envelope{ID: uuid.New(), Type: "order.created", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}
	if _, err := json.Marshal(env); err == nil {
		t.Fatal("json.Marshal encoded year 10000; the test's premise is gone")
	}
	if b, err := env.AppendJSON(nil); err == nil {
		t.Fatalf("AppendJSON encoded year 10000: %s", b)
	}
}
