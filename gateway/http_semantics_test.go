package gateway_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
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
