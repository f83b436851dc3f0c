// Command metrics prints the figures issue 25's closing note asks for, for
// the module in the current directory: lines and exported identifiers per
// package, the longest functions and the largest files (non-test code of
// api, client, cmd and internal). scripts/metrics adds the binary's size
// and unit coverage without root.
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type fn struct {
	name  string
	lines int
}

type file struct {
	path  string
	lines int
}

type pkg struct {
	dir      string
	lines    int
	exported int
}

func main() {
	pkgs := map[string]*pkg{}
	var fns []fn
	var files []file
	fset := token.NewFileSet()
	for _, root := range []string{"api", "client", "cmd", "internal"} {
		err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			n := fset.File(f.Pos()).LineCount()
			files = append(files, file{path, n})
			dir := filepath.Dir(path)
			p := pkgs[dir]
			if p == nil {
				p = &pkg{dir: dir}
				pkgs[dir] = p
			}
			p.lines += n
			p.exported += exported(f)
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					fns = append(fns, fn{path + ": " + funcName(fd), fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1})
				}
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "metrics:", err)
			os.Exit(1)
		}
	}
	var dirs []string
	total := 0
	for d, p := range pkgs {
		dirs = append(dirs, d)
		total += p.lines
	}
	sort.Strings(dirs)
	fmt.Printf("| package | lines | exported identifiers |\n|---|---|---|\n")
	for _, d := range dirs {
		fmt.Printf("| %s | %d | %d |\n", d, pkgs[d].lines, pkgs[d].exported)
	}
	fmt.Printf("| total | %d | |\n\n", total)
	sort.Slice(fns, func(i, j int) bool { return fns[i].lines > fns[j].lines })
	fmt.Printf("longest functions:\n")
	for _, f := range fns[:min(10, len(fns))] {
		fmt.Printf("  %4d %s\n", f.lines, f.name)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].lines > files[j].lines })
	fmt.Printf("largest files:\n")
	for _, f := range files[:min(10, len(files))] {
		fmt.Printf("  %4d %s\n", f.lines, f.path)
	}
}

// exported counts a file's exported top-level identifiers and exported
// methods.
func exported(f *ast.File) int {
	n := 0
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() {
				n++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n++
					}
				case *ast.ValueSpec:
					for _, id := range s.Names {
						if id.IsExported() {
							n++
						}
					}
				}
			}
		}
	}
	return n
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}
