// Package migrations holds the numbered schema files and applies them.
//
// Each NNN_name.sql file runs in one transaction; the part below the
// "---- create above / drop below ----" line undoes it. Apply is safe to call
// from several processes at once: tern serialises them on an advisory lock.
package migrations

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed *.sql
var files embed.FS

// versionTable records the applied version.
const versionTable = "schema_version"

// Apply brings the database at conn up to the newest migration. A database
// already past it (migrated by a newer release) is left as it is, and
// Apply returns nil: migrations only add what the release before does not
// use, so a process of the release before must still start on it (a
// replica rescheduled during a rolling deploy, or a rollback); tern alone
// refuses ("current version 24 is outside the valid versions of 0 to 23").
func Apply(ctx context.Context, conn *pgx.Conn) error {
	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return fmt.Errorf("new migrator: %w", err)
	}
	if err := m.LoadMigrations(files); err != nil {
		return fmt.Errorf("load migrations: %w", err)
	}
	current, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return fmt.Errorf("read the schema version: %w", err)
	}
	if int(current) > len(m.Migrations) {
		return nil
	}
	if err := m.Migrate(ctx); err != nil {
		// A newer release may have migrated between the read above and
		// tern's lock.
		if current, verr := m.GetCurrentVersion(ctx); verr == nil && int(current) > len(m.Migrations) {
			return nil
		}
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// Checksum identifies the set of migrations (a SHA-256 over their names and
// contents), e.g. to name a template database migrated with exactly them.
func Checksum() string {
	h := sha256.New()
	entries, _ := fs.ReadDir(files, ".")
	for _, e := range entries {
		b, _ := files.ReadFile(e.Name())
		fmt.Fprintf(h, "%s\n%d\n", e.Name(), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}
