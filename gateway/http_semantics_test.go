package gateway_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/tidemq/tidemq/gateway"
)

// A 405 carries Allow with exactly the methods the path serves (RFC 9110
// §15.5.6), each of which the path then answers without a 405.
func TestMethodNotAllowedListsAllow(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	for _, tc := range []struct {
		method, path string
		allow        []string
	}{
		{"PATCH", topicPath("x"), []string{"GET", "PUT", "DELETE"}},
		{"DELETE", "/v1/topics", []string{"GET"}},
		{"POST", topicPath("x"), []string{"GET", "PUT", "DELETE"}},
		{"GET", topicPath("x") + "/messages:batch", []string{"POST"}},
		{"PUT", topicPath("x") + "/messages", []string{"GET", "POST"}},
		{"GET", topicPath("x") + "/subscriptions/g/pull", []string{"POST"}},
		{"POST", "/healthz", []string{"GET"}},
	} {
		r := c.do(tc.method, tc.path, nil)
		wantProblem(t, r, http.StatusMethodNotAllowed, "method_not_allowed")
		got := strings.Split(r.header.Get("Allow"), ", ")
		if len(r.header.Values("Allow")) != 1 || !slices.Equal(sorted(got), sorted(tc.allow)) {
			t.Errorf("%s %s: Allow %q, want %v", tc.method, tc.path, r.header.Values("Allow"), tc.allow)
		}
		for _, m := range got {
			if r := c.do(m, tc.path, nil); r.status == http.StatusMethodNotAllowed {
				t.Errorf("%s %s is in Allow but answers 405", m, tc.path)
			}
		}
	}
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// The Bearer scheme's name is case-insensitive (RFC 9110 §11.1); the token
// still must be the right one, after exactly that scheme.
func TestBearerSchemeAnyCase(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	ts.gw.SetTokens(testTokens(t))
	c := ts.client(t)
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"Bearer " + adminToken, http.StatusOK},
		{"bearer " + adminToken, http.StatusOK},
		{"BEARER " + adminToken, http.StatusOK},
		{"bEaReR " + adminToken, http.StatusOK},
		{"bearer  " + adminToken, http.StatusOK},
		{"bearer " + adminToken + "x", http.StatusUnauthorized},
		{"bearer", http.StatusUnauthorized},
		{"bearer ", http.StatusUnauthorized},
		{"Basic " + adminToken, http.StatusUnauthorized},
		{"Bearerx " + adminToken, http.StatusUnauthorized},
		{adminToken, http.StatusUnauthorized},
	} {
		r := c.do("GET", "/v1/topics", nil, hdr{"Authorization": tc.auth})
		if r.status != tc.want {
			t.Errorf("Authorization %q: %s, want %d", tc.auth, r, tc.want)
		}
	}
}

// …/messages:raw is the raw form of the send on a path of its own: the
// body byte for byte, the rest from the same headers, and nothing but
// application/octet-stream accepted.
func TestRawSendOperation(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("rawop", 1)
	subscribe(c, "rawop", "g")
	raw := topicPath("rawop") + "/messages:raw"
	body := []byte{0xff, 0x00, 'h', 'i', '\n'}
	r := c.do("POST", raw, body, hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Tag": "TagR",
		"X-Tidemq-Keys": "a, b", "X-Tidemq-Property-Region": "hz"})
	wantStatus(t, r, http.StatusCreated)
	sent := decode[sendReply](t, r)
	for _, tc := range []struct {
		body any
		h    hdr
	}{
		{`{"body":"x"}`, hdr{"Content-Type": "application/json"}},
		{`{"body":"x"}`, nil}, // no Content-Type is JSON, as everywhere
		{"x", hdr{"Content-Type": "text/plain"}},
	} {
		wantProblem(t, c.do("POST", raw, tc.body, tc.h), http.StatusUnsupportedMediaType, "unsupported_media_type")
	}
	wantProblem(t, c.do("POST", raw, []byte{}, hdr{"Content-Type": "application/octet-stream"}), http.StatusBadRequest, "invalid_request")
	wantProblem(t, c.do("POST", raw, []byte("x"), hdr{"Content-Type": "application/octet-stream", "X-Tidemq-Tag": "a b"}),
		http.StatusBadRequest, "invalid_request")

	msgs := c.pull("rawop", "g", map[string]any{"maxMessages": 10})
	if len(msgs) != 1 {
		t.Fatalf("pulled %d messages, want the 1 accepted", len(msgs))
	}
	m := msgs[0]
	if got, err := base64.StdEncoding.DecodeString(m.Body); m.MessageID != sent.MessageID || m.BodyEncoding != "base64" || err != nil || !bytes.Equal(got, body) {
		t.Errorf("pulled %s %q (%s), want %s with base64 of %x", m.MessageID, m.Body, m.BodyEncoding, sent.MessageID, body)
	}
	if m.Tag != "TagR" || strings.Join(m.Keys, "|") != "a|b" || m.Properties["region"] != "hz" {
		t.Errorf("raw headers: tag %q keys %q properties %v", m.Tag, m.Keys, m.Properties)
	}
}

// An operation is documented open (security: [], no 401 or 403) exactly
// when the server answers it without a token while tokens are in force.
func TestOpenOperationsAreDocumentedOpen(t *testing.T) {
	t.Parallel()
	ts := startServer(t, serverConfig{})
	ts.gw.SetTokens(testTokens(t))
	doc, err := gateway.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("{topic}", "t", "{group}", "g", "{messageId}", "m", "*", "app.js")
	open := 0
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+fill.Replace(path), nil)
			if err != nil {
				t.Fatal(err)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			served := res.StatusCode != http.StatusUnauthorized
			documented := op.Security != nil && len(*op.Security) == 0
			refusals := op.Responses.Value("401") != nil || op.Responses.Value("403") != nil
			if served != documented || documented == refusals {
				t.Errorf("%s %s: answers %d without a token; the spec has security: [] %v, 401/403 %v", method, path, res.StatusCode, documented, refusals)
			}
			if served {
				open++
			}
		}
	}
	if open < 6 { // healthz, readyz, openapi.yaml, docs, console, console/*
		t.Errorf("only %d operations answered without a token", open)
	}
}

// A subscription's alerts block names every threshold, null when unset,
// as the spec requires (the client checks the reply against openapi.yaml).
func TestSubscriptionAlertsReplyNamesEveryField(t *testing.T) {
	t.Parallel()
	c := startServer(t, serverConfig{}).client(t)
	c.createTopic("alerted", 1)
	r := c.do("PUT", subPath("alerted", "g"), map[string]any{"alerts": map[string]any{"maxLag": 5}})
	wantStatus(t, r, http.StatusCreated)
	var sub struct {
		Alerts map[string]any `json:"alerts"`
	}
	if err := json.Unmarshal(r.body, &sub); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]any{"maxLag": 5.0, "maxDlq": nil, "webhookUrl": nil} {
		if got, ok := sub.Alerts[name]; !ok || got != want {
			t.Errorf("alerts.%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
}
