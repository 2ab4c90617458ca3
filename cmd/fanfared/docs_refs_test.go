package main

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoRoot is the repository root, seen from this package's directory.
const repoRoot = "../.."

// thisFile is excepted from the scan: it spells out what it looks for.
const thisFile = "cmd/fanfared/docs_refs_test.go"

// outsideRE matches references to files that are not in the repository:
// the design bundle a development checkout keeps beside it, and its
// documents and seeds by name. Every such citation must point at a
// section of this repository's own docs instead.
var outsideRE = regexp.MustCompile(`\.\./shared\b|\b(?:DESIGN|PROTOCOL|NOTES|STYLE)\.md\b|\bseeds?/[0-9]|\bseed [0-9]{3}\b`)

// citationRE matches a cited document: a Markdown file of the repository
// named by its path from the root (docs/architecture.md, CONTRIBUTING.md).
// What follows it is read by sectionsAfter.
var citationRE = regexp.MustCompile(`\b((?:docs/)?[A-Za-z0-9_-]+\.md)\b`)

// docPathRE matches a path under docs/ (a file or a directory).
var docPathRE = regexp.MustCompile(`\bdocs/[A-Za-z0-9_./-]*[A-Za-z0-9_-]`)

// sectionRE matches one section number after a separator.
var sectionRE = regexp.MustCompile(`^(?:[\s,;/#*()-]|\band\b|\bor\b)*§([0-9]+(?:\.[0-9]+)*)`)

// headingRE matches a numbered Markdown heading: "## 4. Send path",
// "### 4.2 The queue bound".
var headingRE = regexp.MustCompile(`(?m)^#{1,6}\s+([0-9]+(?:\.[0-9]+)*)\.?\s`)

// TestDocsReferences keeps the repository standing on its own: no tracked
// file refers to a file outside it (the design bundle, its documents and
// seeds), every docs/ path a file names exists, and every citation of a
// section ("docs/architecture.md §8", "docs/protocol.md §4.2, §4.7",
// "CONTRIBUTING.md §1") names a numbered heading that exists in that
// document.
func TestDocsReferences(t *testing.T) {
	files := trackedFiles(t)
	if len(files) < 100 {
		t.Fatalf("found %d files in the repository, want the whole tree", len(files))
	}
	sections := map[string]map[string]bool{} // doc path -> section numbers
	headings := func(doc string) map[string]bool {
		if s, ok := sections[doc]; ok {
			return s
		}
		s := map[string]bool{}
		if b, err := os.ReadFile(filepath.Join(repoRoot, doc)); err == nil {
			for _, m := range headingRE.FindAllSubmatch(b, -1) {
				s[string(m[1])] = true
			}
		} else {
			s = nil
		}
		sections[doc] = s
		return s
	}

	citations := 0
	for _, rel := range files {
		if rel == thisFile {
			continue
		}
		b, err := os.ReadFile(filepath.Join(repoRoot, rel))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		if bytes.IndexByte(b, 0) >= 0 {
			continue // binary
		}
		text := string(b)
		lineOf := func(off int) int { return strings.Count(text[:off], "\n") + 1 }

		for _, loc := range outsideRE.FindAllStringIndex(text, -1) {
			t.Errorf("%s:%d: %q refers to a file outside the repository; cite docs/architecture.md, docs/protocol.md or CONTRIBUTING.md (a section: §N)",
				rel, lineOf(loc[0]), text[loc[0]:loc[1]])
		}
		for _, loc := range docPathRE.FindAllStringIndex(text, -1) {
			p := text[loc[0]:loc[1]]
			if _, err := os.Stat(filepath.Join(repoRoot, p)); err != nil {
				t.Errorf("%s:%d: %s does not exist in the repository", rel, lineOf(loc[0]), p)
			}
		}
		for _, m := range citationRE.FindAllStringSubmatchIndex(text, -1) {
			doc := text[m[2]:m[3]]
			secs := sectionsAfter(text[m[1]:])
			if len(secs) == 0 {
				continue
			}
			citations++
			ln := lineOf(m[0])
			have := headings(doc)
			if have == nil {
				t.Errorf("%s:%d: cites %s %s, which is not in the repository (paths are from the root: docs/...)", rel, ln, doc, "§"+secs[0])
				continue
			}
			for _, s := range secs {
				if !have[s] {
					t.Errorf("%s:%d: cites %s §%s, which has no such numbered section", rel, ln, doc, s)
				}
			}
		}
	}
	if citations < 50 {
		t.Errorf("found %d section citations, want the code's citations of docs/architecture.md and docs/protocol.md among them", citations)
	}
}

// sectionsAfter returns the section numbers cited right after a document
// name: "§8", "§4, §5, §8", "§4.2 and §4.7", also across a comment line
// break ("docs/architecture.md\n// §11").
func sectionsAfter(s string) []string {
	var out []string
	for {
		m := sectionRE.FindStringSubmatchIndex(s)
		if m == nil {
			return out
		}
		out = append(out, s[m[2]:m[3]])
		s = s[m[1]:]
	}
}

// trackedFiles lists the repository's tracked files (git ls-files); outside
// a git checkout it walks the tree, skipping .git and build output.
func trackedFiles(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", repoRoot, "ls-files", "-z").Output()
	if err == nil {
		var files []string
		for _, f := range strings.Split(string(out), "\x00") {
			if f == "" {
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, f)); err != nil {
				continue // deleted in the work tree, not yet committed
			}
			files = append(files, f)
		}
		return files
	}
	t.Logf("git ls-files: %v; walking the tree instead", err)
	var files []string
	err = filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, path)
		if d.IsDir() {
			if rel == ".git" || rel == "bin" || rel == "data" {
				return filepath.SkipDir
			}
			return nil
		}
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}
