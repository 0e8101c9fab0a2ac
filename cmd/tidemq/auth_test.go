package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"
)

// mintToken runs the token subcommand and returns the token and its
// tokens-file entry.
func mintToken(t *testing.T, args ...string) (token, entry string) {
	t.Helper()
	var out, errOut bytes.Buffer
	if code := tokenCommand(args, &out, &errOut); code != 0 {
		t.Fatalf("tidemq token %v: exit %d: %s", args, code, errOut.String())
	}
	m := regexp.MustCompile(`(?s)^token: (\S+)\n.*?\n(  - name:.*)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("token output not understood:\n%s", out.String())
	}
	return m[1], m[2]
}

func statusWith(t *testing.T, url, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestTokensFileAndSIGHUPReload: the binary takes --tokens, refuses requests
// without a granted token, and re-reads the file on SIGHUP.
func TestTokensFileAndSIGHUPReload(t *testing.T) {
	oldToken, oldEntry := mintToken(t, "-name", "ops", "-actions", "admin")
	newToken, newEntry := mintToken(t, "-name", "ops2", "-actions", "admin")
	file := filepath.Join(t.TempDir(), "tokens.yaml")
	if err := os.WriteFile(file, []byte("tokens:\n"+oldEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startTidemq(t, t.TempDir(), "--tokens", file)
	if code := statusWith(t, p.base+"/v1/topics", ""); code != 401 {
		t.Fatalf("no token: %d, want 401", code)
	}
	if code := statusWith(t, p.base+"/v1/topics", oldToken); code != 200 {
		t.Fatalf("granted token: %d, want 200", code)
	}
	if code := statusWith(t, p.base+"/healthz", ""); code != 200 {
		t.Fatalf("/healthz without token: %d", code)
	}

	if err := os.WriteFile(file, []byte("tokens:\n"+newEntry), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for statusWith(t, p.base+"/v1/topics", newToken) != 200 {
		if time.Now().After(deadline) {
			t.Fatal("SIGHUP did not load the new token")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := statusWith(t, p.base+"/v1/topics", oldToken); code != 401 {
		t.Fatalf("the removed token still works after SIGHUP: %d", code)
	}

	// A broken file on SIGHUP keeps the tokens in force.
	if err := os.WriteFile(file, []byte("tokens: [ {name: x, sha256: nothex} ]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if code := statusWith(t, p.base+"/v1/topics", newToken); code != 200 {
		t.Fatalf("a broken tokens file replaced the working one: %d", code)
	}
}

func TestTokenCommandRefusesUnknownAction(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := tokenCommand([]string{"-actions", "destroy"}, &out, &errOut); code == 0 {
		t.Fatalf("an unknown action was accepted:\n%s", out.String())
	}
}
