// Package api holds the service's HTTP contract: the OpenAPI 3.1 document
// api/openapi.yaml, embedded in the binary. The httpapi tests check the
// handlers against it (every route in both directions, every request and
// response of the HTTP tests), so a route or a response that leaves the
// document fails CI.
package api

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"sync"

	"go.yaml.in/yaml/v3"
)

// YAML is the OpenAPI document as written.
//
//go:embed openapi.yaml
var YAML []byte

var (
	jsonOnce sync.Once
	jsonDoc  []byte
	jsonErr  error
)

// JSON returns the OpenAPI document as JSON, converted once. It returns an
// error only if the embedded YAML is not a document of string-keyed maps,
// which the api tests rule out.
func JSON() ([]byte, error) {
	jsonOnce.Do(func() {
		var v any
		if err := yaml.Unmarshal(YAML, &v); err != nil {
			jsonErr = fmt.Errorf("parse openapi.yaml: %w", err)
			return
		}
		plain, err := jsonable(v)
		if err != nil {
			jsonErr = fmt.Errorf("convert openapi.yaml: %w", err)
			return
		}
		jsonDoc, jsonErr = json.Marshal(plain)
		if jsonErr != nil {
			jsonErr = fmt.Errorf("encode openapi.json: %w", jsonErr)
		}
	})
	return jsonDoc, jsonErr
}

// jsonable turns a decoded YAML value into one encoding/json can encode: a
// mapping with a key that is no string (an unquoted status code) is an error.
func jsonable(v any) (any, error) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			v[k] = c
		}
		return v, nil
	case map[any]any:
		return nil, fmt.Errorf("a mapping has a key that is not a string (quote status codes)")
	case []any:
		for i, e := range v {
			c, err := jsonable(e)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			v[i] = c
		}
		return v, nil
	}
	return v, nil
}
