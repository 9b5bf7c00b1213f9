package httpapi

import (
	"net/http"
	"strings"
	"time"
)

type keyJSON struct {
	Key     string          `json:"key"`
	Records []keyRecordJSON `json:"records"`
}

type keyRecordJSON struct {
	Scope     string          `json:"scope"`
	State     string          `json:"state"` // completed or expired
	Response  keyResponseJSON `json:"response"`
	CreatedAt time.Time       `json:"created_at"`
	ExpiresAt time.Time       `json:"expires_at"`
}

type keyResponseJSON struct {
	Status      int    `json:"status"`
	ContentType string `json:"content_type,omitempty"`
	Location    string `json:"location,omitempty"`
	ETag        string `json:"etag,omitempty"`
}

// getIdempotencyKey handles GET /v1/idempotency-keys/{key}: for
// reconciliation, what the caller's tenant has stored under key, in every
// scope it was used in. Percent-encode the key in the path. A key in its
// quoted (sf-string) form is unquoted, as the header's is: "abc" finds abc.
func (s *Server) getIdempotencyKey(w http.ResponseWriter, r *http.Request) {
	key, ok := pathParam(r, "key")
	if ok && strings.HasPrefix(key, `"`) {
		if unq, valid := parseSFString(key); valid {
			key = unq
		} // else a key that begins with a quote (sent escaped), as it is
	}
	if !ok || key == "" || len(key) > maxKeyLen || !printableASCII(key) {
		writeProblem(w, r, s.Logger, problem(http.StatusBadRequest, "invalid-idempotency-key", "Invalid Idempotency-Key",
			"The key in the path must be 1 to 255 printable ASCII characters, percent-encoded."), nil)
		return
	}
	records, err := s.Keys.Lookup(r.Context(), tenantOf(r), key)
	if err != nil {
		writeProblem(w, r, s.Logger, problemFor(err), err)
		return
	}
	out := keyJSON{Key: key, Records: make([]keyRecordJSON, len(records))}
	for i, rec := range records {
		state := "completed"
		if rec.Expired {
			state = "expired"
		}
		out.Records[i] = keyRecordJSON{
			Scope: rec.Scope,
			State: state,
			Response: keyResponseJSON{
				Status:      rec.Status,
				ContentType: rec.Header["Content-Type"],
				Location:    rec.Header["Location"],
				ETag:        rec.Header["ETag"],
			},
			CreatedAt: rec.CreatedAt.UTC(),
			ExpiresAt: rec.ExpiresAt.UTC(),
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	s.writeJSON(w, r, http.StatusOK, out)
}
