# shellcheck shell=bash
# Building MinIO from source into the cache. Sourced by scripts/setup.
#
# MinIO is the real S3 server that fjord's remote-storage tests run against
# (test_runner/fixtures/minio.py). It is built with `go install` from the Go module proxy,
# the one place the build may fetch from, at the pinned MINIO_VERSION (scripts/lib/env.sh).
# Everything Go writes (modules, build cache, its config and telemetry) stays under
# $FJORD_CACHE_DIR/go, so nothing lands in $HOME. The binary is installed into a temporary
# directory and renamed into place only when complete, so an interrupted build leaves
# nothing behind; a version already built is never rebuilt. Go's caches (about 2 GB) are
# kept after a failed build, so a retry does not fetch everything again, and removed after
# a successful one: they would serve only the next change of the pin.

# minio_go: prints the go command to build with. Debian's golang is too old for MinIO
# (its go.mod wants Go 1.24), so this looks on PATH first and then in /usr/local/go, where
# the upstream tarball installs.
minio_go() {
    local go
    for go in "$(command -v go 2>/dev/null)" /usr/local/go/bin/go; do
        if [ -n "$go" ] && [ -x "$go" ]; then
            echo "$go"
            return
        fi
    done
    die "no go command on PATH or in /usr/local/go/bin; MinIO $MINIO_VERSION needs Go 1.24 or newer"
}

# minio_build: makes sure $FJORD_CACHE_DIR/tools/minio-$MINIO_VERSION/minio exists and sets
# MINIO_BIN to it.
minio_build() {
    local root="$FJORD_CACHE_DIR/tools/minio-$MINIO_VERSION"
    local gohome="$FJORD_CACHE_DIR/go" logfile="$FJORD_CACHE_DIR/logs/minio-build.log"
    local go started
    MINIO_BIN="$root/minio"
    [ -x "$MINIO_BIN" ] && return
    go=$(minio_go)
    log "building MinIO $MINIO_VERSION from source with $("$go" env GOVERSION) (takes about 10 minutes)"
    started=$(date +%s)
    mkdir -p "$FJORD_CACHE_DIR/logs" "$gohome"
    rm -rf "$root.tmp"
    # GOTOOLCHAIN=local: build with this Go or fail, never download another toolchain.
    # CGO_ENABLED=0: a static binary, as MinIO's own release builds are. -modcacherw: the
    # module cache can be deleted like any other cache.
    env GOPATH="$gohome/path" GOMODCACHE="$gohome/mod" GOCACHE="$gohome/build-cache" \
        XDG_CONFIG_HOME="$gohome/config" GOBIN="$root.tmp" GOTOOLCHAIN=local CGO_ENABLED=0 \
        GOFLAGS="-modcacherw -trimpath" \
        "$go" install "github.com/minio/minio@$MINIO_VERSION" >"$logfile" 2>&1 ||
        { tail -n 20 "$logfile" >&2; die "building MinIO failed; see $logfile"; }
    rm -rf "$root"
    mv "$root.tmp" "$root"
    rm -rf "$gohome"
    log "built MinIO in $(($(date +%s) - started)) s"
}
