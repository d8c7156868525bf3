#!/usr/bin/env bash
# Regenerates the real-WAL fixture of pgwal's integration test (tests/real_wal.rs):
#
#   wal.bin.zst       WAL from the start of one segment of a PostgreSQL 15 cluster up to
#                     (not including) the record at END_LSN, zstd-compressed. It crosses
#                     into the next segment through an XLOG_SWITCH.
#   waldump.txt.zst   `pg_waldump --bkp-details` of exactly those records, the reference the test
#                     compares every decoded record with.
#   fixture.env       START_LSN, END_LSN and SYSTEM_ID of the fixture.
#
# How the WAL is made:
# 1. initdb a fresh cluster (16 MiB segments, fjord's only supported size).
# 2. pg_resetwal it so the next transaction id (32760), multixact (2047) and member offset
#    (1635) sit just below an SLRU page boundary: the workload then crosses them and
#    PostgreSQL logs CLOG_ZEROPAGE, MULTIXACT_ZERO_OFF_PAGE and MULTIXACT_ZERO_MEM_PAGE.
#    pg_resetwal writes a shutdown checkpoint at the start of a fresh segment: that segment
#    start is START_LSN.
# 3. Start the server and run workload.sql (beside this script): DDL, inserts, COPY, index,
#    updates and deletes before and after VACUUM (visibility-map bits), row locks, a
#    multixact, subtransactions, abort, two-phase commit and rollback, TRUNCATE, VACUUM FULL
#    of pg_class (relmap update), CREATE/DROP DATABASE with the FILE_COPY strategy,
#    checkpoints between phases that log full-page images with wal_compression off, pglz,
#    lz4 and zstd, a pg_switch_wal(), and last CREATE DATABASE with the WAL_LOG strategy.
# 4. Cut the WAL 40 records after the XLOG_DBASE_CREATE_WAL_LOG record (the copy of the
#    template database that follows would make the fixture megabytes long).
#
# Requirements: a PostgreSQL 15 build with lz4 and zstd (PGBIN, default: the one fjord's
# scripts/setup builds under /var/cache/fjord/pg15), the zstd CLI, root (PostgreSQL runs as
# the unprivileged user `fjord`, created if missing) or running as a non-root user directly.
# The output differs from run to run (system identifier, timestamps); the test reads the
# expected values from the files this script writes, so any regenerated fixture passes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
PGBIN=${PGBIN:-$(ls -d /var/cache/fjord/pg15/*/install/bin 2>/dev/null | head -n 1)}
[ -x "$PGBIN/postgres" ] || { echo "no PostgreSQL 15 binaries found; set PGBIN" >&2; exit 1; }

work=$(mktemp -d /tmp/pgwal-fixture.XXXXXX)
if [ "$(id -u)" = 0 ]; then
    id fjord >/dev/null 2>&1 ||
        useradd --system --user-group --home-dir /nonexistent --shell /usr/sbin/nologin fjord
    chown fjord: "$work"
    as_pg() { runuser -u fjord -- "$@"; }
else
    as_pg() { "$@"; }
fi
data=$work/data
port=$((20000 + RANDOM % 20000))
stop() { as_pg "$PGBIN/pg_ctl" -D "$data" -m fast stop >/dev/null 2>&1 || true; }
trap stop EXIT

as_pg "$PGBIN/initdb" -D "$data" -U postgres --auth=trust --no-sync >"$work/initdb.log"
as_pg "$PGBIN/pg_resetwal" -x 32760 -m 2047,1 -O 1635 -D "$data" >"$work/resetwal.log"
cat >>"$data/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work'
port = $port
max_prepared_transactions = 5
full_page_writes = on
wal_compression = off
autovacuum = off
fsync = off
max_wal_size = 1GB
checkpoint_timeout = 1h
wal_keep_size = 1GB
EOF
as_pg "$PGBIN/pg_ctl" -D "$data" -l "$work/server.log" -w start >/dev/null

psql() { as_pg "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U postgres "$@"; }
start_lsn=$(psql -At -c "SELECT redo_lsn FROM pg_control_checkpoint()")
system_id=$(psql -At -c "SELECT system_identifier FROM pg_control_system()")
psql -d postgres -f "$here/workload.sql" >"$work/workload.log"
psql -d postgres -c "CHECKPOINT" # flush everything so pg_waldump sees it

# The first record past the cut: 40 records after the WAL_LOG database creation. (pg_waldump
# exits non-zero at the end of the WAL it finds; that is expected here.)
dump() { "$PGBIN/pg_waldump" -p "$data/pg_wal" "$@"; }
dump -s "$start_lsn" >"$work/all.txt" 2>/dev/null || true
lsn_of() { sed 's/.*lsn: \([0-9A-F/]*\),.*/\1/'; }
create_lsn=$(grep -m 1 'CREATE_WAL_LOG' "$work/all.txt" | lsn_of)
end_lsn=$(grep -A 40 'CREATE_WAL_LOG' "$work/all.txt" | sed -n 41p | lsn_of)
[ -n "$create_lsn" ] && [ -n "$end_lsn" ] || { echo "no CREATE_WAL_LOG record in the WAL" >&2; exit 1; }

# Concatenate the segments that hold [start_lsn, end_lsn) and cut at end_lsn.
lsn_to_int() { local hi=${1%/*} lo=${1#*/}; echo $(((16#$hi << 32) + 16#$lo)); }
seg=$((16 * 1024 * 1024))
start=$(lsn_to_int "$start_lsn")
end=$(lsn_to_int "$end_lsn")
tli=$(psql -At -c "SELECT timeline_id FROM pg_control_checkpoint()")
first_seg=$((start / seg))
last_seg=$(((end - 1) / seg))
: >"$work/wal.bin"
for ((s = first_seg; s <= last_seg; s++)); do
    name=$(printf '%08X%08X%08X' "$tli" $((s / 256)) $((s % 256)))
    cat "$data/pg_wal/$name" >>"$work/wal.bin"
done

# The fixture starts at the page holding start_lsn (the segment start), so the decoder
# validates the long page header too.
page_start=$((start / 8192 * 8192))
start_page_lsn=$(printf '%X/%X' $((page_start >> 32)) $((page_start & 0xFFFFFFFF)))
head -c $((end - first_seg * seg)) "$work/wal.bin" | tail -c +$((page_start - first_seg * seg + 1)) |
    zstd -19 -q -f -o "$here/wal.bin.zst"
dump --bkp-details -s "$start_lsn" -e "$end_lsn" | zstd -19 -q -f -o "$here/waldump.txt.zst"
cat >"$here/fixture.env" <<EOF
START_LSN=$start_page_lsn
FIRST_RECORD_LSN=$start_lsn
END_LSN=$end_lsn
SYSTEM_ID=$system_id
EOF
echo "fixture: $start_page_lsn..$end_lsn ($(stat -c %s "$here/wal.bin.zst") bytes compressed)"
stop
rm -rf "$work"
