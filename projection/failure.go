package projection

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/acme/orders/domain"
)

// Permanent reports whether err is a failure that no retry can fix, so the
// event that caused it is dead-lettered at once instead of redelivered with
// backoff: an error wrapping ErrPermanent or domain.ErrMalformedEvent, or a
// PostgreSQL error of class 22 (data exception: a value out of range, a
// division by zero, …), 23 (integrity constraint violation) or 54 (program
// limit exceeded: a value too large for an index row, …). Everything
// else (a lost connection, a deadlock, a serialization failure, a lock or
// statement timeout, …) is transient.
func Permanent(err error) bool {
	if errors.Is(err, ErrPermanent) || errors.Is(err, domain.ErrMalformedEvent) {
		return true
	}
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23") || strings.HasPrefix(pgErr.Code, "54"))
}
