// Package tidemq holds what the whole module shares: the HTTP contract.
package tidemq

import _ "embed"

// OpenAPI is openapi.yaml, the single source of truth of the HTTP API. The
// gateway serves it and validates every request against it.
//
//go:embed openapi.yaml
var OpenAPI []byte
