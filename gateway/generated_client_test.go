package gateway_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemq/tidemq"
)

// tsClientDir holds the npm project of the generated-client test: exact
// versions in package.json and package-lock.json, the strict tsconfig.json
// and quickstart.ts, the flow.
const tsClientDir = "testdata/tsclient"

// TestGeneratedTypeScriptClient generates a TypeScript client from the
// embedded openapi.yaml with @hey-api/openapi-ts, type-checks the README's
// quickstart written against it (tsc, strict; noEmitOnError makes a type
// error fail the build) and runs it with node against a real broker on
// 127.0.0.1:0 with tokens in force. The npm packages are installed once
// per lock file into the user cache directory (npm ci). Without node or
// npm the test skips; if npm cannot install, it skips too, except under CI
// (CI set), where it fails.
func TestGeneratedTypeScriptClient(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the generated-client test runs npm, tsc and node")
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (%v): the generated-client test needs node and npm", tool, err)
		}
	}
	flow, err := os.ReadFile(filepath.Join(tsClientDir, "quickstart.ts"))
	if err != nil {
		t.Fatal(err)
	}
	if cast := castFree(string(flow)); cast != "" {
		t.Fatalf("quickstart.ts must type-check without escape hatches; it has %q", cast)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	modules := npmModules(ctx, t)

	ts := startServer(t, serverConfig{})
	ts.gw.SetTokens(testTokens(t))
	work := t.TempDir()
	for _, name := range []string{"tsconfig.json", "quickstart.ts"} {
		copyFile(t, filepath.Join(tsClientDir, name), filepath.Join(work, name))
	}
	if err := os.Symlink(modules, filepath.Join(work, "node_modules")); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(work, "openapi.yaml"), tidemq.OpenAPI)
	writeFile(t, filepath.Join(work, "config.ts"), fmt.Appendf(nil,
		"export const baseUrl = %s;\nexport const token = %s;\n", strconv.Quote(ts.URL), strconv.Quote(adminToken)))

	start := time.Now()
	run(ctx, t, work, "node", filepath.Join("node_modules", "@hey-api", "openapi-ts", "bin", "run.js"),
		"--input", "openapi.yaml", "--output", "client")
	generated := time.Now()
	run(ctx, t, work, "node", filepath.Join("node_modules", "typescript", "bin", "tsc"), "-p", ".")
	checked := time.Now()
	out := run(ctx, t, work, "node", filepath.Join("out", "quickstart.js"))
	t.Logf("generate %v, type-check %v, run %v", generated.Sub(start).Round(time.Millisecond),
		checked.Sub(generated).Round(time.Millisecond), time.Since(checked).Round(time.Millisecond))
	if !strings.HasSuffix(strings.TrimSpace(out), "OK") {
		t.Fatalf("the quickstart did not finish:\n%s", out)
	}
	t.Logf("quickstart:\n%s", out)
}

// escapeHatches are the ways TypeScript code gets past the type checker:
// a cast (x as T, <T>x), any, a non-null assertion (x!.f); tsDirectives
// are the comments that silence it.
var (
	escapeHatches      = regexp.MustCompile(`\bas\s+[A-Za-z{(\[]|\bany\b|<[A-Za-z][\w.]*>\s*[\w(]|[\w)\]]!\s*[.;,)\]]`)
	tsDirectives       = regexp.MustCompile(`@ts-(ignore|expect-error|nocheck)`)
	commentsAndStrings = regexp.MustCompile("(?s)//[^\n]*|/\\*.*?\\*/|'(?:[^'\\\\\n]|\\\\.)*'|`(?:[^`\\\\]|\\\\.)*`|\"(?:[^\"\\\\\n]|\\\\.)*\"")
)

// castFree returns the first escape hatch in TypeScript source src (in
// code, outside comments and string literals; a directive anywhere), or "".
func castFree(src string) string {
	if d := tsDirectives.FindString(src); d != "" {
		return d
	}
	return escapeHatches.FindString(commentsAndStrings.ReplaceAllString(src, `""`))
}

func TestCastFreeSeesCasts(t *testing.T) {
	for src, want := range map[string]bool{
		`const x = y as Topic;`:                    true,
		`const x = (y as any).lag;`:                true,
		`const x = <Topic>y;`:                      true,
		`const x: any = y;`:                        true,
		`f(y!.lag);`:                               true,
		"// @ts-ignore\nf(y);":                     true,
		"f(y); // @ts-expect-error\n":              true,
		`const x = y.lag !== 0;`:                   false,
		`check(a && !b, 'as Topic any <T>x y!.');`: false,
		"console.log(`lag ${now.lag} as any`);":    false,
		"// no casts, no any\nconst n = 1;":        false,
		`const n: number = a.lag + a.dlq;`:         false,
		`async function main(): Promise<void> {}`:  false,
	} {
		if got := castFree(src) != ""; got != want {
			t.Errorf("castFree(%q) found an escape hatch: %v, want %v", src, got, want)
		}
	}
}

// npmModules installs the packages of package-lock.json with npm ci, once
// per lock file, into the user cache directory, and returns the
// node_modules directory.
func npmModules(ctx context.Context, t *testing.T) string {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(tsClientDir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	sum := sha256.Sum256(lock)
	dir := filepath.Join(cache, "tidemq", "tsclient-"+hex.EncodeToString(sum[:8]))
	modules := filepath.Join(dir, "node_modules")
	if _, err := os.Stat(filepath.Join(dir, "installed")); err == nil {
		return modules
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	// Installed beside the final place and renamed into it, so a run that
	// dies half-way (or a concurrent one) never leaves a half-filled
	// directory that looks installed.
	tmp, err := os.MkdirTemp(filepath.Dir(dir), "installing-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	for _, name := range []string{"package.json", "package-lock.json"} {
		copyFile(t, filepath.Join(tsClientDir, name), filepath.Join(tmp, name))
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, "npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--prefer-offline")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		msg := fmt.Sprintf("npm ci: %v\n%s", err, tail(out, 4<<10))
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skipf("cannot install the npm packages (is the registry reachable?): %s", msg)
	}
	t.Logf("npm ci into %s took %v", dir, time.Since(start).Round(time.Millisecond))
	writeFile(t, filepath.Join(tmp, "installed"), lock)
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, fs.ErrExist) {
		if _, statErr := os.Stat(filepath.Join(dir, "installed")); statErr != nil {
			t.Fatalf("moving the packages into place: %v", err)
		}
	}
	return modules
}

// run runs a command in dir and returns its output; failing, it fails the
// test with that output.
func run(ctx context.Context, t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NO_COLOR=1", "FORCE_COLOR=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(out.Bytes(), 16<<10))
	}
	return out.String()
}

func tail(b []byte, n int) string {
	if len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return string(b)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, to, b)
}

func writeFile(t *testing.T, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
