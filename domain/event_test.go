package domain_test

import (
	"encoding/json"
	"errors"
	"strings"
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
		// Text that no text column can hold, or that no index should.
		"a NUL in the tenant":       `{"id":` + id + `,"type":"order.created","tenant_id":"t\u0000x","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
		"a line feed in the tenant": `{"id":` + id + `,"type":"order.created","tenant_id":"t\n","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
		"a tenant of 65 bytes":      `{"id":` + id + `,"type":"order.created","tenant_id":"` + strings.Repeat("t", 65) + `","aggregate_id":` + id + `,"aggregate_version":1,"data":{}}`,
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

// Decode refuses data no event of ours holds, naming the field: a negative
// number anywhere (items and embedded fields too), a time that JSON cannot
// hold in every time zone, an event of a newer schema. It takes the zero
// time (left out by events of earlier versions) and the edges of the range.
func TestEnvelopeDecodeRefusesValuesNoEventHolds(t *testing.T) {
	t.Parallel()
	env := func(data string) domain.Envelope {
		return domain.Envelope{Type: domain.TypeOrderCreated, SchemaVersion: domain.SchemaVersion, AggregateVersion: 1, Data: json.RawMessage(data)}
	}
	refused := map[string]struct {
		env    domain.Envelope
		target any
		names  string
	}{
		"a negative total":           {env(`{"total":-1}`), &domain.OrderCreated{}, "total is negative"},
		"a negative line total":      {env(`{"items":[{"sku":"a","quantity":1},{"sku":"b","line_total":-5}]}`), &domain.OrderCreated{}, "items[1].line_total is negative"},
		"a negative embedded total":  {env(`{"total":-4990,"status":"paid"}`), &domain.OrderPaid{}, "total is negative"},
		"a negative refund":          {env(`{"amount":-1}`), &domain.OrderRefunded{}, "amount is negative"},
		"year -1 in UTC":             {env(`{"created_at":"0000-01-01T00:00:00+01:00"}`), &domain.OrderCreated{}, "created_at is outside"},
		"year 10000 in a later zone": {env(`{"at":"9999-12-31T23:30:00-01:00"}`), &domain.OrderShipped{}, "at is outside"},
		"the last day of 9999":       {env(`{"refunded_at":"9999-12-31T00:00:00Z"}`), &domain.OrderRefunded{}, "refunded_at is outside"},
		"a newer schema": {domain.Envelope{Type: domain.TypeOrderCreated, SchemaVersion: domain.SchemaVersion + 1, AggregateVersion: 1, Data: json.RawMessage(`{}`)},
			&domain.OrderCreated{}, "newer than this build's"},
		"occurred in year 0": {domain.Envelope{Type: domain.TypeOrderCreated, AggregateVersion: 1, OccurredAt: time.Date(0, 6, 1, 0, 0, 0, 0, time.UTC), Data: json.RawMessage(`{}`)},
			&domain.OrderCreated{}, "occurred_at is outside"},
		"an order's first version that is not its creation": {domain.Envelope{Type: domain.TypeOrderPaid, AggregateVersion: 1, Data: json.RawMessage(`{"total":1000,"status":"paid"}`)},
			&domain.OrderPaid{}, "version 1, and only it, is order.created"},
		"a creation at a later version": {domain.Envelope{Type: domain.TypeOrderCreated, AggregateVersion: 3, Data: json.RawMessage(`{}`)},
			&domain.OrderCreated{}, "version 1, and only it, is order.created"},
	}
	for name, tt := range refused {
		err := tt.env.Decode(tt.target)
		if !errors.Is(err, domain.ErrMalformedEvent) || !strings.Contains(err.Error(), tt.names) {
			t.Errorf("%s: Decode err = %v, want ErrMalformedEvent saying %q", name, err, tt.names)
		}
	}
	for name, data := range map[string]string{
		"zero amounts and no times": `{"total":0,"items":[{"sku":"a","quantity":0,"unit_price":0,"line_total":0}]}`,
		"the first instant":         `{"created_at":"0001-01-01T00:00:00Z"}`,
		"the last representable":    `{"created_at":"9999-12-30T23:59:59.999999999Z"}`,
		"the largest total":         `{"total":9223372036854775807}`,
	} {
		if err := env(data).Decode(&domain.OrderCreated{}); err != nil {
			t.Errorf("%s: Decode err = %v, want none", name, err)
		}
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
