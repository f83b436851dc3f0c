package main

import (
	"bufio"
	"bytes"
	_ "embed"
	"fmt"
	"go/ast"
	"go/token"
	"go/types"
	"path"
	"strconv"
	"strings"

	"golang.org/x/tools/go/analysis"
)

const module = "github.com/shimdev/shim"

// inBinary reports whether pkg is part of the shim binary (not a test
// helper, not the clients, not this tool).
func inBinary(pkg string) bool {
	if !strings.HasPrefix(pkg, module+"/") && pkg != module {
		return false
	}
	rel := strings.TrimPrefix(pkg, module+"/")
	return (strings.HasPrefix(rel, "internal/") || strings.HasPrefix(rel, "cmd/shim")) &&
		!strings.HasPrefix(rel, "internal/testutil")
}

var oneReaper = &analysis.Analyzer{
	Name: "onereaper",
	Doc:  "only internal/reaper waits for children in the PID-1 binary",
	Run: func(pass *analysis.Pass) (any, error) {
		if !inBinary(pass.Pkg.Path()) || pass.Pkg.Path() == module+"/internal/reaper" {
			return nil, nil
		}
		eachCall(pass, "onereaper", func(call *ast.CallExpr, fn *types.Func) string {
			switch fullName(fn) {
			case "(*os/exec.Cmd).Wait", "(*os/exec.Cmd).Run", "(*os/exec.Cmd).Output", "(*os/exec.Cmd).CombinedOutput",
				"(*os.Process).Wait", "syscall.Wait4", "golang.org/x/sys/unix.Wait4":
				return fn.Name() + " waits for a child outside the reaper (one place calls wait4 in PID 1: internal/reaper)"
			}
			return ""
		})
		return nil, nil
	},
}

var hardGit = &analysis.Analyzer{
	Name: "hardgit",
	Doc:  "git runs only through gitguard's hardened runner",
	Run: func(pass *analysis.Pass) (any, error) {
		if !inBinary(pass.Pkg.Path()) {
			return nil, nil
		}
		eachCall(pass, "hardgit", func(call *ast.CallExpr, fn *types.Func) string {
			n := fullName(fn)
			if n != "os/exec.Command" && n != "os/exec.CommandContext" {
				return ""
			}
			i := 0
			if n == "os/exec.CommandContext" {
				i = 1
			}
			if len(call.Args) <= i {
				return ""
			}
			tv, ok := pass.TypesInfo.Types[call.Args[i]]
			if !ok || tv.Value == nil {
				return ""
			}
			s, err := strconv.Unquote(tv.Value.ExactString())
			if err == nil && path.Base(s) == "git" {
				return "git started outside gitguard's hardened runner"
			}
			return ""
		})
		return nil, nil
	},
}

// pathCalls are the os and path/filepath calls that take a path and follow
// what a harness may have planted in it.
var pathCalls = map[string]bool{}

func init() {
	for _, n := range []string{"Open", "OpenFile", "Create", "ReadFile", "WriteFile", "Stat", "Lstat", "Remove",
		"RemoveAll", "ReadDir", "Mkdir", "MkdirAll", "MkdirTemp", "CreateTemp", "Rename", "Chmod", "Chown",
		"Lchown", "Chtimes", "Readlink", "Symlink", "Link", "Truncate", "DirFS"} {
		pathCalls["os."+n] = true
	}
	pathCalls["path/filepath.Walk"] = true
	pathCalls["path/filepath.WalkDir"] = true
	pathCalls["path/filepath.EvalSymlinks"] = true
	pathCalls["path/filepath.Glob"] = true
}

// atPathPkgs are the packages that read what a harness wrote: gitguard
// (its worktree and git dir), snapshot (a worktree layer) and gitformat
// (git's formats, from bytes gitguard opened; it should open nothing
// itself). (layers works in
// shim's own layers dir, root 0700 with root-owned ancestors, checked
// when it is prepared; the uppers in it are walked without following
// anything, docs/layers.md.)
var atPathPkgs = map[string]bool{
	module + "/internal/gitguard":  true,
	module + "/internal/snapshot":  true,
	module + "/internal/gitformat": true,
}

var atPaths = &analysis.Analyzer{
	Name: "atpaths",
	Doc:  "gitguard, snapshot and gitformat use *at calls on directory fds, never path-taking os calls",
	Run: func(pass *analysis.Pass) (any, error) {
		if !atPathPkgs[pass.Pkg.Path()] {
			return nil, nil
		}
		eachCall(pass, "atpaths", func(call *ast.CallExpr, fn *types.Func) string {
			if n := fullName(fn); pathCalls[n] {
				return n + " takes a path and follows links: use the *at helpers on a directory fd, or say why the path is shim's own (//shimlint:allow atpaths: why)"
			}
			return ""
		})
		return nil, nil
	},
}

// Size limits.
const (
	maxFuncLines = 80
	maxFileLines = 600
)

//go:embed baseline.txt
var baselineText string

// baseline maps a function ("pkg.Func", "pkg.(*T).M") or file ("pkg/file.go")
// to the length it may not pass.
var baseline = func() map[string]int {
	m := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(baselineText))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err == nil {
			m[f[0]] = n
		}
	}
	return m
}()

var size = &analysis.Analyzer{
	Name: "size",
	Doc:  "functions of at most 80 lines, files of at most 600 (baseline.txt lists today's longer ones, which may not grow)",
	Run: func(pass *analysis.Pass) (any, error) {
		if !inBinary(pass.Pkg.Path()) && !strings.HasPrefix(pass.Pkg.Path(), module+"/api") && !strings.HasPrefix(pass.Pkg.Path(), module+"/client") {
			return nil, nil
		}
		short := strings.TrimPrefix(pass.Pkg.Path(), module+"/")
		for _, f := range pass.Files {
			file := pass.Fset.File(f.Pos())
			if file == nil || strings.HasSuffix(file.Name(), "_test.go") {
				continue
			}
			key := short + "/" + path.Base(file.Name())
			check(pass, f.Package, key, "file", file.LineCount(), maxFileLines)
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				lines := pass.Fset.Position(fd.End()).Line - pass.Fset.Position(fd.Pos()).Line + 1
				check(pass, fd.Pos(), short+"."+funcName(fd), "function", lines, maxFuncLines)
			}
		}
		return nil, nil
	},
}

func check(pass *analysis.Pass, pos token.Pos, key, what string, lines, max int) {
	if lines <= max {
		return
	}
	if b, ok := baseline[key]; ok {
		if lines > b {
			pass.Reportf(pos, "%s %s grew to %d lines (baseline %d, the limit %d): split it, do not grow it", what, key, lines, b, max)
		}
		return
	}
	pass.Reportf(pos, "%s %s is %d lines (the limit is %d)", what, key, lines, max)
}

func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	t := fd.Recv.List[0].Type
	star := ""
	if s, ok := t.(*ast.StarExpr); ok {
		star, t = "*", s.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	if ix, ok := t.(*ast.IndexListExpr); ok {
		t = ix.X
	}
	id, _ := t.(*ast.Ident)
	name := "?"
	if id != nil {
		name = id.Name
	}
	return fmt.Sprintf("(%s%s).%s", star, name, fd.Name.Name)
}

// fullName is fn's name as "pkg.F" or "(*pkg.T).M".
func fullName(fn *types.Func) string { return fn.FullName() }

// eachCall calls check on each call of a function or method in the
// package's non-test files, and reports what it returns unless the line
// (or the one above, or the enclosing function's doc) allows rule.
func eachCall(pass *analysis.Pass, rule string, check func(*ast.CallExpr, *types.Func) string) {
	for _, f := range pass.Files {
		file := pass.Fset.File(f.Pos())
		if file == nil || strings.HasSuffix(file.Name(), "_test.go") {
			continue
		}
		src, _ := pass.ReadFile(file.Name())
		allowed, comments := allowedLines(pass.Fset, f, src, rule)
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && docAllows(fd.Doc, rule) {
				continue
			}
			ast.Inspect(d, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				fn := calledFunc(pass.TypesInfo, call)
				if fn == nil {
					return true
				}
				if msg := check(call, fn); msg != "" {
					if !allowedAt(pass.Fset.Position(call.Pos()).Line, allowed, comments) {
						pass.Reportf(call.Pos(), "%s: %s", rule, msg)
					}
				}
				return true
			})
		}
	}
}

func calledFunc(info *types.Info, call *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch fun := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = fun
	case *ast.SelectorExpr:
		id = fun.Sel
	default:
		return nil
	}
	fn, _ := info.Uses[id].(*types.Func)
	return fn
}

// allowedLines lists the lines of f with a //shimlint:allow comment for
// rule, and the lines that hold only a comment.
func allowedLines(fset *token.FileSet, f *ast.File, src []byte, rule string) (allowed, comments map[int]bool) {
	allowed, comments = map[int]bool{}, map[int]bool{}
	for _, cg := range f.Comments {
		for _, c := range cg.List {
			p := fset.Position(c.Pos())
			l := p.Line
			if p.Offset <= len(src) && len(bytes.TrimSpace(src[p.Offset-p.Column+1:p.Offset])) == 0 {
				comments[l] = true
			}
			if allows(c.Text, rule) {
				allowed[l] = true
			}
		}
	}
	return allowed, comments
}

// allowedAt reports whether line, or a line of the comment lines right
// above it, allows the rule.
func allowedAt(line int, allowed, comments map[int]bool) bool {
	if allowed[line] {
		return true
	}
	for l := line - 1; comments[l]; l-- {
		if allowed[l] {
			return true
		}
	}
	return false
}

// allows reports whether a comment's text allows rule: the marker, the
// rule's name and a reason after a colon.
func allows(text, rule string) bool {
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "//"))
		rest, ok := strings.CutPrefix(line, "shimlint:allow "+rule+":")
		if ok && strings.TrimSpace(rest) != "" {
			return true
		}
	}
	return false
}

// docAllows reports whether a doc comment allows rule (its raw lines: Text
// drops directive-shaped lines such as this marker).
func docAllows(doc *ast.CommentGroup, rule string) bool {
	if doc == nil {
		return false
	}
	for _, c := range doc.List {
		if allows(c.Text, rule) {
			return true
		}
	}
	return false
}
