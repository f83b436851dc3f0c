#!/usr/bin/env bash
# images/vm/build.sh: a tiny microVM guest with shim as the kernel's init
# (docs/microvm.md). No registry: Debian's kernel package and this
# machine's busybox-static and git.
#
# Usage: images/vm/build.sh --shim BIN --out DIR [--conf FILE]
#   --shim   the static shim binary (scripts/build) to bake in as /init and /sbin/init
#   --out    writes DIR/vmlinuz and DIR/initrd (gzip'd newc cpio)
#   --conf   extra lines for /etc/shim/init.conf (NAME=VALUE, see docs/microvm.md)
#
# The guest: Debian's cloud kernel (linux-image-cloud-amd64, downloaded once
# into $SHIM_IMAGE_CACHE/debs) and an initramfs that is the whole root: the
# kernel modules shim loads itself (virtio-mmio and -pci, virtio-serial,
# vsock, overlayfs, veth, sock_diag), busybox-static, git with its
# libraries, /workspace (a git checkout with one commit), and shim. Everything
# but shim and init.conf is built once and cached in
# $SHIM_IMAGE_CACHE/vm/base-KEY (KEY: the kernel package, busybox, git and
# this script); a new shim costs one small cpio appended to it (the kernel
# unpacks concatenated archives in order).
set -euo pipefail

CACHE=${SHIM_IMAGE_CACHE:-/var/cache/shim-images}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SHIM= OUT= CONF=
# Modules shim loads (init.conf modules=); their dependencies come along.
# vsock_loopback is the test's: with it a guest process can dial the
# guest's own vsock listener (CID 1), which shim must refuse.
MODULES="virtio_mmio virtio_pci virtio_console vmw_vsock_virtio_transport vsock_loopback overlay veth tcp_diag udp_diag"

log() { printf 'vm-build: %s\n' "$*" >&2; }
die() { printf 'vm-build: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--shim) SHIM=${2:?}; shift ;;
	--out) OUT=${2:?}; shift ;;
	--conf) CONF=${2:?}; shift ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
	shift
done
[ -x "$SHIM" ] || die "--shim BIN: an executable shim binary is needed"
[ -n "$OUT" ] || die "--out DIR is needed"
[ "$(id -u)" = 0 ] || die "run as root (the image holds device nodes and root-owned files)"
for t in cpio gzip git dpkg-deb apt-get; do command -v "$t" >/dev/null || die "$t not found (scripts/deps installs it)"; done
{ ldd /bin/busybox 2>&1 || true; } | grep -q 'not a dynamic executable' || die "a static /bin/busybox is needed (busybox-static)"

# 1. The kernel package, once.
mkdir -p "$CACHE/debs"
kpkg() { apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}' || true; }
pkg=$(kpkg)
if [ -z "$pkg" ] && ! ls "$CACHE"/debs/linux-image-*-cloud-amd64_*.deb >/dev/null 2>&1; then
	log "apt-get update (no package list names the kernel)"
	apt-get update -qq >&2
	pkg=$(kpkg)
fi
deb=
if [ -n "$pkg" ]; then deb=$(ls "$CACHE"/debs/"${pkg}"_*.deb 2>/dev/null | tail -n1 || true); fi
if [ -z "$deb" ] && [ -n "$pkg" ]; then
	log "apt-get download $pkg"
	(cd "$CACHE/debs" && apt-get download "$pkg" >&2 2>/dev/null) || (cd "$CACHE/debs" && apt-get download "$pkg" >&2)
	deb=$(ls "$CACHE"/debs/"${pkg}"_*.deb | tail -n1)
fi
[ -n "$deb" ] || deb=$(ls "$CACHE"/debs/linux-image-*-cloud-amd64_*.deb 2>/dev/null | tail -n1 || true)
[ -n "$deb" ] || die "no kernel package: apt-get update, then run again"

# 2. The cached base: kernel, modules, busybox, git, /workspace.
key=$( (basename "$deb"; /bin/busybox --help 2>&1 | sed -n 1p; git --version; sha256sum "$0" | cut -c1-16) | sha256sum | cut -c1-16)
BASE="$CACHE/vm/base-$key"
if [ ! -s "$BASE/base.cpio.gz" ]; then
	log "building the guest's base ($BASE)"
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	dpkg-deb -x "$deb" "$tmp/deb"
	kver=$(ls "$tmp/deb/lib/modules")
	root="$tmp/root"
	mkdir -p "$root"/{bin,sbin,dev,proc,sys,run,tmp,etc/shim,root,usr/bin,usr/local/bin,var/lib/shim,lib/modules/"$kver"}
	# Modules: the closure of $MODULES through each module's depends= (its
	# .modinfo); the guest's modules.dep is written here, as depmod would
	# for these modules (the package leaves it to depmod at install).
	mdir="$tmp/deb/lib/modules/$kver"
	declare -A path_of=() want=()
	while IFS= read -r p; do
		n=${p##*/}; n=${n%%.ko*}; n=${n//-/_}
		path_of[$n]=${p#"$mdir/"}
	done < <(find "$mdir/kernel" -name '*.ko*')
	deps_of() { tr '\0' '\n' <"$mdir/$1" | sed -n 's/^depends=//p' | tr ',' ' '; }
	add() {
		local n=${1//-/_} d
		[ -n "${want[$n]:-}" ] && return
		[ -n "${path_of[$n]:-}" ] || die "module $n is not in $deb"
		want[$n]=1
		for d in $(deps_of "${path_of[$n]}"); do add "$d"; done
	}
	for m in $MODULES; do add "$m"; done
	: >"$root/lib/modules/$kver/modules.dep"
	for n in "${!want[@]}"; do
		p=${path_of[$n]}
		mkdir -p "$root/lib/modules/$kver/$(dirname "$p")"
		cp "$mdir/$p" "$root/lib/modules/$kver/$p"
		line="$p:"
		for d in $(deps_of "$p"); do line="$line ${path_of[${d//-/_}]}"; done
		echo "$line" >>"$root/lib/modules/$kver/modules.dep"
	done
	cp "$mdir/modules.builtin" "$root/lib/modules/$kver/" 2>/dev/null || true
	cp "$tmp/deb/boot/vmlinuz-$kver" "$tmp/vmlinuz"
	echo "$kver" >"$tmp/kver"
	# busybox and its applets.
	cp /bin/busybox "$root/bin/busybox"
	for a in $("$root/bin/busybox" --list); do
		[ "$a" = busybox ] || [ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
	done
	# git and its libraries.
	cp /usr/bin/git "$root/usr/bin/git"
	for lib in $(ldd /usr/bin/git | awk '/=>/{print $3} /^\t\/lib/{print $1}'); do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
	mkdir -p "$root/lib64"
	[ -e "$root/lib64/ld-linux-x86-64.so.2" ] || cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
	printf 'root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$root/etc/passwd"
	printf 'root:x:0:\ntty:x:5:\nagent:x:1000:\nnogroup:x:65534:\n' >"$root/etc/group"
	printf 'shim-vm\n' >"$root/etc/hostname"
	# The checkout a generation works in.
	git init -q -b main "$root/workspace"
	echo "a file of the guest's checkout" >"$root/workspace/README"
	git -C "$root/workspace" add README
	git -C "$root/workspace" -c user.name=shim -c user.email=shim@localhost commit -qm "the guest's baseline"
	mknod -m 600 "$root/dev/console" c 5 1
	mknod -m 666 "$root/dev/null" c 1 3
	(cd "$root" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) | gzip -1 >"$tmp/base.cpio.gz"
	mkdir -p "$CACHE/vm"
	# Into place in one rename; a build of the same base beside this one
	# (another checkout) that got there first wins, and this copy goes.
	staged=$(mktemp -d "$CACHE/vm/.base-XXXXXX")
	chmod 0755 "$staged"
	mv "$tmp/vmlinuz" "$tmp/kver" "$tmp/base.cpio.gz" "$staged/"
	mv -T "$staged" "$BASE" 2>/dev/null || rm -rf "$staged"
	# Bases of other keys go once unused for a day (another checkout may
	# be using one now).
	find "$CACHE/vm" -mindepth 1 -maxdepth 1 -name 'base-*' ! -path "$BASE" -mmin +1440 -exec rm -rf {} + 2>/dev/null || true
fi
touch "$BASE"

# 3. shim and its init.conf, appended.
tmp2=$(mktemp -d)
trap 'rm -rf "$tmp2" ${tmp:+"$tmp"}' EXIT
mkdir -p "$tmp2/usr/local/bin" "$tmp2/etc/shim" "$tmp2/sbin"
cp "$SHIM" "$tmp2/usr/local/bin/shim"
chmod 0755 "$tmp2/usr/local/bin/shim"
ln -s /usr/local/bin/shim "$tmp2/init"
ln -s /usr/local/bin/shim "$tmp2/sbin/init"
{
	echo "# written by images/vm/build.sh"
	echo "modules=$(echo $MODULES | tr ' ' ,)"
	echo "hostname=shim-vm"
	[ -z "$CONF" ] || cat "$CONF"
} >"$tmp2/etc/shim/init.conf"
mkdir -p "$OUT"
(cd "$tmp2" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) | gzip -1 >"$tmp2/shim.cpio.gz"
cat "$BASE/base.cpio.gz" "$tmp2/shim.cpio.gz" >"$OUT/initrd"
cp "$BASE/vmlinuz" "$OUT/vmlinuz"
cp "$BASE/kver" "$OUT/kver"
log "guest ready in $OUT: kernel $(cat "$BASE/kver"), initrd $(du -h "$OUT/initrd" | cut -f1)"
