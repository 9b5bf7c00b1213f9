package httpapi

import (
	"net/http"
	"net/url"

	"github.com/go-chi/chi/v5"
)

// pathParam returns the path parameter name decoded exactly once, or false
// if it is not valid percent-encoding. chi matches on the raw (still
// encoded) path whenever the request's path has an escape that its decoded
// form would not reproduce (r.URL.RawPath is set: %2F, %41, %25, …), and on
// the decoded path otherwise; so the parameter is decoded here only in the
// first case. Thus "a%2Fb" is "a/b", "%41" is "A" and "%2541" is "%41".
func pathParam(r *http.Request, name string) (string, bool) {
	v := chi.URLParam(r, name)
	if r.URL.RawPath == "" {
		return v, true
	}
	d, err := url.PathUnescape(v)
	return d, err == nil
}
