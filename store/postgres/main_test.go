package postgres

import (
	"fmt"
	"os"
	"testing"
)

// TestMain drops the schemas of the benchmark fixtures, which outlive a
// single benchmark run.
func TestMain(m *testing.M) {
	code := m.Run()
	for _, f := range fixtures {
		f.s.Close()
	}
	for _, schema := range benchSchemas {
		if err := dropSchema(testURL(), schema); err != nil {
			fmt.Fprintf(os.Stderr, "drop schema %s: %v\n", schema, err)
		}
	}
	os.Exit(code)
}
