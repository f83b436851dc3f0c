// Package gitformat reads git's formats from bytes: it opens nothing by path.
package gitformat

import "os"

func open(dir string) {
	_, _ = os.ReadFile(dir) // want `atpaths: os.ReadFile takes a path`
}
