// Package layering holds no code: its test checks the repository's import
// graph against the layering table of docs/architecture.md §2.3, so that
// `make test` fails when an import breaks the dependency direction.
//
// The table is the rules slice in layering_test.go; the test also checks
// that docs/architecture.md shows the same table row for row, that every
// package of the module sits in exactly one row, and that the rows' actual
// imports form no cycle. Imports are read with go/build from the source
// files, for several GOOS values (a file built only on one system counts
// too); nothing is compiled and no go command is run.
package layering
