package postgres

import "strings"

// Text returns s as a text column can hold it: PostgreSQL refuses a NUL
// and invalid UTF-8 in text, so each NUL and each invalid byte sequence
// becomes U+FFFD. For what is written to tell a person what happened (a
// dead letter's reason, the subject it came on): an insert that failed on
// the very text naming a bad event would leave that event to be redelivered
// for ever.
func Text(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", "\uFFFD"), "\uFFFD")
}
