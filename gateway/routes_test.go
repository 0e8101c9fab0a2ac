package gateway_test

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/gateway"
)

// openapi.yaml is the single source of truth of the HTTP surface (docs/ARCHITECTURE.md):
// every route of the router is an operation of the spec, and every operation
// of the spec is routed.

// routedOperations walks the real router and returns "METHOD /path" for
// every route, in the spec's path syntax.
func routedOperations(t *testing.T) []string {
	t.Helper()
	srv := newGateway(t, serverConfig{})
	var ops []string
	err := chi.Walk(srv.Mux(), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		ops = append(ops, method+" "+specPath(route))
		return nil
	})
	if err != nil {
		t.Fatalf("chi.Walk: %v", err)
	}
	slices.Sort(ops)
	return slices.Compact(ops)
}

// chiRegexpParam matches a chi parameter with a regexp, {name:re}; only the
// name is kept, as in OpenAPI. A ':' outside braces (messages:batch) is a
// literal in both syntaxes.
var chiRegexpParam = regexp.MustCompile(`\{([^{}:]+):[^{}]*\}`)

func specPath(route string) string {
	route = chiRegexpParam.ReplaceAllString(route, "{$1}")
	if len(route) > 1 {
		route = strings.TrimSuffix(route, "/")
	}
	return route
}

// specOperations returns "METHOD /path" for every operation of openapi.yaml.
func specOperations(t *testing.T) []string {
	t.Helper()
	doc, err := gateway.LoadSpec()
	if err != nil {
		t.Fatalf("LoadSpec: %v", err)
	}
	var ops []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			ops = append(ops, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(ops)
	return ops
}

func TestRoutesAreInSpec(t *testing.T) {
	routed, spec := routedOperations(t), specOperations(t)
	if len(routed) == 0 {
		t.Fatal("the router has no routes")
	}
	var extra []string
	for _, op := range routed {
		if !slices.Contains(spec, op) {
			extra = append(extra, op)
		}
	}
	if len(extra) > 0 {
		t.Errorf("%d routed operations are not in openapi.yaml (describe them there, or remove the route):\n\t%s",
			len(extra), strings.Join(extra, "\n\t"))
	}
}

func TestSpecOperationsAreRouted(t *testing.T) {
	routed, spec := routedOperations(t), specOperations(t)
	if len(spec) == 0 {
		t.Fatal("openapi.yaml has no operations")
	}
	var missing []string
	for _, op := range spec {
		if !slices.Contains(routed, op) {
			missing = append(missing, op)
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d operations of openapi.yaml are not routed (build them, or take them out of the spec):\n\t%s",
			len(missing), len(spec), strings.Join(missing, "\n\t"))
	}
}

// TestRouteComparisonCanFail keeps the two tests above honest: the path
// translation is the identity on the spec's syntax and a route the spec
// lacks is noticed.
func TestRouteComparisonCanFail(t *testing.T) {
	for in, want := range map[string]string{
		"/v1/topics/{topic}/messages:batch":    "/v1/topics/{topic}/messages:batch",
		"/v1/topics/{topic:[a-z]+}/messages":   "/v1/topics/{topic}/messages",
		"/":                                    "/",
		"/v1/topics/{topic}/subscriptions/":    "/v1/topics/{topic}/subscriptions",
		"/v1/topics/{topic}/messages/{id:.+}/": "/v1/topics/{topic}/messages/{id}",
	} {
		if got := specPath(in); got != want {
			t.Errorf("specPath(%q) = %q, want %q", in, got, want)
		}
	}
	spec := specOperations(t)
	for _, op := range []string{"GET /v1/topics", "POST /v1/topics/{topic}/messages:batch", "POST /v1/topics/{topic}/subscriptions/{group}/pull"} {
		if !slices.Contains(spec, op) {
			t.Errorf("spec operations lack %q: the spec walk is wrong", op)
		}
	}
	if slices.Contains(spec, "PATCH /v1/topics/{topic}") {
		t.Error("spec operations contain an operation openapi.yaml does not describe")
	}
}
