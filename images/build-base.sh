#!/usr/bin/env bash
# build-base.sh: make the sandbox's base image locally, without a registry.
#
# debootstrap a Debian bookworm --variant=minbase root with git and
# ca-certificates, pack it as a tarball (cached), and `docker import` it under
# the tag that images/Dockerfile uses by default:
#
#     shim-base/debian:bookworm-slim
#
# The "shim-base/" prefix marks it as a local stand-in: where a registry is
# reachable, skip this script and build with
#     docker build --build-arg BASE=debian:bookworm-slim images/
#
# Usage: images/build-base.sh [--force] [--refresh] [--tag TAG]
#                             [--mirror URL] [--cache-dir DIR] [--include PKGS]
#   --force      re-import even if TAG already exists (uses the cached tarball)
#   --refresh    debootstrap again even if a cached tarball exists (implies --force)
#   --tag        image tag (default $SHIM_BASE_TAG or shim-base/debian:bookworm-slim)
#   --mirror     Debian mirror (default: $SHIM_DEBIAN_MIRROR, else the mirror
#                configured for bookworm in /etc/apt/sources.list*, else
#                http://deb.debian.org/debian)
#   --cache-dir  where the rootfs tarball is kept (default $SHIM_IMAGE_CACHE
#                or /var/cache/shim-images)
#   --include    extra packages, comma separated (git,ca-certificates always)
#
# Needs root (debootstrap), a Docker engine and access to a Debian mirror the
# first time; later runs only need the cached tarball. Idempotent and safe to
# run concurrently (a lock serialises builds sharing a cache dir).
set -euo pipefail

SUITE=bookworm
VARIANT=minbase
TAG="${SHIM_BASE_TAG:-shim-base/debian:bookworm-slim}"
CACHE_DIR="${SHIM_IMAGE_CACHE:-/var/cache/shim-images}"
MIRROR="${SHIM_DEBIAN_MIRROR:-}"
INCLUDE="git,ca-certificates"
FORCE=0
REFRESH=0

log() { printf 'build-base: %s\n' "$*" >&2; }
die() { printf 'build-base: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--force) FORCE=1 ;;
	--refresh) REFRESH=1; FORCE=1 ;;
	--tag) TAG="${2:?--tag needs a value}"; shift ;;
	--tag=*) TAG="${1#*=}" ;;
	--mirror) MIRROR="${2:?--mirror needs a value}"; shift ;;
	--mirror=*) MIRROR="${1#*=}" ;;
	--cache-dir) CACHE_DIR="${2:?--cache-dir needs a value}"; shift ;;
	--cache-dir=*) CACHE_DIR="${1#*=}" ;;
	--include) INCLUDE="$INCLUDE,${2:?--include needs a value}"; shift ;;
	--include=*) INCLUDE="$INCLUDE,${1#*=}" ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
	shift
done

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "cannot reach the Docker engine (docker info failed)"

if [ "$FORCE" = 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
	log "$TAG already exists; nothing to do (--force to re-import, --refresh to rebuild)"
	exit 0
fi

START=$(date +%s.%N)
elapsed() { awk -v s="$START" -v e="$(date +%s.%N)" 'BEGIN{printf "%.1fs", e-s}'; }

ARCH=$(dpkg --print-architecture 2>/dev/null || true)
if [ -z "$ARCH" ]; then
	case "$(uname -m)" in
	x86_64) ARCH=amd64 ;; aarch64) ARCH=arm64 ;; *) die "unknown architecture $(uname -m)" ;;
	esac
fi

# The cache key covers everything that changes the rootfs.
INCLUDE=$(printf '%s' "$INCLUDE" | tr ',' '\n' | sed '/^$/d' | sort -u | paste -sd, -)
KEY=$(printf '%s\n' "$SUITE" "$VARIANT" "$ARCH" "$INCLUDE" | sha256sum | cut -c1-12)
TARBALL="$CACHE_DIR/debian-$SUITE-$VARIANT-$ARCH-$KEY.tar.gz"

mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/.lock"
flock 9

# Another run may have imported the tag while we waited for the lock.
if [ "$FORCE" = 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
	log "$TAG was imported by a concurrent run; nothing to do"
	exit 0
fi

# find_mirror prints the first mirror that apt on this machine uses for
# $SUITE (deb822 .sources or one-line .list), skipping -security/-updates.
find_mirror() {
	local f
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -r "$f" ] || continue
		awk -v suite="$SUITE" '
			/^[[:space:]]*deb[[:space:]]/ {
				i = 2
				if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; i++ }
				if ($(i+1) == suite) { print $i; exit }
			}' "$f"
	done
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -r "$f" ] || continue
		awk -v suite="$SUITE" '
			function flush() {
				if (enabled && types ~ /(^| )deb( |$)/ && (" " suites " ") ~ (" " suite " ") && uri != "") { print uri; found = 1; exit }
				types = ""; suites = ""; uri = ""; enabled = 1
			}
			BEGIN { enabled = 1 }
			/^[[:space:]]*$/ { flush(); next }
			/^#/ { next }
			tolower($1) == "types:" { $1 = ""; types = $0 }
			tolower($1) == "suites:" { $1 = ""; suites = $0; gsub(/^ +| +$/, "", suites) }
			tolower($1) == "uris:" { uri = $2 }
			tolower($1) == "enabled:" { enabled = (tolower($2) != "no") }
			END { if (!found) flush() }' "$f"
	done
}

if [ "$REFRESH" = 1 ] || [ ! -s "$TARBALL" ]; then
	[ "$(id -u)" = 0 ] || die "debootstrap needs root (run with sudo), or provide a cached $TARBALL"
	if ! command -v debootstrap >/dev/null; then
		command -v apt-get >/dev/null || die "debootstrap is missing and apt-get is not available to install it"
		log "installing debootstrap"
		apt-get install -y --no-install-recommends debootstrap >/dev/null 2>&1 ||
			{ apt-get update >/dev/null && apt-get install -y --no-install-recommends debootstrap >/dev/null; } ||
			die "could not install debootstrap"
	fi
	if [ -z "$MIRROR" ]; then
		MIRROR=$(find_mirror | sed -n 1p)
		MIRROR=${MIRROR:-http://deb.debian.org/debian}
	fi
	KEYRING_ARGS=()
	[ -r /usr/share/keyrings/debian-archive-keyring.gpg ] &&
		KEYRING_ARGS=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)

	WORK=$(mktemp -d "${TMPDIR:-/tmp}/shim-base.XXXXXX")
	ROOT="$WORK/rootfs"
	cleanup() {
		# A failed debootstrap can leave proc/sys mounted in the target.
		if [ -d "$ROOT" ]; then
			local m
			for m in $(awk -v r="$ROOT" 'index($2, r) == 1 { print $2 }' /proc/mounts | sort -r); do
				umount -l "$m" 2>/dev/null || true
			done
		fi
		rm -rf "$WORK"
	}
	trap cleanup EXIT

	log "debootstrap $SUITE ($VARIANT, $ARCH, +$INCLUDE) from $MIRROR"
	if ! debootstrap --variant="$VARIANT" --arch="$ARCH" --include="$INCLUDE" \
		"${KEYRING_ARGS[@]}" "$SUITE" "$ROOT" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
		tail -n 30 "$WORK/debootstrap.log" >&2
		[ -f "$ROOT/debootstrap/debootstrap.log" ] && tail -n 30 "$ROOT/debootstrap/debootstrap.log" >&2
		die "debootstrap failed"
	fi
	log "debootstrap done after $(elapsed)"

	# Slim it down the way debian:*-slim images are: no package caches or
	# lists, no docs/man pages/locales (and keep future installs from adding them).
	chroot "$ROOT" apt-get clean
	rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin \
		"$ROOT"/var/log/*.log "$ROOT"/var/log/apt/* "$ROOT"/tmp/* "$ROOT"/var/tmp/*
	cat >"$ROOT/etc/dpkg/dpkg.cfg.d/docker-slim" <<-'EOF'
		path-exclude /usr/share/doc/*
		path-include /usr/share/doc/*/copyright
		path-exclude /usr/share/man/*
		path-exclude /usr/share/info/*
		path-exclude /usr/share/locale/*
		path-include /usr/share/locale/locale.alias
		path-exclude /usr/share/groff/*
		path-exclude /usr/share/lintian/*
		path-exclude /usr/share/linda/*
	EOF
	find "$ROOT/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
	find "$ROOT/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
	rm -rf "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/* "$ROOT"/usr/share/groff/* \
		"$ROOT"/usr/share/lintian/* "$ROOT"/usr/share/linda/*
	find "$ROOT/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} + 2>/dev/null || true
	# Point apt at the public mirror, not at whatever this host used.
	cat >"$ROOT/etc/apt/sources.list" <<-EOF
		deb http://deb.debian.org/debian $SUITE main
		deb http://deb.debian.org/debian $SUITE-updates main
		deb http://deb.debian.org/debian-security $SUITE-security main
	EOF
	# The container runtime provides these.
	: >"$ROOT/etc/hostname"
	rm -f "$ROOT/etc/resolv.conf"
	rm -rf "$ROOT/debootstrap"

	log "packing $TARBALL"
	tar --numeric-owner --xattrs -C "$ROOT" -czf "$WORK/rootfs.tar.gz" .
	mv -f "$WORK/rootfs.tar.gz" "$TARBALL"
	cleanup
	trap - EXIT
else
	log "using cached $TARBALL"
fi

log "docker import -> $TAG"
OLD_ID=$(docker image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
docker import \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'CMD ["bash"]' \
	--change "LABEL org.opencontainers.image.title=shim-base/debian:$SUITE-slim" \
	--change "LABEL dev.shim.base.source=debootstrap-$SUITE-$VARIANT-$KEY" \
	--message "images/build-base.sh: debootstrap $SUITE $VARIANT +$INCLUDE" \
	"$TARBALL" "$TAG" >/dev/null
NEW_ID=$(docker image inspect --format '{{.Id}}' "$TAG")
# The image a forced re-import replaced is now dangling: remove it unless a
# container or another tag still uses it.
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
	docker image rm "$OLD_ID" >/dev/null 2>&1 || true
fi
log "$TAG ready ($(docker image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')) in $(elapsed)"
