package fanfarejs

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestFSHoldsTheSources: FS has index.d.ts and every module under src/,
// byte for byte as on disk (what a server serves is what the tests ran).
func TestFSHoldsTheSources(t *testing.T) {
	disk, err := filepath.Glob("src/*.js")
	if err != nil || len(disk) == 0 {
		t.Fatalf("no src/*.js on disk: %v", err)
	}
	want := append(disk, "index.d.ts")
	for _, name := range want {
		got, err := fs.ReadFile(FS, filepath.ToSlash(name))
		if err != nil {
			t.Errorf("FS: %v", err)
			continue
		}
		onDisk, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(onDisk) {
			t.Errorf("FS %s differs from the file on disk", name)
		}
	}
	if _, err := fs.Stat(FS, "src/index.js"); err != nil {
		t.Errorf("FS has no entry point src/index.js: %v", err)
	}
}
