package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/acme/orders/domain"
)

// maxNamedParams is how many bad query parameters one problem names, and
// maxQueryParams how many a query string may hold at all.
const (
	maxNamedParams = 10
	maxQueryParams = 32
)

// queryParams counts the parameters of a non-empty raw query string
// without parsing it: its separators, plus one.
func queryParams(raw string) int { return strings.Count(raw, "&") + strings.Count(raw, ";") + 1 }

// singleQueryValues refuses a query string that says something twice or
// nothing at all, with 400 invalid-parameter naming the parameter: one
// that cannot be decoded (r.URL.Query drops it silently), one given more
// than once (limit=1&limit=2: which one?), or one with an empty value
// (limit=, which was read as no limit at all). Every parameter of the API
// takes one non-empty value.
func (s *Server) singleQueryValues(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery == "" {
			next.ServeHTTP(w, r)
			return
		}
		if n := queryParams(r.URL.RawQuery); n > maxQueryParams {
			// No route takes more than a handful: refused before
			// parsing thousands of them.
			p := problem(http.StatusBadRequest, "invalid-parameter", "Invalid query parameter",
				fmt.Sprintf("The query string has %d parameters; no endpoint takes more than %d.", n, maxQueryParams))
			writeProblem(w, r, s.Logger, p, nil)
			return
		}
		values, err := url.ParseQuery(r.URL.RawQuery)
		if err != nil {
			p := problem(http.StatusBadRequest, "invalid-parameter", "Invalid query parameter",
				"The query string cannot be decoded: "+err.Error()+".")
			writeProblem(w, r, s.Logger, p, nil)
			return
		}
		names := make([]string, 0, len(values))
		for name := range values {
			names = append(names, name)
		}
		slices.Sort(names) // the first problem named is the same every time
		var fields []domain.FieldError
		for _, name := range names {
			switch vs := values[name]; {
			case len(vs) > 1:
				fields = append(fields, domain.FieldError{Field: name, Detail: "is given more than once; give it once"})
			case vs[0] == "":
				fields = append(fields, domain.FieldError{Field: name, Detail: "is empty; give a value or leave it out"})
			}
		}
		if len(fields) > 0 {
			// A problem names at most maxNamedParams of them, each
			// clipped: a query string may hold thousands (up to the
			// header limit), and the answer must stay small.
			more := len(fields) - maxNamedParams
			fields = fields[:min(len(fields), maxNamedParams)]
			for i := range fields {
				fields[i].Field = clip(fields[i].Field, maxFieldPath)
			}
			p := invalidParam(fields[0].Field, fields[0].Detail)
			p.Errors = fields
			if len(fields) > 1 {
				var all []string
				for _, f := range fields {
					all = append(all, f.Field)
				}
				list := strings.Join(all, ", ")
				if more > 0 {
					list += fmt.Sprintf(" and %d more", more)
				}
				p.Detail = "The query parameters " + list + " are each given more than once or empty."
			}
			writeProblem(w, r, s.Logger, p, nil)
			return
		}
		next.ServeHTTP(w, r)
	})
}
