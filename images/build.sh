#!/usr/bin/env bash
# build.sh: build the static shim binary and the sandbox image.
#
# Usage: images/build.sh [--tag TAG] [--base IMAGE] [--force-base] [-- DOCKER_BUILD_ARGS...]
#   --tag         image tag (default $SHIM_IMAGE_TAG or shim-sandbox:dev)
#   --base        base image (default $SHIM_BASE_IMAGE or shim-base/debian:bookworm-slim).
#                 The default is made locally by images/build-base.sh (no registry);
#                 any other value (e.g. debian:bookworm-slim) is used as is.
#   --force-base  re-import the local base image (build-base.sh --force)
#   after --       extra arguments for docker build (e.g. --no-cache)
#
# Needs Go (the version go.mod names), gcc with libc6-dev and a Docker engine.
# The binary is built static by scripts/build for the engine's architecture
# into images/shim (ignored by git).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")
DEFAULT_BASE=shim-base/debian:bookworm-slim
TAG="${SHIM_IMAGE_TAG:-shim-sandbox:dev}"
BASE="${SHIM_BASE_IMAGE:-$DEFAULT_BASE}"
BASE_ARGS=()
EXTRA=()

log() { printf 'build: %s\n' "$*" >&2; }
die() { printf 'build: error: %s\n' "$*" >&2; exit 1; }

while [ $# -gt 0 ]; do
	case "$1" in
	--tag) TAG="${2:?--tag needs a value}"; shift ;;
	--tag=*) TAG="${1#*=}" ;;
	--base) BASE="${2:?--base needs a value}"; shift ;;
	--base=*) BASE="${1#*=}" ;;
	--force-base) BASE_ARGS+=(--force) ;;
	--) shift; EXTRA=("$@"); break ;;
	-h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) die "unknown argument: $1 (see --help)" ;;
	esac
	shift
done

now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN{printf "%.1fs", e-s}'; }
T0=$(now)

docker info >/dev/null 2>&1 || die "cannot reach the Docker engine (docker info failed)"

# 1. Base image.
t=$(now)
if [ "$BASE" = "$DEFAULT_BASE" ]; then
	"$HERE/build-base.sh" --tag "$BASE" "${BASE_ARGS[@]}"
elif ! docker image inspect "$BASE" >/dev/null 2>&1; then
	log "base $BASE is not local; docker build will try to pull it"
fi
T_BASE=$(since "$t")

# 2. Static binary for the engine's architecture.
t=$(now)
case "$(docker info --format '{{.Architecture}}')" in
x86_64|amd64) GOARCH=amd64 ;;
aarch64|arm64) GOARCH=arm64 ;;
*) die "unsupported engine architecture $(docker info --format '{{.Architecture}}')" ;;
esac
command -v go >/dev/null || die "go not found (needed to build the shim binary)"
log "scripts/build --release (linux/$GOARCH, static)"
GOARCH="$GOARCH" "$REPO/scripts/build" --release "$HERE/shim"
chmod 0755 "$HERE/shim"
T_BIN=$(since "$t")

# 3. Image. Remember the image the tag pointed to, to remove it if it ends dangling.
t=$(now)
OLD_ID=$(docker image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
log "docker build -t $TAG (BASE=$BASE)"
docker build --force-rm --build-arg "BASE=$BASE" \
	--label "dev.shim.revision=$REV" \
	-t "$TAG" "${EXTRA[@]}" "$HERE"
NEW_ID=$(docker image inspect --format '{{.Id}}' "$TAG")
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
	docker image rm "$OLD_ID" >/dev/null 2>&1 || true
fi
T_IMG=$(since "$t")

log "$TAG ready: base $T_BASE, binary $T_BIN, image $T_IMG, total $(since "$T0")"
