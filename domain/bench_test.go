package domain_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/acme/orders/domain"
)

func BenchmarkCreateOrderAndEnvelope(b *testing.B) {
	now := time.Now()
	id, eventID := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	n := validOrder()
	b.ReportAllocs()
	for b.Loop() {
		o, ev, err := domain.CreateOrder(id, "t1", n, now)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := domain.NewEnvelope(eventID, o, ev, now); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeEnvelope(b *testing.B) {
	now := time.Now()
	o, ev, _ := domain.CreateOrder(uuid.Must(uuid.NewV7()), "t1", validOrder(), now)
	env, _ := domain.NewEnvelope(uuid.Must(uuid.NewV7()), o, ev, now)
	raw, _ := json.Marshal(env)
	b.ReportAllocs()
	for b.Loop() {
		e, err := domain.DecodeEnvelope(raw)
		if err != nil {
			b.Fatal(err)
		}
		var data domain.OrderCreated
		if err := e.Decode(&data); err != nil {
			b.Fatal(err)
		}
	}
}
