package gateway_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tidemq/tidemq/gateway"
)

const (
	publisherToken = "tmq_publisher-token-for-tests-0001"
	consumerToken  = "tmq_consumer-token-for-tests-0002"
	adminToken     = "tmq_admin-token-for-tests-00000003"
)

func testTokens(t *testing.T) *gateway.Tokens {
	t.Helper()
	doc := `
tokens:
  - name: orders-service
    sha256: ` + gateway.HashToken(publisherToken) + `
    grants:
      - {actions: [publish], topics: ["orders", "orders-*"]}
  - name: billing
    sha256: ` + gateway.HashToken(consumerToken) + `
    grants:
      - {actions: [subscribe], topics: ["orders"], groups: ["billing-*"]}
  - name: ops
    sha256: ` + gateway.HashToken(adminToken) + `
    grants: [{actions: [admin]}]
`
	tokens, err := gateway.ParseTokens([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return tokens
}

func bearer(token string) hdr { return hdr{"Authorization": "Bearer " + token} }

func problemCode(t *testing.T, r *reply) string {
	t.Helper()
	var p struct{ Code string }
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %s: %v", r, err)
	}
	return p.Code
}

func TestTokensGrantAndRefuse(t *testing.T) {
	ts := startServer(t, serverConfig{})
	ts.gw.SetTokens(testTokens(t))
	c := ts.client(t)

	for _, tc := range []struct {
		name, token, method, path string
		body                      any
		want                      int
		code                      string
	}{
		{"no token", "", "GET", "/v1/topics", nil, 401, "unauthenticated"},
		{"unknown token", "tmq_nope", "GET", "/v1/topics", nil, 401, "unauthenticated"},
		{"admin lists topics", adminToken, "GET", "/v1/topics", nil, 200, ""},
		{"admin creates a topic", adminToken, "PUT", "/v1/topics/orders", map[string]any{}, 201, ""},
		{"publisher sends to its topic", publisherToken, "POST", "/v1/topics/orders/messages", map[string]any{"body": "x"}, 201, ""},
		{"publisher sends to a pattern topic", publisherToken, "POST", "/v1/topics/orders-eu/messages", map[string]any{"body": "x"}, 201, ""},
		{"publisher elsewhere", publisherToken, "POST", "/v1/topics/payments/messages", map[string]any{"body": "x"}, 403, "forbidden"},
		{"publisher cannot pull", publisherToken, "POST", "/v1/topics/orders/subscriptions/billing-a/pull", map[string]any{}, 403, "forbidden"},
		{"publisher cannot administer", publisherToken, "GET", "/v1/topics", nil, 403, "forbidden"},
		{"consumer pulls its group", consumerToken, "POST", "/v1/topics/orders/subscriptions/billing-a/pull", map[string]any{}, 200, ""},
		{"consumer, other group", consumerToken, "POST", "/v1/topics/orders/subscriptions/audit/pull", map[string]any{}, 403, "forbidden"},
		{"consumer cannot send", consumerToken, "POST", "/v1/topics/orders/messages", map[string]any{"body": "x"}, 403, "forbidden"},
		// Refused before existence is checked: a missing topic does not leak.
		{"forbidden before not found", publisherToken, "POST", "/v1/topics/secret-topic/messages", map[string]any{"body": "x"}, 403, "forbidden"},
		{"metrics needs admin", consumerToken, "GET", "/metrics", nil, 403, "forbidden"},
		{"metrics for admin", adminToken, "GET", "/metrics", nil, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h hdr
			if tc.token != "" {
				h = bearer(tc.token)
			}
			r := c.on(t).do(tc.method, tc.path, tc.body, h)
			if r.status != tc.want {
				t.Fatalf("%s %s: %s, want %d", tc.method, tc.path, r, tc.want)
			}
			if tc.code != "" {
				if got := problemCode(t, r); got != tc.code {
					t.Fatalf("code %q, want %q", got, tc.code)
				}
			}
			if tc.want == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without WWW-Authenticate: %v", r.header)
			}
		})
	}
	// Health needs no token.
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := c.do("GET", path, nil); r.status != 200 {
			t.Errorf("%s without a token: %s", path, r)
		}
	}
	// Turning tokens off (nil) opens the API again.
	ts.gw.SetTokens(nil)
	if r := c.do("GET", "/v1/topics", nil); r.status != 200 {
		t.Errorf("without tokens: %s", r)
	}
}

func TestParseTokensReportsEveryProblem(t *testing.T) {
	_, err := gateway.ParseTokens([]byte(`
tokens:
  - name: ""
    sha256: nothex
  - name: b
    sha256: ` + gateway.HashToken("x") + `
    grants: [{actions: [destroy]}]
`))
	if err == nil {
		t.Fatal("a broken tokens file parsed")
	}
	for _, want := range []string{"name is required", "sha256 must be", `unknown action "destroy"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	// JSON is YAML too.
	if _, err := gateway.ParseTokens([]byte(`{"tokens":[{"name":"a","sha256":"` + gateway.HashToken("t") + `","grants":[{"actions":["admin"]}]}]}`)); err != nil {
		t.Errorf("JSON tokens file: %v", err)
	}
}
