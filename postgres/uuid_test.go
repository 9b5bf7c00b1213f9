package postgres_test

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/acme/orders/internal/testenv"
	"github.com/acme/orders/postgres"
)

// A uuid.UUID is sent as its 16 bytes, alone and in a uuid[], without its
// driver.Valuer's detour through the text form (a string built, an encode
// error built and dropped, the text parsed back, for every id).
func TestUUIDIsEncodedAsItsBytes(t *testing.T) { // not parallel: AllocsPerRun
	m := pgtype.NewMap()
	postgres.RegisterUUID(m)
	id := uuid.Must(uuid.NewV7())
	got, err := m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, id, nil)
	if err != nil || !slices.Equal(got, id[:]) {
		t.Fatalf("Encode(uuid) = %x, %v; want %x", got, err, id[:])
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := m.Encode(pgtype.UUIDOID, pgtype.BinaryFormatCode, id, got[:0]); err != nil {
			t.Fatal(err)
		}
	})
	// The driver.Valuer detour costs 20 allocations and 2.4 µs per id;
	// the bytes, 2 (the value boxed twice) and 0.11 µs.
	if allocs > 2 {
		t.Errorf("encoding a uuid.UUID allocates %.0f times; want at most 2 (the value boxed twice)", allocs)
	}
}

// Ids round-trip through PostgreSQL on Open's connections: alone, in a
// uuid[], the nil UUID, and compared with their text form in SQL.
func TestUUIDRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.DB(t)
	ids := []uuid.UUID{uuid.Must(uuid.NewV7()), uuid.Nil, uuid.New()}
	var one uuid.UUID
	var many []uuid.UUID
	var sameText bool
	err := db.QueryRow(ctx, `SELECT $1::uuid, $2::uuid[], $1::uuid = $3::text::uuid`, ids[0], ids, ids[0].String()).Scan(&one, &many, &sameText)
	if err != nil {
		t.Fatal(err)
	}
	if one != ids[0] || !slices.Equal(many, ids) || !sameText {
		t.Fatalf("round trip: %v, %v (equal to its text: %v); want %v, %v, true", one, many, sameText, ids[0], ids)
	}
}
