package main

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestVMConfigFromTheFileThenTheKernelCommandLine(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "init.conf")
	cmdline := filepath.Join(dir, "cmdline")
	os.WriteFile(conf, []byte("# shim in the VM\nlisten = serial:shim.ctl\nmodules=virtio_mmio, virtio_console\nlog-format=json\n\nisolation=auto\n"), 0o644)
	os.WriteFile(cmdline, []byte(`console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 shim.listen=vsock:1024 shim.log-format=text shim.hostname=sb-7 shim.halt=reboot shim.modules=vsock "shim.persist=/var/cache/a b"`+"\n"), 0o644)
	o, err := readVMConfig(conf, cmdline)
	if err != nil {
		t.Fatal(err)
	}
	want := vmOpts{
		modules: []string{"virtio_mmio", "virtio_console", "vsock"}, hostname: "sb-7", halt: "reboot",
		flags: []string{"--cgroup-root=/sys/fs/cgroup/shim", "--listen=serial:shim.ctl", "--log-format=json", "--isolation=auto",
			"--listen=vsock:1024", "--log-format=text", "--persist=/var/cache/a b"},
	}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("readVMConfig:\n got %+v\nwant %+v", o, want)
	}
	if _, code, ok := parseInit(o.flags); !ok {
		t.Fatalf("shim init refuses the VM's flags (exit %d)", code)
	}
	os.WriteFile(cmdline, []byte("shim.halt=explode\n"), 0o644)
	if _, err := readVMConfig(filepath.Join(dir, "none"), cmdline); err == nil {
		t.Fatal("shim.halt=explode accepted")
	}
	os.WriteFile(conf, []byte("listen serial:x\n"), 0o644)
	if _, err := readVMConfig(conf, filepath.Join(dir, "none")); err == nil {
		t.Fatal("a line without = accepted")
	}
}

func TestModuleParamsFromTheKernelCommandLine(t *testing.T) {
	cmdline := filepath.Join(t.TempDir(), "cmdline")
	os.WriteFile(cmdline, []byte("console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio-mmio.device=512@0xfeb00c00:11 shim.listen=vsock:1 a.b\n"), 0o644)
	got := kernelParams(cmdline)
	if want := []string{"device=512@0xfeb00e00:12", "device=512@0xfeb00c00:11"}; !reflect.DeepEqual(got["virtio_mmio"], want) {
		t.Fatalf("virtio_mmio params %q, want %q", got["virtio_mmio"], want)
	}
}

func TestModulesDepAndNames(t *testing.T) {
	dep := filepath.Join(t.TempDir(), "modules.dep")
	os.WriteFile(dep, []byte("kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\nkernel/drivers/virtio/virtio.ko:\n"), 0o644)
	deps, err := readModulesDep(dep)
	if err != nil {
		t.Fatal(err)
	}
	if got := deps["kernel/drivers/virtio/virtio_mmio.ko"]; len(got) != 2 {
		t.Fatalf("deps of virtio_mmio: %q", got)
	}
	if moduleName("kernel/net/vmw_vsock/vmw-vsock-virtio-transport.ko.xz") != "vmw_vsock_virtio_transport" {
		t.Fatal(moduleName("kernel/net/vmw_vsock/vmw-vsock-virtio-transport.ko.xz"))
	}
}

func TestNotTheKernelsInitHere(t *testing.T) {
	if os.Getpid() == 1 {
		t.Skip("the test runs as PID 1")
	}
	if isKernelInit() {
		t.Fatal("a test process taken for the kernel's init")
	}
}

func TestInitArgsFollowInit(t *testing.T) {
	if got := initArgs([]string{"init", "--log-level", "debug"}); !reflect.DeepEqual(got, []string{"--log-level", "debug"}) {
		t.Fatalf("after init: %q", got)
	}
	if got := initArgs([]string{"single", "nosplash"}); got != nil {
		t.Fatalf("stray words of the kernel command line taken as flags: %q", got)
	}
	if got := initArgs(nil); got != nil {
		t.Fatalf("no arguments: %q", got)
	}
}
