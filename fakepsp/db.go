package fakepsp

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// versionTable records the applied version of the fake's own schema.
const versionTable = "fakepsp_schema_version"

// codeDuplicateDatabase is PostgreSQL's duplicate_database SQLSTATE.
const codeDuplicateDatabase = "42P04"

// EnsureDatabase makes sure the database name exists on the PostgreSQL server
// that serverURL points at (any database on it; the connecting role needs
// CREATEDB when it is absent) and returns serverURL with its database
// replaced by name. It is safe to call from several processes at once.
func EnsureDatabase(ctx context.Context, serverURL, name string) (string, error) {
	if name == "" {
		return "", errors.New("ensure database: empty name")
	}
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", fmt.Errorf("parse database url: %w", err)
	}
	conn, err := pgx.Connect(ctx, serverURL)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", u.Redacted(), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", fmt.Errorf("look up database %s: %w", name, err)
	}
	if !exists {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == codeDuplicateDatabase) {
			return "", fmt.Errorf("create database %s: %w", name, err)
		}
	}
	u.Path = "/" + strings.TrimPrefix(name, "/")
	return u.String(), nil
}

// Migrate brings the fake's own schema (fakepsp/migrations, not the order
// service's) up to date on one connection of pool. It is safe to run from
// several processes at once: tern serialises them on an advisory lock.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("acquire connection for migrations: %w", err)
	}
	defer conn.Release()
	m, err := migrate.NewMigrator(ctx, conn.Conn(), versionTable)
	if err != nil {
		return fmt.Errorf("new migrator: %w", err)
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return fmt.Errorf("open embedded migrations: %w", err)
	}
	if err := m.LoadMigrations(sub); err != nil {
		return fmt.Errorf("load migrations: %w", err)
	}
	if err := m.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}
