package migrations

import (
	"strings"
	"testing"
)

func TestAllOrderedAndNonEmpty(t *testing.T) {
	ms, err := All()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) == 0 {
		t.Fatal("got 0 migrations, want at least 1")
	}
	for i, m := range ms {
		if i > 0 && m.Version <= ms[i-1].Version {
			t.Errorf("migration %q: version %d not above %d", m.Name, m.Version, ms[i-1].Version)
		}
		if strings.TrimSpace(m.SQL) == "" {
			t.Errorf("migration %q is empty", m.Name)
		}
	}
	if ms[0].Version != 1 {
		t.Errorf("first version = %d, want 1", ms[0].Version)
	}
}
