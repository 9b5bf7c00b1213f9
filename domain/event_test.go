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
