# shellcheck shell=bash
# Shared settings for fjord's scripts: where things live, which versions are pinned.
# Sourced, never run. Every path a script needs is derived here, once.

FJORD_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The cache lives outside the clone so that a fresh clone reuses the expensive,
# versioned builds (PostgreSQL, cargo-pgrx, the Cargo target dir, the venv). It must be
# readable by the unprivileged user that runs postgres, hence /var/cache for root.
if [ -z "${FJORD_CACHE_DIR:-}" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        FJORD_CACHE_DIR=/var/cache/fjord
    else
        FJORD_CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/fjord"
    fi
fi

# PostgreSQL refuses to run as root. When a script is called as root, postgres (and every
# process a test starts) runs as this user instead.
FJORD_PG_USER=${FJORD_PG_USER:-fjord}

# PostgreSQL 15 comes from Debian's source package. The pin is checked against this
# sha256 of the upstream tarball; if the pinned version is no longer served, setup says so
# and falls back to the newest 15.x Debian serves.
PG_DEB_VERSION_PIN=15.18-0+deb12u1
PG_ORIG_SHA256_PIN=11df0df97fe3ea4ba9a791faaf39cee1d2fe571e78885b5b55d8517d27c323b4

# Build flavour. "debug" (the default, used by tests) has assertions on; "release" has
# them off and is what benchmarks use. Both have debug symbols.
FJORD_PG_FLAVOR=${FJORD_PG_FLAVOR:-debug}

CARGO_PGRX_VERSION=0.16.1

# MinIO, the S3 server the remote-storage tests run against, built from source. MinIO tags
# its releases RELEASE.<date>, which Go modules do not see as versions, so the pin is the
# module proxy's pseudo-version of a commit (the newest on the module proxy when pinned).
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$FJORD_CACHE_DIR/cargo-target}

log() { printf '%s fjord: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'fjord: error: %s\n' "$*" >&2; exit 1; }

# as_pg_user CMD...: run CMD as the unprivileged user when we are root, else as ourselves.
as_pg_user() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u "$FJORD_PG_USER" -- "$@"
    else
        "$@"
    fi
}

# pgrx_env: exports what cargo needs to build or lint the extension against the PostgreSQL
# build that scripts/setup made: cargo-pgrx on PATH, PGRX_HOME, and that build's pg_config
# by its real path (which names the build key, so a rebuilt PostgreSQL means rebuilt bindings).
pgrx_env() {
    local pg_config
    pg_config="$(readlink -f "$FJORD_ROOT/target/pg15")/bin/pg_config"
    [ -x "$pg_config" ] || die "no PostgreSQL build at target/pg15; run scripts/setup first"
    export PATH="$FJORD_CACHE_DIR/tools/cargo-pgrx-$CARGO_PGRX_VERSION/bin:$PATH"
    export PGRX_HOME="$FJORD_CACHE_DIR/pgrx-home"
    export PGRX_PG_CONFIG_PATH="$pg_config" FJORD_PG_CONFIG="$pg_config"
}
