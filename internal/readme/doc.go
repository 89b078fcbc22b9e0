// Package readme has no code of its own: its tests keep README.md and the
// pages under docs/ true. Every relative link leads to a file, and every
// #anchor to a heading, that exist; the README's library example compiles
// against the current API; its operator tour holds only lines the tested
// walk-through runs; the README stays a front page; and the fuzz targets
// the docs list are the ones in the code and in .ci/run.
//
// The README's commands that work on the embedded defaults are run by
// cmd/demo's TestREADMEEmbeddedDefaults, next to the command they run.
package readme
