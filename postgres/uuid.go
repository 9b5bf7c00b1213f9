package postgres

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// RegisterUUID teaches m to send a uuid.UUID (alone, or in a slice for a
// uuid[] parameter) as the 16 bytes it is. Without it pgx takes uuid.UUID's
// driver.Valuer: Value renders the text form, encoding that as binary uuid
// fails (an error is built and dropped), and the text is parsed back, for
// every id of every statement: 20 allocations and 2.4 µs per id against 2
// and 0.11 µs, and 10–17% of the worker's and the projector's CPU in a pay
// → paid profile. Open registers it on every connection.
func RegisterUUID(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUIDEncodePlan}, m.TryWrapEncodePlanFuncs...)
}

// pgUUID is a uuid.UUID that pgtype's UUID codec encodes directly.
type pgUUID uuid.UUID

func (u pgUUID) UUIDValue() (pgtype.UUID, error) { return pgtype.UUID{Bytes: u, Valid: true}, nil }

func tryWrapUUIDEncodePlan(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	if u, ok := value.(uuid.UUID); ok {
		return &uuidEncodePlan{}, pgUUID(u), true
	}
	return nil, nil, false
}

type uuidEncodePlan struct{ next pgtype.EncodePlan }

func (p *uuidEncodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

func (p *uuidEncodePlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(pgUUID(value.(uuid.UUID)), buf)
}
