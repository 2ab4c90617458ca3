package migrations

import (
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

// FS holds the embedded *.sql files.
//
//go:embed *.sql
var FS embed.FS

// Migration is one schema step.
type Migration struct {
	Version int    // from the NNNN prefix of the file name, > 0
	Name    string // file name, e.g. "0001_init.sql"
	SQL     string
}

// All returns every embedded migration in ascending version order. It fails
// on a malformed file name or a duplicate version.
func All() ([]Migration, error) {
	names, err := fs.Glob(FS, "*.sql")
	if err != nil {
		return nil, err
	}
	ms := make([]Migration, 0, len(names))
	seen := make(map[int]string, len(names))
	for _, name := range names {
		prefix, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(prefix)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migrations: bad file name %q: want NNNN_name.sql", name)
		}
		if other, dup := seen[v]; dup {
			return nil, fmt.Errorf("migrations: version %d used by %q and %q", v, other, name)
		}
		seen[v] = name
		b, err := FS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: name, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}
