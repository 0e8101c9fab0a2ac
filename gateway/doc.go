// Package gateway is the HTTP front of a broker: it serves openapi.yaml's
// operations over a Broker, validating every request against the
// spec (kin-openapi, or the hot-body decoders that read the same spec's
// limits) and answering errors as problem+json.
//
// Broker is an interface of exactly the operations the handlers call, not
// *core.Broker, so that a cluster can put a routing broker (one that
// forwards each call to the node owning the topic) behind the same gateway;
// the single-node *core.Broker is one implementation. core's types
// (Message, PullRequest, its errors) stay the vocabulary of both.
//
// The files, by concern:
//
//	server.go      Options, Server, New, LoadSpec: building the handler
//	broker.go      Broker, what the gateway needs of a broker
//	routes.go      the route table, the per-route wrappers, the open pages
//	middleware.go  request id and log, metrics attributes, panic recovery, gzip
//	request.go     reading a request: authorization first, names, body (decompressed, capped)
//	validate.go    checking a request against openapi.yaml; kin-openapi errors as problems
//	decode.go      the hot routes' one-pass JSON decoders
//	limits.go      the decoders' limits, read from openapi.yaml
//	api.go         the JSON types of replies and requests
//	reply.go       writing JSON replies
//	problems.go    errors to problem+json: one table of status, code and title
//	auth.go        tokens, grants and bearer authentication
//	topics.go, messages.go, consume.go, query.go   the handlers, by tag of the spec
//	console.go     the web console, /docs and their embedded files
//
// The pulled-message JSON, which push deliveries POST too, is written by
// internal/wire, so package webhook shares it without importing gateway.
package gateway
