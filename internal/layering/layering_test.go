package layering

import (
	"errors"
	"fmt"
	"go/build"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// module is the module path; repoRoot the repository root seen from this
// package's directory.
const (
	module   = "github.com/fanfare-im/fanfare"
	repoRoot = "../.."
	docPath  = "docs/architecture.md"
)

// layer is one row of the layering table: the packages it holds (paths
// relative to the module; "x/..." is x and everything below it; a package
// belongs to the row whose path names it most closely, so an exact path
// beats x/... and x/y/... beats x/...) and the layers whose packages they
// may import. A layer may import its own packages only where it lists
// itself; "drivers" stands for the database and Redis client libraries
// (drivers below). Tests (a package's _test.go files, internal and
// external) may import what the package may, plus what tests lists:
// backends and shared suites, since tests run on the real parts. Only
// production imports are held to "drivers": a test may use any library.
type layer struct {
	name    string
	pkgs    []string
	imports []string
	tests   []string
	// stdlib: besides the listed layers, only the standard library.
	stdlib bool
	// why is the rule in words, given when an import breaks it.
	why string
}

const (
	bottomWhy  = "store, presence and limiter are the bottom layers: they import none of each other nor anything above"
	backendWhy = "a backend imports only the interface it implements (and the interfaces below it); only cmd/ chooses and wires backends"
	suiteWhy   = "a shared test suite or test helper is imported only by tests"
)

// drivers are the module paths of the database and Redis client
// libraries: importing one makes a package a backend.
var drivers = []string{
	"github.com/redis/go-redis",
	"github.com/jackc/pgx",
	"github.com/cockroachdb/pebble",
	"go.etcd.io/bbolt",
}

// rules is the layering table; docs/architecture.md §2.3 shows it as
// markdown (TestLayeringDocumented checks the two agree).
var rules = []layer{
	{name: "wire", pkgs: []string{"gateway/wire"}, stdlib: true,
		why: "the wire format is shared with the SDK: standard library only, nothing of fanfare's"},
	{name: "auth", pkgs: []string{"gateway/auth"},
		why: "token signing and checking imports nothing of fanfare's"},
	{name: "socket", pkgs: []string{"gateway/socket"}, tests: []string{"auth"},
		why: "the WebSocket layer knows nothing of chat: it imports nothing of fanfare's"},
	{name: "migrations", pkgs: []string{"migrations"},
		why: "the schema files import nothing of fanfare's"},
	{name: "test helpers", pkgs: []string{"internal/..."}, imports: []string{"drivers"},
		why: "the shared test helpers import nothing of fanfare's, so any layer's tests may use them"},

	{name: "store", pkgs: []string{"store"}, tests: []string{"store backends", "store suites"}, why: bottomWhy},
	{name: "store backends", pkgs: []string{"store/..."},
		imports: []string{"store", "migrations", "drivers"}, tests: []string{"store backends", "store suites"}, why: bottomWhy},
	{name: "store suites", pkgs: []string{"store/storetest", "store/postgres/pgtest"},
		imports: []string{"store", "drivers"}, why: bottomWhy},
	{name: "presence", pkgs: []string{"presence"}, tests: []string{"presence suites"}, why: bottomWhy},
	{name: "presence backends", pkgs: []string{"presence/..."},
		imports: []string{"presence", "drivers"}, tests: []string{"presence suites", "test helpers"}, why: bottomWhy},
	{name: "presence suites", pkgs: []string{"presence/presencetest"},
		imports: []string{"presence"}, why: bottomWhy},
	{name: "limiter", pkgs: []string{"limiter"}, tests: []string{"limiter backends", "limiter suites"}, why: bottomWhy},
	{name: "limiter backends", pkgs: []string{"limiter/..."},
		imports: []string{"limiter", "drivers"}, tests: []string{"limiter backends", "limiter suites", "test helpers"}, why: bottomWhy},
	{name: "limiter suites", pkgs: []string{"limiter/limitertest"},
		imports: []string{"limiter"}, why: bottomWhy},

	{name: "engine", pkgs: []string{"fanout/..."},
		imports: []string{"engine", "store", "presence", "limiter"},
		tests:   []string{"engine backends", "engine suites", "store backends", "store suites", "test helpers"},
		why:     "the engine imports the bottom layers' interfaces, never a backend (no Postgres, pebble or Redis package): only cmd/ chooses backends"},
	{name: "engine backends", pkgs: []string{"fanout/bus/redisbus", "fanout/redishot", "fanout/redisquota", "fanout/waitroom/redisroom", "fanout/hooks/pebblejournal", "fanout/hooks/redisjournal"},
		imports: []string{"engine", "store", "presence", "limiter", "drivers"},
		tests:   []string{"engine suites", "test helpers"}, why: backendWhy},
	{name: "engine suites", pkgs: []string{"fanout/enginetest", "fanout/bus/bustest", "fanout/waitroom/waitroomtest"},
		imports: []string{"engine", "store", "store backends"}, why: suiteWhy},

	{name: "gateway", pkgs: []string{"gateway/..."},
		imports: []string{"wire", "auth", "socket", "engine", "store", "presence", "limiter"},
		tests:   []string{"store backends"},
		why:     "the gateway sits on the engine and the bottom layers' interfaces; it chooses no backend"},
	{name: "client", pkgs: []string{"client/..."}, imports: []string{"wire"},
		why: "the Go SDK imports only the wire format"},
	{name: "web", pkgs: []string{"web/..."}, imports: []string{"gateway", "auth"},
		why: "the browser pages register on the gateway's API and reach the store and engine only through the interface they declare (DevBackend, implemented in cmd/)"},
	{name: "cmd", pkgs: []string{"cmd/..."},
		imports: []string{"wire", "auth", "socket", "migrations", "store", "store backends", "presence", "presence backends",
			"limiter", "limiter backends", "engine", "engine backends", "gateway", "client", "web", "drivers"},
		tests: []string{"store suites", "presence suites", "limiter suites", "engine suites", "test helpers"},
		why:   "the binaries wire everything, but never ship a test suite"},
}

// pkgImports are one package's imports of fanfare packages (module-relative
// paths) and, for the stdlib rule, of anything outside the standard library.
type pkgImports struct {
	prod, test []string
	prodExt    []string
}

// readGraph reads every package of the module with go/build, for several
// GOOS values so that files built on one system only are read too.
func readGraph(t *testing.T) map[string]*pkgImports {
	t.Helper()
	graph := map[string]*pkgImports{}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("no go.mod at %s: %v", root, err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
			name == "testdata" || name == "node_modules" || name == "vendor") {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		for _, goos := range []string{"linux", "darwin", "windows", "freebsd"} {
			ctx := build.Default
			ctx.GOOS = goos
			bp, err := ctx.ImportDir(path, 0)
			var noGo *build.NoGoError
			if errors.As(err, &noGo) {
				continue
			}
			if err != nil {
				return fmt.Errorf("%s (GOOS=%s): %w", rel, goos, err)
			}
			pi := graph[rel]
			if pi == nil {
				pi = &pkgImports{}
				graph[rel] = pi
			}
			for _, imp := range bp.Imports {
				if r, ok := inModule(imp); ok {
					pi.prod = appendNew(pi.prod, r)
				} else if !isStdlib(imp) {
					pi.prodExt = appendNew(pi.prodExt, imp)
				}
			}
			for _, imp := range slices.Concat(bp.TestImports, bp.XTestImports) {
				if r, ok := inModule(imp); ok && r != rel {
					pi.test = appendNew(pi.test, r)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(graph) < 20 {
		t.Fatalf("read %d packages under %s, want the whole module", len(graph), root)
	}
	return graph
}

func inModule(imp string) (string, bool) {
	if imp == module {
		return ".", true
	}
	r, ok := strings.CutPrefix(imp, module+"/")
	return r, ok
}

// isStdlib: the standard library's paths have no dot in their first element.
func isStdlib(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

func appendNew(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

// match says how closely l names pkg: 0 not at all, more the closer.
func (l *layer) match(pkg string) int {
	best := 0
	for _, p := range l.pkgs {
		if sub, ok := strings.CutSuffix(p, "/..."); ok {
			if pkg == sub || strings.HasPrefix(pkg, sub+"/") {
				best = max(best, 2*len(sub))
			}
		} else if pkg == p {
			best = max(best, 2*len(p)+1)
		}
	}
	return best
}

// layerOf returns the layers naming pkg most closely (one, when the table
// is right).
func layerOf(pkg string) []*layer {
	var ls []*layer
	best := 0
	for i := range rules {
		switch m := rules[i].match(pkg); {
		case m == 0 || m < best:
		case m > best:
			best, ls = m, []*layer{&rules[i]}
		default:
			ls = append(ls, &rules[i])
		}
	}
	return ls
}

func isDriver(imp string) bool {
	return slices.ContainsFunc(drivers, func(d string) bool { return imp == d || strings.HasPrefix(imp, d+"/") })
}

// TestLayering fails when a package imports one that its layer may not.
func TestLayering(t *testing.T) {
	graph := readGraph(t)
	pkgs := sortedKeys(graph)
	used := map[string]bool{}
	for _, pkg := range pkgs {
		ls := layerOf(pkg)
		switch len(ls) {
		case 0:
			t.Errorf("package %s is in no layer of the layering table: add it to a row of rules (internal/layering) and of %s §2.3", pkg, docPath)
			continue
		case 1:
		default:
			t.Errorf("package %s is in %d layers of the layering table, want one", pkg, len(ls))
			continue
		}
		from := ls[0]
		used[from.name] = true
		pi := graph[pkg]
		check := func(imp string, allowed []string, verb string) {
			to := layerOf(imp)
			if len(to) != 1 {
				return // reported as a package of its own
			}
			if slices.Contains(allowed, to[0].name) {
				return
			}
			may := "nothing of fanfare's"
			if len(allowed) > 0 {
				may = "only " + strings.Join(allowed, ", ")
			}
			t.Errorf("layering: %s%s %s (layer %q), but layer %q may import %s: %s (%s §2.3)",
				pkg, verb, imp, to[0].name, from.name, may, from.why, docPath)
		}
		for _, imp := range pi.prod {
			check(imp, from.imports, " imports")
		}
		for _, imp := range pi.test {
			check(imp, slices.Concat(from.imports, from.tests), "'s tests import")
		}
		for _, imp := range pi.prodExt {
			switch {
			case from.stdlib:
				t.Errorf("layering: %s imports %s, but layer %q may import the standard library only: %s (%s §2.3)",
					pkg, imp, from.name, from.why, docPath)
			case isDriver(imp) && !slices.Contains(from.imports, "drivers"):
				t.Errorf("layering: %s imports the driver %s, but layer %q may not import drivers (only backends do): %s (%s §2.3)",
					pkg, imp, from.name, from.why, docPath)
			}
		}
	}
	for _, l := range rules {
		if !used[l.name] {
			t.Errorf("layer %q of the layering table holds no package (%s): remove the row or fix its paths", l.name, strings.Join(l.pkgs, ", "))
		}
		for _, n := range slices.Concat(l.imports, l.tests) {
			if n != "drivers" && !slices.ContainsFunc(rules, func(o layer) bool { return o.name == n }) {
				t.Errorf("layer %q names layer %q, which is not in the table", l.name, n)
			}
		}
	}
}

// TestNoLayerCycle fails when the layers' production imports, as they are
// in the code, form a cycle: the table alone cannot promise that (a row may
// list another that lists it back).
func TestNoLayerCycle(t *testing.T) {
	graph := readGraph(t)
	edges := map[string]map[string]string{} // from layer -> to layer -> an import that makes the edge
	for _, pkg := range sortedKeys(graph) {
		from := layerOf(pkg)
		if len(from) != 1 {
			continue
		}
		for _, imp := range graph[pkg].prod {
			to := layerOf(imp)
			if len(to) != 1 || to[0] == from[0] {
				continue
			}
			if edges[from[0].name] == nil {
				edges[from[0].name] = map[string]string{}
			}
			if _, ok := edges[from[0].name][to[0].name]; !ok {
				edges[from[0].name][to[0].name] = pkg + " -> " + imp
			}
		}
	}
	const (
		unseen = iota
		onPath
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(n string) bool
	visit = func(n string) bool {
		state[n] = onPath
		path = append(path, n)
		for _, m := range sortedKeys(edges[n]) {
			switch state[m] {
			case onPath:
				i := slices.Index(path, m)
				cycle := append(slices.Clone(path[i:]), m)
				var via []string
				for j := 0; j+1 < len(cycle); j++ {
					via = append(via, edges[cycle[j]][cycle[j+1]])
				}
				t.Errorf("layering: the layers import each other in a cycle, %s (via %s): imports must point one way (%s §2.3)",
					strings.Join(cycle, " -> "), strings.Join(via, "; "), docPath)
				return true
			case unseen:
				if visit(m) {
					return true
				}
			}
		}
		path = path[:len(path)-1]
		state[n] = done
		return false
	}
	for _, n := range sortedKeys(edges) {
		if state[n] == unseen && visit(n) {
			return
		}
	}
}

// markdown renders the table as docs/architecture.md shows it.
func markdown() string {
	var b strings.Builder
	b.WriteString("| layer | packages | may import | its tests may also import |\n")
	b.WriteString("|---|---|---|---|\n")
	list := func(s []string, stdlib bool) string {
		out := strings.Join(s, ", ")
		if stdlib {
			out = strings.TrimPrefix(out+", standard library only", ", ")
		}
		if out == "" {
			return "nothing"
		}
		return out
	}
	for _, l := range rules {
		var pkgs []string
		for _, p := range l.pkgs {
			pkgs = append(pkgs, "`"+p+"`")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", l.name, strings.Join(pkgs, ", "), list(l.imports, l.stdlib), list(l.tests, false))
	}
	return b.String()
}

// TestLayeringDocumented fails when docs/architecture.md does not show the
// table the test enforces.
func TestLayeringDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, docPath))
	if err != nil {
		t.Fatal(err)
	}
	want := markdown()
	if !strings.Contains(string(doc), want) {
		t.Errorf("%s §2.3 does not show the layering table that internal/layering enforces; want it to contain:\n%s", docPath, want)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
