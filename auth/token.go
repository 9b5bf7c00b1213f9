package auth

import (
	"crypto/rand"
	"fmt"
	"hash/crc32"
)

// Token format: "ord_" + 43 random base62 characters (256 bits) + 6 base62
// characters of the CRC32 (IEEE) of those 43. The checksum is no secret; it
// lets the api refuse a mistyped, truncated or made-up token without asking
// the database (like GitHub's tokens), and lets secret scanners tell a real
// token from noise.
const (
	// tokenPrefix marks the service's tokens, so that they are easy to spot
	// (and to scan for) when they leak into logs or repositories.
	tokenPrefix   = "ord_"
	randomLen     = 43
	checksumLen   = 6
	tokenLen      = len(tokenPrefix) + randomLen + checksumLen
	legacyLen     = len(tokenPrefix) + 43 // ord_ + base64url of 32 bytes
	base62        = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	formatLegacy  = 1
	formatCurrent = 2
)

// NewToken returns a fresh token in the current format. It is not
// registered: Clients.Create makes and registers one.
func NewToken() (string, error) {
	b := make([]byte, 0, tokenLen)
	b = append(b, tokenPrefix...)
	var buf [64]byte
	for len(b) < len(tokenPrefix)+randomLen {
		if _, err := rand.Read(buf[:]); err != nil {
			return "", fmt.Errorf("read random bytes: %w", err)
		}
		for _, x := range buf {
			// Rejection sampling keeps every character equally likely:
			// 248 = 4×62.
			if x < 248 && len(b) < len(tokenPrefix)+randomLen {
				b = append(b, base62[x%62])
			}
		}
	}
	return string(appendChecksum(b, b[len(tokenPrefix):])), nil
}

// appendChecksum appends the 6 base62 digits of random's CRC32 to b.
func appendChecksum(b, random []byte) []byte {
	sum := crc32.ChecksumIEEE(random)
	var digits [checksumLen]byte
	for i := checksumLen - 1; i >= 0; i-- {
		digits[i] = base62[sum%62]
		sum /= 62
	}
	return append(b, digits[:]...)
}

// WellFormed reports whether token is in the current format with a correct
// checksum. It needs no database: a false means the token was never issued.
func WellFormed(token string) bool { return format(token) == formatCurrent }

// format returns formatCurrent for a well-formed token, formatLegacy for
// one shaped like the tokens issued before the checksum, and 0 otherwise.
func format(token string) int {
	if len(token) < len(tokenPrefix) || token[:len(tokenPrefix)] != tokenPrefix {
		return 0
	}
	body := token[len(tokenPrefix):]
	switch len(token) {
	case tokenLen:
		for i := 0; i < len(body); i++ {
			if !isBase62(body[i]) {
				return 0
			}
		}
		random := []byte(body[:randomLen])
		if string(appendChecksum(nil, random)) != body[randomLen:] {
			return 0
		}
		return formatCurrent
	case legacyLen:
		for i := 0; i < len(body); i++ {
			if c := body[i]; !isBase62(c) && c != '-' && c != '_' {
				return 0
			}
		}
		return formatLegacy
	}
	return 0
}

func isBase62(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z'
}
