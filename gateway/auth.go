package gateway

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Actions a grant can allow (SPEC §5).
const (
	ActionPublish   = "publish"   // send
	ActionSubscribe = "subscribe" // pull, ack, nack, extend, deadletter
	ActionAdmin     = "admin"     // everything else, on every topic and group
)

// Tokens is a parsed tokens file. Only SHA-256 hashes of tokens are kept.
type Tokens struct {
	entries []tokenEntry
}

type tokenEntry struct {
	name   string
	hash   [sha256.Size]byte
	grants []Grant
}

// Grant allows actions on topics (and, for subscribe, groups) matching its
// patterns: exact names or a trailing '*'; an empty list means all.
type Grant struct {
	Actions []string `yaml:"actions" json:"actions"`
	Topics  []string `yaml:"topics" json:"topics"`
	Groups  []string `yaml:"groups" json:"groups"`
}

type tokensFile struct {
	Tokens []struct {
		Name   string  `yaml:"name"`
		SHA256 string  `yaml:"sha256"`
		Grants []Grant `yaml:"grants"`
	} `yaml:"tokens"`
}

// LoadTokens reads a tokens file (YAML or JSON).
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	return ParseTokens(data)
}

// ParseTokens parses a tokens document (YAML or JSON), reporting every
// problem it finds.
func ParseTokens(data []byte) (*Tokens, error) {
	var f tokensFile
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	var problems []error
	t := &Tokens{}
	seen := map[string]bool{}
	for i, e := range f.Tokens {
		where := fmt.Sprintf("tokens[%d] (%s)", i, e.Name)
		if e.Name == "" {
			problems = append(problems, fmt.Errorf("%s: name is required", where))
		}
		raw, err := hex.DecodeString(strings.TrimSpace(e.SHA256))
		if err != nil || len(raw) != sha256.Size {
			problems = append(problems, fmt.Errorf("%s: sha256 must be the 64 hex digits of the token's SHA-256", where))
			continue
		}
		if seen[string(raw)] {
			problems = append(problems, fmt.Errorf("%s: the same token hash appears twice", where))
		}
		seen[string(raw)] = true
		for j, g := range e.Grants {
			if len(g.Actions) == 0 {
				problems = append(problems, fmt.Errorf("%s: grants[%d] has no actions", where, j))
			}
			for _, a := range g.Actions {
				if a != ActionPublish && a != ActionSubscribe && a != ActionAdmin {
					problems = append(problems, fmt.Errorf("%s: grants[%d]: unknown action %q (publish, subscribe, admin)", where, j, a))
				}
			}
		}
		entry := tokenEntry{name: e.Name, grants: e.Grants}
		copy(entry.hash[:], raw)
		t.entries = append(t.entries, entry)
	}
	if err := errors.Join(problems...); err != nil {
		return nil, err
	}
	return t, nil
}

// HashToken is the hex SHA-256 a tokens file stores for a token.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// identify finds the entry of a bearer token. Every entry is compared in
// constant time, so the time taken says nothing about which one matched.
func (t *Tokens) identify(token string) *tokenEntry {
	h := sha256.Sum256([]byte(token))
	var found *tokenEntry
	for i := range t.entries {
		if subtle.ConstantTimeCompare(h[:], t.entries[i].hash[:]) == 1 {
			found = &t.entries[i]
		}
	}
	return found
}

func matchName(patterns []string, name string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if p == name || strings.HasSuffix(p, "*") && strings.HasPrefix(name, strings.TrimSuffix(p, "*")) {
			return true
		}
	}
	return false
}

// allows reports whether the entry may do action on topic and group ("" for
// operations not about one).
func (e *tokenEntry) allows(action, topic, group string) bool {
	for _, g := range e.grants {
		for _, a := range g.Actions {
			switch {
			case a == ActionAdmin:
				if matchName(g.Topics, topic) || topic == "" && len(g.Topics) == 0 {
					return true
				}
			case a == action && topic != "" && matchName(g.Topics, topic):
				if action != ActionSubscribe || matchName(g.Groups, group) {
					return true
				}
			}
		}
	}
	return false
}

var (
	errUnauthenticated = &httpError{kind: problemKind{401, "unauthenticated", "Unauthenticated"},
		detail: "send a valid token as Authorization: Bearer <token>", entry: -1}
	errForbidden = &httpError{kind: problemKind{403, "forbidden", "Forbidden"},
		detail: "this token has no grant for that action here", entry: -1}
)

// authorize checks the request's bearer token for action on topic/group.
// With no tokens configured everything is allowed (loopback developer
// default; the binary refuses that beyond loopback unless --insecure).
// It runs before the topic or group is looked up, so names don't leak.
func (s *Server) authorize(r *http.Request, action, topic, group string) error {
	t := s.tokens.Load()
	if t == nil {
		return nil
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		return errUnauthenticated
	}
	e := t.identify(strings.TrimSpace(token))
	if e == nil {
		return errUnauthenticated
	}
	if !e.allows(action, topic, group) {
		return errForbidden
	}
	return nil
}

// bearerToken is the token of an Authorization header in the Bearer
// scheme, whose name is case-insensitive (RFC 9110 §11.1).
func bearerToken(auth string) (string, bool) {
	scheme, token, ok := strings.Cut(auth, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", false
	}
	return token, true
}

// SetTokens replaces the tokens in force (SIGHUP reloads the file); nil
// turns authentication off.
func (s *Server) SetTokens(t *Tokens) { s.tokens.Store(t) }
