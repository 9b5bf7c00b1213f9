package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/acme/orders/domain"
)

// maxBodyBytes bounds every request body.
const maxBodyBytes = 1 << 20

var errTrailingData = errors.New("trailing data after the JSON object")

// decodeJSON reads the request body into v: one JSON object of known fields,
// at most maxBodyBytes. Its error is a ready *Problem (400, 413 or 415) whose
// detail says what is wrong and, for a wrong type, where.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) *Problem {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"Send the body as application/json.")
		}
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		// Only whitespace may follow the object.
		if _, terr := dec.Token(); terr != io.EOF {
			err = errTrailingData
			if errors.As(terr, new(*http.MaxBytesError)) {
				err = terr
			}
		}
	}
	if err == nil {
		return nil
	}

	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	var tooBig *http.MaxBytesError
	bad := func(detail string, fields ...domain.FieldError) *Problem {
		p := problem(http.StatusBadRequest, "malformed-request", "Malformed request body", detail)
		p.Errors = fields
		return p
	}
	switch {
	case errors.As(err, &tooBig):
		return problem(http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
			fmt.Sprintf("The body must be at most %d bytes.", maxBodyBytes))
	case errors.Is(err, io.EOF):
		return bad("The body is empty; send a JSON object.")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return bad("The body ends in the middle of a JSON value.")
	case errors.As(err, &syntaxErr):
		return bad(fmt.Sprintf("The body is not valid JSON (at byte %d): %v.", syntaxErr.Offset, syntaxErr))
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return bad(fmt.Sprintf("The body must be a JSON object, not a %s.", typeErr.Value))
		}
		return bad("A field has the wrong type.", domain.FieldError{
			Field:  field,
			Detail: fmt.Sprintf("must be %s, got %s", jsonTypeName(typeErr.Type.Kind().String()), typeErr.Value),
		})
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json reports unknown fields only in its message.
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return bad("The body has a field this endpoint does not know.", domain.FieldError{Field: field, Detail: "unknown field"})
	default:
		return bad("The body could not be read as JSON: " + err.Error() + ".")
	}
}

func jsonTypeName(goKind string) string {
	switch goKind {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer (within 64 bits)"
	case "string":
		return "a string"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "of another type"
}

// writeJSON sends v as a JSON response.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// decodeOptional is decodeJSON for endpoints whose body may be empty. It
// answers with the problem itself and returns false when the body is bad.
func (s *Server) decodeOptional(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.ContentLength == 0 {
		return true
	}
	if p := decodeJSON(w, r, v); p != nil {
		if r.ContentLength < 0 && strings.Contains(p.Detail, "empty") {
			return true // a chunked, empty body
		}
		writeProblem(w, r, s.Logger, p, nil)
		return false
	}
	return true
}

// strictUnmarshal decodes one JSON value into v, refusing unknown fields.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}
