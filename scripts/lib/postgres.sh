# shellcheck shell=bash
# Fetching, patching and building PostgreSQL 15 into the cache. Sourced by scripts/setup.
#
# The build is keyed by everything that changes its output: the Debian version and the
# tarball's checksum, the patch series, the configure flags and this file. A key that is
# already built is never rebuilt; a build is made in a temporary directory and renamed into
# place only when it is complete, so an interrupted setup leaves nothing half-built behind.

pg_configure_flags() {
    local flags="--enable-debug --with-lz4 --with-zstd --with-openssl --with-libxml --with-icu"
    case "$FJORD_PG_FLAVOR" in
        debug) flags="$flags --enable-cassert" ;;
        release) ;;
        *) die "unknown FJORD_PG_FLAVOR: $FJORD_PG_FLAVOR (expected debug or release)" ;;
    esac
    echo "$flags"
}

# pg_fetch_source: leaves the upstream tarball in $FJORD_CACHE_DIR/src and sets PG_TARBALL and
# PG_DEB_VERSION. Prefers the pinned version; falls back to the newest 15.x Debian serves.
pg_fetch_source() {
    local srcdir="$FJORD_CACHE_DIR/src" upstream want
    mkdir -p "$srcdir"
    want=$PG_DEB_VERSION_PIN
    upstream=${want%%-*}
    PG_TARBALL="$srcdir/postgresql-15_${upstream}.orig.tar.bz2"
    if [ -f "$PG_TARBALL" ] && echo "$PG_ORIG_SHA256_PIN  $PG_TARBALL" | sha256sum -c --status; then
        PG_DEB_VERSION=$want
        return
    fi
    ensure_deb_src
    log "fetching postgresql-15=$want from Debian's source packages"
    if (cd "$srcdir" && apt-get source --download-only "postgresql-15=$want") >"$srcdir/fetch.log" 2>&1; then
        echo "$PG_ORIG_SHA256_PIN  $PG_TARBALL" | sha256sum -c --status ||
            die "checksum mismatch for $PG_TARBALL: expected sha256 $PG_ORIG_SHA256_PIN"
        PG_DEB_VERSION=$want
        return
    fi
    log "WARNING: the pinned postgresql-15=$want is no longer served (see $srcdir/fetch.log)"
    local v
    for v in $(apt-cache showsrc postgresql-15 | awk '/^Version:/ {print $2}' | sort -rV); do
        [ "$v" = "$want" ] && continue
        log "trying the newest served version instead: postgresql-15=$v"
        if (cd "$srcdir" && apt-get source --download-only "postgresql-15=$v") >>"$srcdir/fetch.log" 2>&1; then
            upstream=${v%%-*}
            PG_TARBALL="$srcdir/postgresql-15_${upstream}.orig.tar.bz2"
            # apt verified the tarball against Debian's signed Sources index; there is no pin
            # to compare with, so record what we got.
            log "WARNING: building unpinned PostgreSQL $v, sha256 $(sha256sum "$PG_TARBALL" | cut -d' ' -f1)"
            PG_DEB_VERSION=$v
            return
        fi
    done
    die "cannot fetch any postgresql-15 source package from Debian (see $srcdir/fetch.log)"
}

ensure_deb_src() {
    # Capture first: under pipefail, grep -q closing the pipe early would fail the check.
    local served
    served=$(apt-cache showsrc postgresql-15 2>/dev/null || true)
    if grep -q '^Version: 15\.' <<<"$served"; then
        return
    fi
    [ "$(id -u)" -eq 0 ] || die "no deb-src entry for Debian's sources; run scripts/setup as root once"
    log "adding a deb-src entry for Debian bookworm"
    cat >/etc/apt/sources.list.d/fjord-deb-src.sources <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -qq
}

# Bump when the build recipe below changes in a way that changes its output.
PG_BUILD_RECIPE=1
PG_CFLAGS="-O2 -g -fno-omit-frame-pointer"

pg_build_key() {
    local p
    {
        echo "recipe $PG_BUILD_RECIPE"
        echo "$PG_DEB_VERSION"
        sha256sum "$PG_TARBALL" | cut -d' ' -f1
        # Only the diffs matter, not the patches' descriptive headers.
        for p in "$FJORD_ROOT"/compute/patches/*.patch; do
            basename "$p"
            sed -n '/^diff /,$p' "$p"
        done
        pg_configure_flags
        echo "$PG_CFLAGS"
    } | sha256sum | cut -c1-16
}

# pg_build: sets PG_BUILD_DIR to the cached build for the current key, building it if needed.
# Layout of $PG_BUILD_DIR: install/ (bin, lib, share: what pg_config describes),
# src/ (the patched, built source tree: the reference for WAL formats and redo code),
# regress/ (pg_regress, regress.so and the regression suite's inputs).
pg_build() {
    pg_fetch_source
    local key upstream
    key=$(pg_build_key)
    upstream=${PG_DEB_VERSION%%-*}
    PG_BUILD_DIR="$FJORD_CACHE_DIR/pg15/${upstream}-${FJORD_PG_FLAVOR}-${key}"
    if [ -f "$PG_BUILD_DIR/.complete" ]; then
        log "PostgreSQL $upstream ($FJORD_PG_FLAVOR) is cached at $PG_BUILD_DIR"
        return
    fi
    local tmp="$PG_BUILD_DIR.tmp"
    rm -rf "$tmp" "$PG_BUILD_DIR"
    mkdir -p "$tmp"
    log "building PostgreSQL $upstream ($FJORD_PG_FLAVOR) into $PG_BUILD_DIR (takes 5-8 minutes)"
    tar -C "$tmp" -xjf "$PG_TARBALL"
    mv "$tmp/postgresql-$upstream" "$tmp/src"
    local p
    for p in "$FJORD_ROOT"/compute/patches/*.patch; do
        log "applying $(basename "$p")"
        patch -d "$tmp/src" -p1 --forward --batch --quiet <"$p" || die "patch $(basename "$p") does not apply to PostgreSQL $upstream"
    done
    local jobs
    jobs=$(nproc)
    # The install prefix is the final location: PostgreSQL is relocatable, but keeping
    # pg_config's answers literal avoids surprises in pgrx and PGXS.
    # shellcheck disable=SC2046
    (
        cd "$tmp/src" &&
            ./configure --prefix="$PG_BUILD_DIR/install" $(pg_configure_flags) \
                CFLAGS="$PG_CFLAGS" >"$tmp/configure.log" 2>&1 &&
            make -j"$jobs" world-bin >"$tmp/build.log" 2>&1 &&
            make -C src/test/regress -j"$jobs" all >>"$tmp/build.log" 2>&1 &&
            make install-world-bin >"$tmp/install.log" 2>&1
    ) || die "PostgreSQL build failed; see the logs in $tmp"
    # make install wrote to the final prefix; move the rest next to it.
    rm -rf "$PG_BUILD_DIR/src" "$PG_BUILD_DIR"/*.log
    mkdir -p "$PG_BUILD_DIR"
    mv "$tmp/src" "$tmp"/*.log "$PG_BUILD_DIR/"
    rmdir "$tmp"
    chmod -R a+rX "$PG_BUILD_DIR"
    touch "$PG_BUILD_DIR/.complete"
    log "PostgreSQL $upstream built"
}

# pg_regress_assemble: gathers what an installcheck-style run of the regression suite needs
# into $PG_BUILD_DIR/regress: pg_regress, the suite's inputs, and the C libraries its tests
# load (regress.so, and refint.so and autoinc.so from contrib/spi, which the triggers test
# expects beside regress.so, as the regress Makefile arranges). Versioned by its own stamp
# so that changing this step does not rebuild PostgreSQL.
PG_REGRESS_RECIPE=2
pg_regress_assemble() {
    local stamp="$PG_BUILD_DIR/regress/.complete-$PG_REGRESS_RECIPE"
    [ -f "$stamp" ] && return
    local r="$PG_BUILD_DIR/src/src/test/regress" out="$PG_BUILD_DIR/regress"
    rm -rf "$out"
    mkdir -p "$out"
    cp -a "$r/pg_regress" "$r/regress.so" "$r/parallel_schedule" "$r/resultmap" \
        "$r/sql" "$r/expected" "$r/data" "$out/"
    cp -a "$PG_BUILD_DIR/src/contrib/spi/refint.so" "$PG_BUILD_DIR/src/contrib/spi/autoinc.so" "$out/"
    chmod -R a+rX "$out"
    touch "$stamp"
}
