// Package gitguard reads what a harness wrote: paths only through *at calls.
package gitguard

import (
	"os"
	"path/filepath"
)

func paths(dir string) {
	_, _ = os.ReadFile(filepath.Join(dir, "HEAD")) // want `atpaths: os.ReadFile takes a path`
	_, _ = os.Open(dir)                            // want `atpaths: os.Open takes a path`
	_ = os.RemoveAll(dir)                          // want `atpaths: os.RemoveAll takes a path`
	_ = filepath.WalkDir(dir, nil)                 // want `atpaths: path/filepath.WalkDir takes a path`
	_ = filepath.Join(dir, "x")
}

// state is shim's own.
//
//shimlint:allow atpaths: shim's own state dir
func state(dir string) {
	_, _ = os.ReadFile(dir)
}
