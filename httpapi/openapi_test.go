package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/go-chi/chi/v5"

	oapi "github.com/acme/orders/api"
	"github.com/acme/orders/httpapi"
)

// openAPIDoc is the embedded OpenAPI document, loaded once per test binary.
var openAPIDoc = sync.OnceValues(func() (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(oapi.YAML)
	if err != nil {
		return nil, fmt.Errorf("load openapi.yaml: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("validate openapi.yaml: %w", err)
	}
	return doc, nil
})

func loadOpenAPI(tb testing.TB) *openapi3.T {
	tb.Helper()
	doc, err := openAPIDoc()
	if err != nil {
		tb.Fatal(err)
	}
	return doc
}

// validated wraps the API handler h so that every request it serves and
// every response it gives is checked against the OpenAPI document, failing
// tb on a mismatch: a response (status, headers, body) the document does
// not describe, a request the document calls invalid that was not refused
// with a 4xx problem, or a request to a route the document lacks that was
// not a 404 or 405 problem. The request body is seen as the handler reads
// it (never read ahead, so slow and oversized bodies behave as without the
// wrapper); a body the handler did not read to its end is not checked.
func validated(tb testing.TB, h http.Handler) http.Handler {
	tb.Helper()
	doc := loadOpenAPI(tb)
	routes, ok := h.(chi.Routes)
	if !ok {
		tb.Fatalf("validated: %T is not a chi router", h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The tee goes on a copy of the request: the server's own keeps
		// its body, by which net/http knows a body left unread and
		// lingers before it closes (closing at once with bytes unread
		// resets the connection, and the client may lose the answer).
		var body *teeBody
		if r.Body != nil && r.Body != http.NoBody {
			body = &teeBody{ReadCloser: r.Body}
			r = r.WithContext(r.Context())
			r.Body = body
		}
		rw := &recordingWriter{ResponseWriter: w}
		h.ServeHTTP(rw, r)

		// The route chi serves this request with (found apart from
		// serving: a middleware may refuse the request before chi gets
		// to the route), matched as chi matches it.
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		rctx := chi.NewRouteContext()
		method := r.Method
		if method == http.MethodHead {
			method = http.MethodGet // served by the GET route, without its body
		}
		ex := exchange{req: r, pattern: routes.Find(rctx, method, path), bodyComplete: true}
		if body != nil {
			ex.reqBody, ex.bodyComplete = body.buf.Bytes(), body.eof
		}
		for i, k := range rctx.URLParams.Keys {
			if ex.params == nil {
				ex.params = map[string]string{}
			}
			ex.params[k] = rctx.URLParams.Values[i]
		}
		ex.status, ex.header, ex.respBody = rw.result()
		if ex.status == httpapi.StatusClientClosedRequest {
			return // recorded for a client that hung up: no answer reaches anyone
		}
		if err := checkExchange(r.Context(), doc, ex); err != nil {
			tb.Errorf("OpenAPI: %s %s → %d: %v\nresponse body: %s", r.Method, r.URL.RequestURI(), ex.status, err, ex.respBody)
		}
	})
}

// exchange is one request and its response, as the server saw them.
type exchange struct {
	req          *http.Request
	pattern      string            // chi's route pattern ("" if none matches)
	params       map[string]string // chi's URL parameters (still encoded if req.URL.RawPath is set)
	reqBody      []byte
	bodyComplete bool // the handler read the request body to its end
	status       int
	header       http.Header
	respBody     []byte
}

// checkExchange checks ex against doc; see validated.
func checkExchange(ctx context.Context, doc *openapi3.T, ex exchange) error {
	isProblem := func(statuses ...int) error {
		mt, _, _ := mime.ParseMediaType(ex.header.Get("Content-Type"))
		if !slices.Contains(statuses, ex.status) || mt != "application/problem+json" {
			return fmt.Errorf("got %d %s, want one of %v as application/problem+json", ex.status, mt, statuses)
		}
		return nil
	}
	var op *openapi3.Operation
	item := doc.Paths.Value(ex.pattern)
	head := ex.req.Method == http.MethodHead
	if item != nil {
		op = item.GetOperation(ex.req.Method)
		if head {
			op = item.GetOperation(http.MethodGet)
		}
	}
	if op == nil {
		if err := isProblem(http.StatusNotFound, http.StatusMethodNotAllowed); err != nil {
			return fmt.Errorf("no operation %s %q in the document: %w", ex.req.Method, ex.pattern, err)
		}
		if ex.status == http.StatusMethodNotAllowed && ex.header.Get("Allow") == "" {
			return errors.New("a 405 without Allow")
		}
		return nil
	}
	if head {
		// GET's answer without its body: the status must be one GET has.
		if op.Responses.Status(ex.status) == nil && op.Responses.Default() == nil {
			return fmt.Errorf("HEAD answered %d, which GET %q does not document", ex.status, ex.pattern)
		}
		return nil // (the body the handler writes, net/http drops)
	}

	params := make(map[string]string, len(ex.params))
	var reqErr error
	for k, v := range ex.params {
		if ex.req.URL.RawPath != "" {
			d, err := url.PathUnescape(v)
			if err != nil {
				reqErr = fmt.Errorf("path parameter %s: %w", k, err)
			}
			v = d
		}
		params[k] = v
	}
	req := ex.req.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(ex.reqBody))
	if len(ex.reqBody) > 0 && req.Header.Get("Content-Type") == "" {
		// The server reads a body without Content-Type as JSON (the
		// document says so in its description).
		req.Header.Set("Content-Type", "application/json")
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      &routers.Route{Spec: doc, Server: nil, Path: ex.pattern, PathItem: item, Method: ex.req.Method, Operation: op},
		Options: &openapi3filter.Options{
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			ExcludeRequestBody: !ex.bodyComplete,
			MultiError:         true,
		},
	}
	if reqErr == nil {
		reqErr = openapi3filter.ValidateRequest(ctx, in)
	}
	if reqErr != nil {
		// Bad input must be refused, never served.
		if err := isProblem(400, 401, 404, 408, 409, 412, 413, 415, 422, 428, 429, 503); err != nil {
			return fmt.Errorf("the request is invalid by the document (%v), yet: %w", reqErr, err)
		}
	}
	in.Options = &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}
	err := openapi3filter.ValidateResponse(ctx, &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 ex.status,
		Header:                 ex.header,
		Body:                   io.NopCloser(bytes.NewReader(ex.respBody)),
		Options:                in.Options,
	})
	if err != nil {
		return fmt.Errorf("response not in the document: %w", err)
	}
	return nil
}

// teeBody keeps what the handler reads of a request body.
type teeBody struct {
	io.ReadCloser
	buf bytes.Buffer
	eof bool
}

func (b *teeBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.buf.Write(p[:n])
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

// recordingWriter passes a response through, keeping a copy of its status,
// headers and body. Unwrap lets http.ResponseController reach the
// connection (read deadlines) as without it.
type recordingWriter struct {
	http.ResponseWriter
	status int
	header http.Header
	body   bytes.Buffer
}

func (w *recordingWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status, w.header = status, w.ResponseWriter.Header().Clone()
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *recordingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.body.Write(p)
	return w.ResponseWriter.Write(p)
}

func (w *recordingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *recordingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *recordingWriter) result() (int, http.Header, []byte) {
	if w.status == 0 { // the handler wrote nothing: net/http sends 200
		return http.StatusOK, w.ResponseWriter.Header().Clone(), nil
	}
	return w.status, w.header, w.body.Bytes()
}

// Every chi route is an operation in the OpenAPI document and every
// operation in the document is a chi route: a route cannot leave the
// document (or the document promise a route) unnoticed.
func TestRoutesMatchOpenAPI(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	routes, ok := httpapi.New(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}).(chi.Routes)
	if !ok {
		t.Fatal("httpapi.New does not return a chi router; walk its routes another way")
	}
	served := map[string]bool{}
	err := chi.Walk(routes, func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		served[method+" "+strings.TrimSuffix(route, "/*")] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	for r := range served {
		if !documented[r] {
			t.Errorf("route %s is served but not in api/openapi.yaml", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("operation %s is in api/openapi.yaml but not served", r)
		}
	}
}

// GET /openapi.json serves the document as JSON, without a token.
func TestOpenAPIServed(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(validated(t, httpapi.New(httpapi.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})))
	t.Cleanup(srv.Close)
	res, err := http.Get(srv.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	want, err := oapi.JSON()
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/json" || !bytes.Equal(b, want) {
		t.Fatalf("GET /openapi.json: %d %s, %d bytes; want 200 application/json with the %d bytes of oapi.JSON()",
			res.StatusCode, res.Header.Get("Content-Type"), len(b), len(want))
	}
	doc, err := openapi3.NewLoader().LoadFromData(b)
	if err != nil || !doc.IsOpenAPI31OrLater() {
		t.Fatalf("the served document does not load as OpenAPI 3.1: %v", err)
	}
}

// The validator refuses what the document does not describe: an
// undocumented status, a field the schema lacks, a missing required header,
// a problem type not listed for its status, and an invalid request that was
// served; and it passes a documented exchange.
func TestOpenAPIValidatorCatchesMismatches(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPI(t)
	ctx := context.Background()
	get := httptest.NewRequest(http.MethodGet, "/v1/idempotency-keys/k-1", nil)
	keys := func(status int, header http.Header, body string) exchange {
		if header == nil {
			header = http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r-1"}}
		}
		return exchange{req: get, pattern: "/v1/idempotency-keys/{key}", params: map[string]string{"key": "k-1"},
			bodyComplete: true, status: status, header: header, respBody: []byte(body)}
	}
	problemHeader := http.Header{"Content-Type": {"application/problem+json"}, "X-Request-Id": {"r-1"}}
	good := `{"key":"k-1","records":[]}`
	create := httptest.NewRequest(http.MethodPost, "/v1/orders", nil)
	create.Header.Set("Content-Type", "application/json") // and no Idempotency-Key
	for name, tc := range map[string]struct {
		ex      exchange
		wantErr string
	}{
		"documented":           {ex: keys(200, nil, good)},
		"undocumented status":  {ex: keys(http.StatusTeapot, nil, good), wantErr: "status is not supported"},
		"undocumented field":   {ex: keys(200, nil, `{"key":"k-1","records":[],"extra":1}`), wantErr: "extra"},
		"missing header":       {ex: keys(200, http.Header{"Content-Type": {"application/json"}}, good), wantErr: "X-Request-Id"},
		"wrong content type":   {ex: keys(200, http.Header{"Content-Type": {"text/plain"}, "X-Request-Id": {"r-1"}}, good), wantErr: "text/plain"},
		"unlisted problem":     {ex: keys(404, problemHeader, `{"type":"https://orders.acme.example/problems/conflict","title":"t","status":404}`), wantErr: "conflict"},
		"documented problem":   {ex: keys(404, problemHeader, `{"type":"https://orders.acme.example/problems/not-found","title":"t","status":404}`)},
		"unknown route served": {ex: exchange{req: get, pattern: "/v1/nowhere", status: 200, header: http.Header{}}, wantErr: "no operation"},
		"invalid request served": {ex: exchange{req: create, pattern: "/v1/orders", reqBody: []byte(validBody), bodyComplete: true,
			status: 200, header: http.Header{}}, wantErr: "invalid by the document"},
	} {
		err := checkExchange(ctx, doc, tc.ex)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%s: %v, want no error", name, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%s: error %v, want one mentioning %q", name, err, tc.wantErr)
		}
	}
}
