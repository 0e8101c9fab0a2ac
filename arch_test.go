package tidemq_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The arrows of docs/ARCHITECTURE.md, "Packages and their direction",
// for non-test code:
//
//	cmd/tidemq ──► gateway ──► core ◄── pebblestore
//	sdk ──► net/http (never server code); loadtest ──► sdk
//	webhook ──► core, internal/wire ◄── gateway
//
// Each rule names the packages it covers (a go list pattern) and the import
// paths none of them may depend on, directly or not.
const module = "github.com/tidemq/tidemq"

var archRules = []struct {
	pattern   string
	forbidden []string
	why       string
}{
	{"./core/...", []string{"net/http", "github.com/cockroachdb/pebble", module + "/gateway", module + "/pebblestore"},
		"core knows no HTTP and no Pebble; it defines the Store interface that pebblestore implements"},
	{"./gateway/...", []string{"github.com/cockroachdb/pebble", module + "/pebblestore"},
		"gateway knows no Pebble; cmd/tidemq wires the store in"},
	{"./sdk/...", []string{module + "/core", module + "/gateway", module + "/pebblestore"},
		"the SDK imports nothing of the server"},
	{"./loadtest/...", []string{module + "/core", module + "/gateway", module + "/pebblestore"},
		"the load tester measures what users get, through the SDK"},
	{"./pebblestore/...", []string{module + "/gateway"},
		"pebblestore implements core.Store and knows no HTTP layer"},
	{"./webhook/...", []string{module + "/gateway"},
		"the pusher drives core directly; the pulled-message JSON it posts is internal/wire's"},
	{"./mirror/...", []string{module + "/gateway", module + "/pebblestore"},
		"the mirror runner drives core through its Broker interface and reads sources through the SDK"},
	{"./internal/wire/...", []string{module + "/gateway", "net/http"},
		"wire writes JSON documents and serves no HTTP"},
}

func TestPackageDependencies(t *testing.T) {
	for _, rule := range archRules {
		t.Run(strings.Trim(rule.pattern, "./"), func(t *testing.T) {
			pkgs := goList(t, "-e", "-f", "{{if .GoFiles}}{{.ImportPath}}{{end}}", rule.pattern)
			if len(pkgs) == 0 {
				// Not written yet (sdk, loadtest); the rule applies as soon
				// as the first non-test Go file appears.
				t.Skipf("%s has no packages with non-test Go files yet", rule.pattern)
			}
			for _, pkg := range pkgs {
				if strings.HasPrefix(pkg, module+"/loadtest/cmd/") {
					// The load tester's command is wiring, like cmd/tidemq: it
					// starts an in-process broker and raw-Pebble baselines.
					// The loadtest library itself is held to the rule.
					continue
				}
				deps := goList(t, "-deps", "-f", "{{.ImportPath}}", pkg)
				bad := forbiddenDeps(deps, rule.forbidden)
				if len(bad) == 0 {
					continue
				}
				graph := importGraph(t, pkg)
				for _, f := range bad {
					t.Errorf("%s depends on %s: %s\n\t(%s)", pkg, f, strings.Join(importChain(graph, pkg, f), " → "), rule.why)
				}
			}
		})
	}
}

// TestPackageDependenciesCanFail shows the check above sees what it is
// meant to: pebblestore really does depend on Pebble and core, and
// cmd/tidemq on everything, so a rule forbidding them would fail.
func TestPackageDependenciesCanFail(t *testing.T) {
	for _, c := range []struct {
		pkg  string
		want []string
	}{
		{module + "/pebblestore", []string{"github.com/cockroachdb/pebble", module + "/core"}},
		{module + "/gateway", []string{"net/http", module + "/core"}},
		{module + "/cmd/tidemq", []string{module + "/gateway", module + "/pebblestore", "github.com/cockroachdb/pebble"}},
	} {
		deps := goList(t, "-deps", "-f", "{{.ImportPath}}", c.pkg)
		if got := forbiddenDeps(deps, c.want); !slices.Equal(got, c.want) {
			t.Errorf("dependency check of %s found %v, want %v: the check is blind", c.pkg, got, c.want)
		}
	}
	graph := importGraph(t, module+"/pebblestore")
	if chain := importChain(graph, module+"/pebblestore", "github.com/cockroachdb/pebble"); len(chain) < 2 || chain[0] != module+"/pebblestore" ||
		!strings.HasPrefix(chain[len(chain)-1], "github.com/cockroachdb/pebble") {
		t.Errorf("import chain pebblestore → pebble = %v", chain)
	}
	// Prefix matching is by path element: pebble/v2 is pebble, but a
	// package merely named like it is not.
	if got := forbiddenDeps([]string{"github.com/cockroachdb/pebble/v2/vfs", "github.com/cockroachdb/pebblex", "net/http/httptrace"},
		[]string{"github.com/cockroachdb/pebble", "net/http"}); !slices.Equal(got, []string{"github.com/cockroachdb/pebble", "net/http"}) {
		t.Errorf("forbiddenDeps = %v", got)
	}
}

// TestBrokerInterfaces holds gateway and webhook to the broker interfaces
// they declare: their non-test code names no *core.Broker, so a cluster's
// routing broker can stand behind them. An import rule cannot say this,
// since both packages rightly import core for its types.
func TestBrokerInterfaces(t *testing.T) {
	lines := goList(t, "-e", "-f", "{{.Dir}}{{range .GoFiles}} {{.}}{{end}}", "./gateway/...", "./webhook/...", "./mirror/...")
	files := 0
	for _, line := range lines {
		fields := strings.Fields(line)
		for _, name := range fields[1:] {
			path := filepath.Join(fields[0], name)
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files++
			for _, pos := range concreteBrokerUses(f) {
				t.Errorf("%s: names *core.Broker; depend on the package's Broker interface instead", fset.Position(pos))
			}
		}
	}
	if files == 0 {
		t.Fatal("no non-test Go files in gateway or webhook: the check is blind")
	}
}

// TestBrokerInterfacesCanFail shows concreteBrokerUses finds *core.Broker
// however core is imported, and only that.
func TestBrokerInterfacesCanFail(t *testing.T) {
	for _, c := range []struct {
		src  string
		want int
	}{
		{`package p; import "github.com/tidemq/tidemq/core"; type S struct{ b *core.Broker }`, 1},
		{`package p; import c "github.com/tidemq/tidemq/core"; func New(b *c.Broker, bs []*c.Broker) {}`, 2},
		{`package p; import "github.com/tidemq/tidemq/core"; var f = (*core.Broker).Send`, 1},
		{`package p; import "github.com/tidemq/tidemq/core"; type Broker interface{ Send() }; var _ *core.Message; var b Broker`, 0},
		{`package p; import core "example.com/other"; var b *core.Broker`, 0},
	} {
		f, err := parser.ParseFile(token.NewFileSet(), "p.go", c.src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		if got := len(concreteBrokerUses(f)); got != c.want {
			t.Errorf("%s: %d uses found, want %d", c.src, got, c.want)
		}
	}
}

// concreteBrokerUses returns where f names *core.Broker: a pointer to the
// selector Broker of whatever name f imports core under.
func concreteBrokerUses(f *ast.File) []token.Pos {
	coreName := ""
	for _, imp := range f.Imports {
		if p, err := strconv.Unquote(imp.Path.Value); err == nil && p == module+"/core" {
			coreName = "core"
			if imp.Name != nil {
				coreName = imp.Name.Name
			}
		}
	}
	if coreName == "" || coreName == "_" {
		return nil
	}
	var out []token.Pos
	ast.Inspect(f, func(n ast.Node) bool {
		star, ok := n.(*ast.StarExpr)
		if !ok {
			return true
		}
		x := star.X
		for {
			p, ok := x.(*ast.ParenExpr)
			if !ok {
				break
			}
			x = p.X
		}
		if sel, ok := x.(*ast.SelectorExpr); ok && sel.Sel.Name == "Broker" {
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == coreName {
				out = append(out, star.Pos())
			}
		}
		return true
	})
	return out
}

// forbiddenDeps returns each forbidden path (in the order given) that deps
// contains, itself or one of its subpackages.
func forbiddenDeps(deps, forbidden []string) []string {
	var out []string
	for _, f := range forbidden {
		for _, d := range deps {
			if d == f || strings.HasPrefix(d, f+"/") {
				out = append(out, f)
				break
			}
		}
	}
	return out
}

// importGraph maps each package pkg depends on to its imports.
func importGraph(t *testing.T, pkg string) map[string][]string {
	graph := map[string][]string{}
	for _, line := range goList(t, "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", pkg) {
		fields := strings.Fields(line)
		graph[fields[0]] = fields[1:]
	}
	return graph
}

// importChain is a shortest import path from pkg to forbidden (or one of
// its subpackages), to say where a bad dependency comes from.
func importChain(graph map[string][]string, pkg, forbidden string) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == forbidden || strings.HasPrefix(p, forbidden+"/") {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append([]string{p}, chain...)
			}
			return chain
		}
		for _, next := range graph[p] {
			if _, seen := prev[next]; !seen {
				prev[next] = p
				queue = append(queue, next)
			}
		}
	}
	return []string{pkg, "…", forbidden}
}

// goList runs `go list` in the module root (the test's working directory)
// and returns its non-empty output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", append([]string{"list"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var out []string
	for line := range strings.Lines(stdout.String()) {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}
