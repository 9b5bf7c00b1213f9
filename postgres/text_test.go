package postgres

import "testing"

func TestTextIsWhatATextColumnHolds(t *testing.T) {
	for in, want := range map[string]string{
		"plain":              "plain",
		"a\x00b":             "a\uFFFDb",
		"bad \xff\xfe utf-8": "bad \uFFFD utf-8",
		"héllo":              "héllo",
		"":                   "",
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}
