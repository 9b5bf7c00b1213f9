package api_test

import (
	"context"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/acme/orders/api"
)

// The embedded document is valid OpenAPI 3.1, and its JSON form says the
// same as its YAML.
func TestDocumentIsValid(t *testing.T) {
	t.Parallel()
	for name, load := range map[string]func() ([]byte, error){
		"yaml": func() ([]byte, error) { return api.YAML, nil },
		"json": api.JSON,
	} {
		b, err := load()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		doc, err := openapi3.NewLoader().LoadFromData(b)
		if err != nil {
			t.Fatalf("%s: load: %v", name, err)
		}
		if !doc.IsOpenAPI31OrLater() {
			t.Fatalf("%s: openapi = %q, want 3.1.x", name, doc.OpenAPI)
		}
		if err := doc.Validate(context.Background()); err != nil {
			t.Fatalf("%s: validate: %v", name, err)
		}
	}
}
