package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Kernel modules for shim as a VM's init (vm.go): what modprobe would do
// for the few a sandbox's kernel builds as modules (virtio, vsock,
// overlayfs), without modprobe.

// kernelParams is the command line's module parameters: for module m, the
// "p=v" of every m.p=v word (QEMU's microvm and Firecracker pass their
// virtio-mmio devices so, virtio_mmio.device=...), as modprobe does.
func kernelParams(cmdlinePath string) map[string][]string {
	out := map[string][]string{}
	b, err := os.ReadFile(cmdlinePath)
	if err != nil {
		return out
	}
	for _, w := range splitCmdline(string(b)) {
		mod, param, ok := strings.Cut(w, ".")
		if !ok || !strings.Contains(param, "=") || strings.Contains(mod, "=") {
			continue
		}
		mod = strings.ReplaceAll(mod, "-", "_")
		out[mod] = append(out[mod], param)
	}
	return out
}

// loadModules loads each module with its dependencies (modules.dep of the
// running kernel), dependencies first; one already loaded is fine.
func loadModules(mods []string, params map[string][]string) error {
	if len(mods) == 0 {
		return nil
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return err
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(uts.Release[:]))
	deps, err := readModulesDep(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return err
	}
	byName := map[string]string{}
	for path := range deps {
		byName[moduleName(path)] = path
	}
	loaded := map[string]bool{}
	var errs []error
	var load func(path string, depth int)
	load = func(path string, depth int) {
		if loaded[path] || depth > 64 {
			return
		}
		loaded[path] = true
		d := deps[path]
		for i := len(d) - 1; i >= 0; i-- {
			load(d[i], depth+1)
		}
		name := moduleName(path)
		if err := finitModule(filepath.Join(dir, path), strings.Join(params[name], " ")); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	for _, m := range mods {
		path, ok := byName[strings.ReplaceAll(m, "-", "_")]
		if !ok {
			errs = append(errs, fmt.Errorf("module %s is not in %s/modules.dep (built in, or not in the image)", m, dir))
			continue
		}
		load(path, 0)
	}
	return errors.Join(errs...)
}

func finitModule(path, params string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.FinitModule(fd, params, 0); err != nil && err != unix.EEXIST {
		return err
	}
	return nil
}

// readModulesDep reads modules.dep: "path.ko: dep.ko dep.ko" a line.
func readModulesDep(path string) (map[string][]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		mod, deps, ok := strings.Cut(line, ":")
		if ok {
			out[strings.TrimSpace(mod)] = strings.Fields(deps)
		}
	}
	return out, nil
}

// moduleName is a module's name from its path: kernel/x/virtio-mmio.ko is
// virtio_mmio.
func moduleName(path string) string {
	base := filepath.Base(path)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}
