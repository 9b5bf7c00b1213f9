package httpapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/acme/orders/domain"
)

// maxBodyBytes bounds every request body.
const maxBodyBytes = 1 << 20

// tooLarge is the problem of a body longer than maxBodyBytes.
func tooLarge() *Problem {
	return problem(http.StatusRequestEntityTooLarge, "body-too-large", "Request body too large",
		fmt.Sprintf("The body must be at most %d bytes.", maxBodyBytes))
}

var errTrailingData = errors.New("trailing data after the JSON object")

// decodeJSON reads the request body into v: one JSON object of known fields,
// at most maxBodyBytes. Its error is a ready *Problem (400, 413 or 415) whose
// detail says what is wrong and, for a wrong type, where.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) *Problem {
	for _, ce := range r.Header.Values("Content-Encoding") {
		if ce = strings.TrimSpace(ce); ce != "" && !strings.EqualFold(ce, "identity") {
			// Read as it is, a compressed body was refused as malformed
			// and a mislabelled one taken (RFC 9110, 8.4: 415, with the
			// codings taken: none).
			w.Header().Set("Accept-Encoding", "identity")
			return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"Send the body without Content-Encoding (got "+strconv.Quote(ce)+"); compression is not supported.")
		}
	}
	if len(r.Header.Values("Content-Type")) > 1 {
		// One field (RFC 9110, 8.3); read by its first line only, two
		// lines that disagree were taken by the first's media type.
		return problem(http.StatusBadRequest, "malformed-request", "Malformed request",
			"Send one Content-Type header, not several.")
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || !jsonMediaType(r.Method, mt) {
			if r.Method == http.MethodPatch {
				// The patch formats taken (RFC 5789, 2.2).
				w.Header().Set("Accept-Patch", "application/merge-patch+json, application/json")
				return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
					"Send the patch as application/merge-patch+json or application/json.")
			}
			return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"Send the body as application/json.")
		}
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
			return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"Send the body as UTF-8 (charset=utf-8, or no charset), not "+strconv.Quote(cs)+".")
		}
	}
	var body []byte
	var err error
	if read, ok := r.Body.(*bodyBytes); ok && read.Len() == len(read.b) {
		body = read.b // at most maxBodyBytes: readBody refused longer ones
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	}
	if err == nil {
		if p := checkUnicode(body); p != nil {
			return p
		}
		if len(bytes.TrimSpace(body)) == 0 {
			err = io.EOF
		} else if c := firstByte(body); c != '{' {
			// encoding/json takes null for an object as "no change", so
			// null was a body that asked for nothing and got a command run.
			return notAnObject(c)
		} else {
			// The keys are walked before the decode, which is the costly
			// part (a 1 MiB body of 349,505 empty items took 69 ms of CPU
			// and 60 MiB of heap to decode, all to be refused at the 101st
			// item): the walk stops at a field's array longer than any
			// request takes (422), and at a bad key (400). Either is the
			// answer only for valid JSON (a scan, no allocation); a body
			// that is not goes to the decode, which finds that before it
			// allocates anything, and says where. Values the decode skips
			// (an unknown field's, an array where a string goes) are
			// neither capped nor allocated.
			keys := checkKeys(body, reflect.TypeOf(v), "")
			if keys != nil && json.Valid(body) {
				return keys
			}
			// Unknown fields are refused by the decode, but encoding/json
			// matches names case-insensitively and lets the last of two
			// equal names win: the walk refuses both.
			if err = strictUnmarshal(body, v); err == nil {
				return keys
			}
		}
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
		return tooLarge()
	case errors.Is(err, io.EOF):
		return bad("The body is empty; send a JSON object.")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return bad("The body ends in the middle of a JSON value.")
	case errors.As(err, &syntaxErr):
		return bad(fmt.Sprintf("The body is not valid JSON (at byte %d): %v.", syntaxErr.Offset, syntaxErr))
	case errors.As(err, &typeErr):
		field := valuePathAt(body, typeErr.Offset)
		if field == "" {
			field = typeErr.Field // encoding/json's, without array indexes
		}
		return bad("A field has the wrong type.", domain.FieldError{
			Field:  clip(field, maxFieldPath),
			Detail: fmt.Sprintf("must be %s, got %s", jsonTypeName(typeErr.Type.Kind().String()), clip(typeErr.Value, maxFieldPath)),
		})
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json reports unknown fields only in its message.
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return bad("The body has a field this endpoint does not know.", domain.FieldError{Field: clip(field, maxFieldPath), Detail: "unknown field"})
	default:
		return bad("The body could not be read as JSON: " + err.Error() + ".")
	}
}

// valuePathAt names, as the other problems do ("items[1].quantity"), the
// value of body that encoding/json reports a type error at: a scalar that
// ends at byte end, or an object or array whose opening bracket ends
// there. It returns "" if no value does (or the body does not parse).
func valuePathAt(body []byte, end int64) string {
	type level struct {
		array bool
		n     int    // an array's elements begun
		key   string // an object's current key
		inKey bool   // an object's next token is a key (or its end)
	}
	var path []level
	name := func() string {
		var b strings.Builder
		for _, l := range path {
			if l.array {
				fmt.Fprintf(&b, "[%d]", l.n-1)
			} else {
				b.WriteByte('.')
				b.WriteString(l.key)
			}
		}
		return strings.TrimPrefix(b.String(), ".")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		d, isDelim := tok.(json.Delim)
		if isDelim && (d == '}' || d == ']') {
			path = path[:len(path)-1]
		} else if top := len(path) - 1; top >= 0 && path[top].inKey {
			path[top].key, path[top].inKey = tok.(string), false
			continue
		} else {
			if top >= 0 && path[top].array {
				path[top].n++
			}
			if isDelim {
				if dec.InputOffset() == end {
					return name()
				}
				path = append(path, level{array: d == '[', inKey: d == '{'})
				continue
			}
			if dec.InputOffset() == end {
				return name()
			}
		}
		if top := len(path) - 1; top >= 0 && !path[top].array {
			path[top].inKey = true // the value after a key ended
		}
	}
}

// jsonMediaType reports whether a body of media type mt (parsed, lower
// case) is taken by a request of method: application/json, and for PATCH
// also application/merge-patch+json (RFC 7396), as the OpenAPI document
// lists them. Any other type is 415, +json ones too: a type the document
// does not name is one nobody has agreed on.
func jsonMediaType(method, mt string) bool {
	return mt == "application/json" || (method == http.MethodPatch && mt == "application/merge-patch+json")
}

// firstByte is the first byte of b that is not JSON whitespace (0 if none).
func firstByte(b []byte) byte {
	for _, c := range b {
		if !jsonSpace(c) {
			return c
		}
	}
	return 0
}

// notAnObject is the problem of a body whose JSON text begins with c, not
// '{': every body is an object, and null is none (encoding/json would take
// it as an object with no fields).
func notAnObject(c byte) *Problem {
	got := ""
	switch {
	case c == 'n':
		got = ", not null"
	case c == '[':
		got = ", not an array"
	case c == '"':
		got = ", not a string"
	case c == 't' || c == 'f':
		got = ", not a boolean"
	case c == '-' || ('0' <= c && c <= '9'):
		got = ", not a number"
	case c == 0xEF:
		// Most likely a UTF-8 byte order mark (EF BB BF), which some
		// serializers write first: JSON text has none (RFC 8259, 8.1).
		return problem(http.StatusBadRequest, "malformed-request", "Malformed request body",
			"The body begins with byte 0xEF, most likely a UTF-8 byte order mark, which JSON text may not have (RFC 8259, 8.1); send the JSON object without it.")
	default:
		return problem(http.StatusBadRequest, "malformed-request", "Malformed request body",
			fmt.Sprintf("The body is not valid JSON (it begins with %q); send a JSON object.", c))
	}
	return problem(http.StatusBadRequest, "malformed-request", "Malformed request body", "The body must be a JSON object"+got+".")
}

// checkUnicode refuses a body that is not Unicode text in UTF-8, which
// encoding/json would otherwise take with each bad sequence, and each
// escaped lone surrogate (\ud800), replaced by U+FFFD: stored text nobody
// sent, and different requests with one fingerprint. Invalid UTF-8 or a NUL
// byte (UTF-16 and UTF-32 have them; JSON text never does) is 415; a lone
// surrogate, valid JSON syntax but no character, is 400.
func checkUnicode(body []byte) *Problem {
	if i := bytes.IndexByte(body, 0); i >= 0 || !utf8.Valid(body) {
		if i < 0 {
			i = invalidUTF8At(body)
		}
		return problem(http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
			fmt.Sprintf("The body is not UTF-8 (at byte %d); send JSON in UTF-8.", i))
	}
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' || i+1 >= len(body) {
			continue
		}
		i++ // the escaped character: skipped, so "\\u…" is no escape
		if body[i] != 'u' || i+5 > len(body) {
			continue
		}
		hi, ok := hex4(body[i+1 : i+5])
		if !ok || hi < 0xD800 || hi > 0xDFFF {
			continue
		}
		start := i - 1
		i += 4
		if hi <= 0xDBFF && i+6 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
			if lo, ok := hex4(body[i+3 : i+7]); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 6 // a surrogate pair: one character
				continue
			}
		}
		p := problem(http.StatusBadRequest, "malformed-request", "Malformed request body",
			fmt.Sprintf("The body escapes a lone surrogate (%s at byte %d), which is no Unicode character.", body[start:start+6], start))
		return p
	}
	return nil
}

// invalidUTF8At is the offset of the first byte of body that is not part
// of valid UTF-8.
func invalidUTF8At(body []byte) int {
	for i := 0; i < len(body); {
		r, n := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(body)
}

// hex4 parses four hex digits.
func hex4(b []byte) (rune, bool) {
	var r rune
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
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

// writeJSON sends v as a JSON response. If v cannot be encoded (a bug: no
// response type holds a value JSON refuses), the answer is the internal
// problem, logged, without the ETag that described v.
func (s *Server) writeJSON(w http.ResponseWriter, r *http.Request, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		w.Header().Del("ETag")
		writeProblem(w, r, s.Logger, problemFor(nil), fmt.Errorf("encode response: %w", err))
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
	if r.ContentLength < 0 { // chunked: empty only if no byte comes
		br := bufio.NewReader(r.Body)
		if _, err := br.Peek(1); err == io.EOF {
			return true
		}
		r.Body = struct {
			io.Reader
			io.Closer
		}{br, r.Body}
	}
	if p := decodeJSON(w, r, v); p != nil {
		writeProblem(w, r, s.Logger, p, nil)
		return false
	}
	return true
}

// strictUnmarshal decodes one JSON value into v, refusing unknown fields
// and anything but whitespace after the value.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errTrailingData
	}
	return nil
}

var rawMessageType = reflect.TypeFor[json.RawMessage]()

// checkKeys refuses, at every level of the JSON value body (already decoded
// into a value of type t without error), an object that names a key twice
// (also in another case: encoding/json would let the last one win), a key
// that names a field of t other than in its exact spelling (encoding/json
// matches names case-insensitively) and a null for a value whose type is
// not nullable (encoding/json leaves the zero value: a unit_price of null
// was a price of 0). Its problem names the key's path (below path, which
// names where body sits in the request).
func checkKeys(body []byte, t reflect.Type, path string) *Problem {
	w := keyWalker{b: body}
	detail := w.value(t, 0)
	if detail == "" {
		return nil
	}
	var b strings.Builder
	b.WriteString(path)
	for i := len(w.at) - 1; i >= 0; i-- {
		b.WriteString(w.at[i])
	}
	field := b.String()
	if path == "" {
		field = strings.TrimPrefix(field, ".")
	}
	summary := "Every key may appear once per object, spelled exactly as documented."
	switch {
	case detail == tooManyDetail:
		// A rule of the request, as the domain's own "1 to 100 items" is;
		// found before the decode, so the only one reported.
		p := problem(http.StatusUnprocessableEntity, "validation-failed", "Request failed validation",
			fmt.Sprintf("An array holds more than %d elements; no request takes more.", maxArrayElems))
		p.Errors = []domain.FieldError{{Field: clip(field, maxFieldPath), Detail: detail}}
		return p
	case detail == tooDeep:
		summary = fmt.Sprintf("The body nests objects and arrays more than %d levels deep.", maxBodyDepth)
	case w.null:
		summary = "A field has the wrong type."
	}
	p := problem(http.StatusBadRequest, "malformed-request", "Malformed request body", summary)
	p.Errors = []domain.FieldError{{Field: clip(field, maxFieldPath), Detail: detail}}
	return p
}

// maxBodyDepth bounds how deeply a body may nest objects and arrays: no
// endpoint takes more than three levels, and the key check goes one call
// deeper per level (encoding/json's own bound, 10,000, let a hostile body
// make that recursion, and the path of a bad key, its most costly part).
const maxBodyDepth = 64

// tooDeep is the detail of a value nested past maxBodyDepth.
var tooDeep = fmt.Sprintf("nested more than %d levels deep", maxBodyDepth)

// maxArrayElems bounds every array of a request body: no endpoint takes a
// longer one (an order's items are at most domain.MaxItems).
const maxArrayElems = domain.MaxItems

// tooManyDetail is the detail of an array longer than maxArrayElems.
var tooManyDetail = fmt.Sprintf("must hold at most %d items", maxArrayElems)

// maxFieldPath bounds the path of a bad key that a problem repeats (a key
// may be as long as the body).
const maxFieldPath = 256

// clip shortens s to at most n bytes, whole characters, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// keyWalker reads the keys of a JSON text that has decoded without error,
// byte by byte: every create pays for it, and encoding/json's token reader
// took twice as long as the decode itself (BenchmarkDecodeCreateBody). It
// never reads past b or recurses past maxBodyDepth, whatever b holds; on
// bytes that are not valid JSON its answer means nothing.
type keyWalker struct {
	b    []byte
	i    int
	at   []string // the bad key's path, innermost segment first (".key", "[n]")
	null bool     // what is wrong is a null where t takes none
}

// value walks the value at w.i, nested depth levels deep, checking its keys
// against t (nil: any keys and values, duplicates still refused). It returns
// what is wrong with the first bad key or null below this value, with its
// path in w.at, or "" if all are well.
func (w *keyWalker) value(t reflect.Type, depth int) (detail string) {
	declared := t // whether it takes null is asked only of a null
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == rawMessageType || (t != nil && t.Kind() == reflect.Interface) {
		t = nil
	}
	switch c := w.next(); c {
	case '{', '[':
		if depth == maxBodyDepth {
			return tooDeep
		}
		w.i++
		if c == '{' {
			return w.object(t, depth+1)
		}
		return w.array(t, depth+1)
	case '"':
		w.str(false)
	case 'n':
		if !nullable(declared) {
			w.null = true
			return nullDetail(t)
		}
		fallthrough
	default: // a number, true, false or null: up to what follows it
		for ; w.i < len(w.b); w.i++ {
			if c := w.b[w.i]; c == ',' || c == ']' || c == '}' || jsonSpace(c) {
				break
			}
		}
	}
	return ""
}

// nullable reports whether a JSON null is a value of type t: it is for a
// pointer (the field is then nil), an interface, json.RawMessage (which
// holds it) and nil (a value of no known type); not for anything else,
// where encoding/json would take null as "leave the zero value". Slices and
// maps take no null either: no field of a request is documented as a
// nullable array or object without being a pointer or json.RawMessage.
func nullable(t reflect.Type) bool {
	return t == nil || t == rawMessageType || t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface
}

// nullDetail is what a null for a value of type t (not nullable) is told.
func nullDetail(t reflect.Type) string {
	if name := jsonTypeName(t.Kind().String()); name != "of another type" {
		return "must be " + name + ", got null"
	}
	return "must not be null"
}

// object walks the members of the object whose '{' was just read.
func (w *keyWalker) object(t reflect.Type, depth int) (detail string) {
	if w.next() == '}' {
		w.i++
		return ""
	}
	fields := structFields(t)
	seen := make(map[string]struct{}, max(len(fields), 4))
	for w.next() == '"' {
		key := w.str(true)
		if w.next() != ':' {
			return ""
		}
		w.i++
		folded := foldKey(key)
		if _, dup := seen[folded]; dup {
			w.at = append(w.at, "."+key)
			return "duplicate key (keys are compared ignoring case)"
		}
		seen[folded] = struct{}{}
		var elem reflect.Type
		if fields != nil {
			ft, ok := fields[key]
			if !ok {
				for name := range fields {
					if foldKey(name) == folded {
						w.at = append(w.at, "."+key)
						return "must be spelled " + strconv.Quote(name) + " (keys are case-sensitive)"
					}
				}
			}
			elem = ft
		} else if t != nil && t.Kind() == reflect.Map {
			elem = t.Elem()
		}
		if detail := w.value(elem, depth); detail != "" {
			w.at = append(w.at, "."+key)
			return detail
		}
		if w.next() != ',' {
			break // '}'
		}
		w.i++
	}
	w.i++
	return ""
}

// array walks the elements of the array whose '[' was just read.
func (w *keyWalker) array(t reflect.Type, depth int) (detail string) {
	var elem reflect.Type
	if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
		elem = t.Elem()
	}
	if w.next() == ']' {
		w.i++
		return ""
	}
	for n := 0; w.i < len(w.b); n++ {
		if n == maxArrayElems && elem != nil {
			return tooManyDetail // an array the decode would fill
		}
		if detail := w.value(elem, depth); detail != "" {
			w.at = append(w.at, "["+strconv.Itoa(n)+"]")
			return detail
		}
		if w.next() != ',' {
			break // ']'
		}
		w.i++
	}
	w.i++
	return ""
}

// next skips whitespace and returns the byte at w.i (0 at the end).
func (w *keyWalker) next() byte {
	for ; w.i < len(w.b); w.i++ {
		if c := w.b[w.i]; !jsonSpace(c) {
			return c
		}
	}
	return 0
}

// jsonSpace reports whether c is whitespace between JSON tokens.
func jsonSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// str reads the string at w.i (its opening quote) and, if decode, returns
// its value.
func (w *keyWalker) str(decode bool) string {
	start := w.i
	escaped := false
	for w.i++; w.i < len(w.b); w.i++ {
		switch w.b[w.i] {
		case '\\':
			escaped = true
			w.i++ // the escaped byte cannot end the string
		case '"':
			w.i++
			raw := w.b[start:w.i]
			switch {
			case !decode:
				return ""
			case !escaped:
				return string(raw[1 : len(raw)-1])
			}
			var s string
			_ = json.Unmarshal(raw, &s) // valid: the body decoded
			return s
		}
	}
	return ""
}

// fieldsByType caches structFields: a struct's fields never change.
var fieldsByType sync.Map // reflect.Type → map[string]reflect.Type

// structFields maps the JSON names of t's fields to their types (nil if t
// is not a struct). The map is shared: read it, never change it.
func structFields(t reflect.Type) map[string]reflect.Type {
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	if m, ok := fieldsByType.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		m[name] = f.Type
	}
	stored, _ := fieldsByType.LoadOrStore(t, m)
	return stored.(map[string]reflect.Type)
}

// foldKey maps s to one spelling per class of strings that are equal under
// Unicode simple case folding (as encoding/json compares names).
func foldKey(s string) string {
	if ascii, lower := asciiCase(s); ascii {
		if !lower {
			return s // no lower-case letter: its own fold
		}
		return strings.ToUpper(s) // the least of 'a', 'A' (and of 's', 'S', 'ſ'; 'k', 'K', 'K') is the capital
	}
	var b strings.Builder
	for _, r := range s {
		least := r
		for c := unicode.SimpleFold(r); c != r; c = unicode.SimpleFold(c) {
			least = min(least, c)
		}
		b.WriteRune(least)
	}
	return b.String()
}

// asciiCase reports whether s is all ASCII and, if so, whether it has a
// lower-case letter.
func asciiCase(s string) (ascii, lower bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= utf8.RuneSelf:
			return false, false
		case 'a' <= c && c <= 'z':
			lower = true
		}
	}
	return true, lower
}
