package domain

import (
	"fmt"
	"unicode/utf8"
)

// ValidateCustomerID checks a customer id on its own (a path or query
// parameter, say): 1 to MaxCustomerIDLen visible ASCII characters. It
// returns a KindInvalid *Error naming customer_id.
func ValidateCustomerID(id string) error {
	var fe fieldErrors
	if msg := checkVisible(id, MaxCustomerIDLen); msg != "" {
		fe.add("customer_id", "%s", msg)
	}
	return fe.err("the customer id is invalid")
}

// textLines says whether a text field may span lines.
type textLines bool

const (
	singleLine textLines = false
	// multiLine text (an order's note) may also hold line feeds, carriage
	// returns and tabs.
	multiLine textLines = true
)

// checkText returns "" if s is valid UTF-8 of min to max characters and
// holds nothing that can disguise or break text where it is shown: no C0
// or C1 control characters (multiLine text may hold \n, \r and \t), no DEL,
// no bidirectional controls (U+061C, U+200E, U+200F, U+202A–U+202E,
// U+2066–U+2069) and no line or paragraph separators (U+2028, U+2029).
// Otherwise it says what is wrong.
func checkText(s string, min, max int, lines textLines) string {
	if !utf8.ValidString(s) {
		return "must be valid UTF-8"
	}
	n := utf8.RuneCountInString(s)
	switch {
	case n < min && min == 1:
		return "is required"
	case n < min || n > max:
		return fmt.Sprintf("must be %d to %d characters", min, max)
	}
	for _, r := range s {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			if lines == singleLine {
				return "must be one line: no line breaks or tabs"
			}
		case r < 0x20 || (r >= 0x7f && r <= 0x9f):
			return fmt.Sprintf("must not contain control characters (U+%04X)", r)
		case r == 0x061c || r == 0x200e || r == 0x200f || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069):
			return fmt.Sprintf("must not contain bidirectional controls (U+%04X)", r)
		case r == 0x2028 || r == 0x2029:
			return fmt.Sprintf("must not contain line or paragraph separators (U+%04X)", r)
		}
	}
	return ""
}
