"""Patch 0006: a server starts at an LSN named by fjord.signal without reading any WAL.

There is no pageserver here, so the test makes the data directory a pageserver basebackup
would give: it stops a server cleanly, then copies its data directory with pg_wal holding
only a fabricated segment (zeros and page headers) for END, the position right after the
shutdown checkpoint record C, and a pg_control whose checkpoint and REDO locations are END.
The relation files stay (they would be fetched from the pageserver in fjord). The server
must start from that, write its first record at END with xl_prev = C (or 0 for
"PREV LSN: none"), keep working as a primary, and restart normally after a clean stop.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from fixtures.logs import unexpected_lines
from fixtures.postgres import PgServer

# Expected in these tests' logs: the malformed, misplaced and missing signals and checkpoints
# the tests make.
pytestmark = pytest.mark.allowed_errors(r'FATAL:  (invalid contents of file|file) "fjord.signal"', r"PANIC:  could not locate a valid checkpoint record", r"LOG:  startup process \(PID \d+\) was terminated by signal 6: Aborted")

XLOG_BLCKSZ = 8192
XLOG_PAGE_MAGIC = 0xD110  # PostgreSQL 15
XLP_LONG_HEADER = 0x0002
SHORT_PHD = 24  # SizeOfXLogShortPHD
LONG_PHD = 40  # SizeOfXLogLongPHD
# ControlFileData (src/include/catalog/pg_control.h): system_identifier (8),
# pg_control_version (4), catalog_version_no (4), state (4), pad (4), time (8), then
# checkPoint at 32 and checkPointCopy at 40, whose first field is redo.
CHECKPOINT_OFF = 32
CHECKPOINT_REDO_OFF = 40


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def parse_lsn(s: str) -> int:
    hi, lo = s.split("/")
    return (int(hi, 16) << 32) | int(lo, 16)


def fmt_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def record_end(start: int, tot_len: int, seg_size: int) -> int:
    """Where the record after one of tot_len bytes at start begins (page headers skipped)."""
    pos, left = start, tot_len
    while left > 0:
        if pos % XLOG_BLCKSZ == 0:
            pos += LONG_PHD if pos % seg_size == 0 else SHORT_PHD
        n = min(left, XLOG_BLCKSZ - pos % XLOG_BLCKSZ)
        pos += n
        left -= n
    pos = (pos + 7) & ~7  # MAXALIGN
    if pos % XLOG_BLCKSZ == 0:  # the next record starts after the next page's header
        pos += LONG_PHD if pos % seg_size == 0 else SHORT_PHD
    return pos


def controldata(pg: PgServer, datadir: Path | None = None) -> dict[str, str]:
    out = pg.run(str(pg.bin / "pg_controldata"), "-D", str(datadir or pg.datadir)).stdout
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines() if ":" in line)}


def waldump(pg: PgServer, datadir: Path, start: int, n: int | None = None) -> subprocess.CompletedProcess:
    args = [str(pg.bin / "pg_waldump"), "-p", str(datadir / "pg_wal"), "-s", fmt_lsn(start)]
    if n is not None:
        args += ["-n", str(n)]
    return subprocess.run(args, capture_output=True, text=True)


WALDUMP_RE = re.compile(r"len \(rec/tot\):\s*(\d+)/\s*(\d+),.*?lsn: ([0-9A-F]+/[0-9A-F]+), prev ([0-9A-F]+/[0-9A-F]+), desc: (.*)")


def waldump_records(text: str) -> list[dict]:
    recs = []
    for line in text.splitlines():
        m = WALDUMP_RE.search(line)
        if m:
            recs.append({"tot": int(m[2]), "lsn": parse_lsn(m[3]), "prev": parse_lsn(m[4]), "desc": m[5], "line": line})
    return recs


def segment_name(tli: int, lsn: int, seg_size: int) -> str:
    segno = lsn // seg_size
    per_id = 0x100000000 // seg_size
    return f"{tli:08X}{segno // per_id:08X}{segno % per_id:08X}"


def fabricate_segment(path: Path, lsn: int, seg_size: int, sysid: int, tli: int = 1) -> None:
    """A WAL segment for lsn that is all zeros but for a long page header at its start and
    a short one on the page containing lsn (xlp_rem_len 0), as the pageserver makes it."""
    seg_start = lsn - lsn % seg_size
    buf = bytearray(seg_size)
    struct.pack_into("<HHIQI", buf, 0, XLOG_PAGE_MAGIC, XLP_LONG_HEADER, tli, seg_start, 0)
    struct.pack_into("<QII", buf, SHORT_PHD, sysid, seg_size, XLOG_BLCKSZ)
    page = lsn - lsn % XLOG_BLCKSZ
    if page != seg_start:
        struct.pack_into("<HHIQI", buf, page - seg_start, XLOG_PAGE_MAGIC, 0, tli, page, 0)
    path.write_bytes(bytes(buf))


def rewrite_control_file(path: Path, checkpoint: int, redo: int) -> None:
    """Sets pg_control's checkPoint and checkPointCopy.redo and recomputes its CRC."""
    data = bytearray(path.read_bytes())
    # The CRC is the last field: find it as the offset where it matches what precedes it.
    crc_off = next(
        off for off in range(48, 1024, 4) if struct.unpack_from("<I", data, off)[0] == crc32c(bytes(data[:off]))
    )
    struct.pack_into("<Q", data, CHECKPOINT_OFF, checkpoint)
    struct.pack_into("<Q", data, CHECKPOINT_REDO_OFF, redo)
    struct.pack_into("<I", data, crc_off, crc32c(bytes(data[:crc_off])))
    path.write_bytes(bytes(data))


def make_source(pg_factory, switch_segment: bool = False) -> tuple[PgServer, dict]:
    """A cleanly stopped server with a table; returns it and where its WAL would go on."""
    src = pg_factory("src").initdb().start()
    src.sql("CREATE TABLE t (id int PRIMARY KEY, v text)")
    src.sql("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 1000) g")
    src.sql("CREATE UNLOGGED TABLE u (id int)")
    src.sql("CHECKPOINT")
    if switch_segment:
        # The shutdown checkpoint then opens a new segment: END is on a segment's first
        # page, whose header is a long one.
        src.sql("SELECT pg_switch_wal()")
    src.stop("fast")

    cd = controldata(src)
    assert cd["Database cluster state"] == "shut down"
    c = parse_lsn(cd["Latest checkpoint location"])
    assert parse_lsn(cd["Latest checkpoint's REDO location"]) == c
    seg_size = int(cd["Bytes per WAL segment"])
    recs = waldump_records(waldump(src, src.datadir, c, 1).stdout)
    assert len(recs) == 1 and recs[0]["lsn"] == c and "CHECKPOINT_SHUTDOWN" in recs[0]["desc"], recs
    end = record_end(c, recs[0]["tot"], seg_size)
    return src, {"C": c, "END": end, "seg_size": seg_size, "sysid": int(cd["Database system identifier"])}


def make_basebackup(src: PgServer, dst: PgServer, info: dict, signal: str | None) -> None:
    """dst's data directory as a pageserver basebackup at END would be (relation files kept)."""
    shutil.copytree(
        src.datadir, dst.datadir,
        ignore=shutil.ignore_patterns("postmaster.pid", "postmaster.opts", "pg_internal.init"),
    )
    # No WAL but the fabricated segment, no statistics file.
    for d in ("pg_wal", "pg_stat"):
        shutil.rmtree(dst.datadir / d)
        (dst.datadir / d).mkdir(mode=0o700)
    (dst.datadir / "pg_wal" / "archive_status").mkdir(mode=0o700)
    fabricate_segment(
        dst.datadir / "pg_wal" / segment_name(1, info["END"], info["seg_size"]),
        info["END"], info["seg_size"], info["sysid"],
    )
    rewrite_control_file(dst.datadir / "global" / "pg_control", info["END"], info["END"])
    if signal is not None:
        (dst.datadir / "fjord.signal").write_text(signal)
    with open(dst.datadir / "postgresql.conf", "a") as f:
        f.write(f"port = {dst.port}\nunix_socket_directories = '{dst.datadir.parent}'\n")


def try_start(pg: PgServer) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(pg.bin / "pg_ctl"), "-D", str(pg.datadir), "-l", str(pg.logfile), "-w", "-t", "30", "start"],
        capture_output=True, text=True,
    )


@pytest.mark.parametrize("switch_segment", [False, True], ids=["mid-segment", "segment-start"])
@pytest.mark.parametrize("prev", ["C", "none"])
def test_start_at_lsn_without_wal(pg_factory, switch_segment, prev):
    src, info = make_source(pg_factory, switch_segment)
    c, end = info["C"], info["END"]
    if switch_segment:
        assert end % info["seg_size"] < XLOG_BLCKSZ
    else:
        assert end % info["seg_size"] >= XLOG_BLCKSZ
    prev_lsn = c if prev == "C" else 0
    prev_text = fmt_lsn(c) if prev == "C" else "none"

    compute = pg_factory("compute")
    make_basebackup(src, compute, info, f"LSN: {fmt_lsn(end)}\nPREV LSN: {prev_text}\n")
    cd = controldata(compute)
    assert parse_lsn(cd["Latest checkpoint location"]) == end
    assert parse_lsn(cd["Latest checkpoint's REDO location"]) == end
    # Nothing WAL-readable is there: the checkpoint record at END does not exist.
    assert waldump_records(waldump(compute, compute.datadir, end).stdout) == []

    compute.start()
    log = compute.log_text()
    assert f"starting at WAL location {fmt_lsn(end)} from file \"fjord.signal\" without reading WAL" in log, log
    assert "redo starts" not in log
    # The signal was consumed once the server was up.
    assert not (compute.datadir / "fjord.signal").exists()
    assert (compute.datadir / "fjord.signal.done").read_text().startswith(f"LSN: {fmt_lsn(end)}\n")

    assert compute.sql("SELECT count(*), sum(id) FROM t") == [(1000, 500500)]
    assert compute.sql("SELECT pg_is_in_recovery()") == [(False,)]
    assert parse_lsn(compute.sql("SELECT pg_current_wal_insert_lsn()::text")[0][0]) >= end
    compute.sql("INSERT INTO t SELECT g, 'new ' || g FROM generate_series(1001, 1100) g")
    compute.sql("INSERT INTO u VALUES (1)")
    assert compute.sql("SELECT count(*) FROM t") == [(1100,)]

    # The first record is exactly at END and points back at PREV LSN, and pg_waldump can
    # read from END (the synthesized page header lets a reader skip to it).
    r = waldump(compute, compute.datadir, end)
    recs = waldump_records(r.stdout)
    assert recs, r.stdout + r.stderr
    assert recs[0]["lsn"] == end and recs[0]["prev"] == prev_lsn, recs[0]["line"]
    for a, b in zip(recs, recs[1:]):
        assert b["prev"] == a["lsn"], b["line"]
    assert any("INSERT" in rec["desc"] and "rel" in rec["line"] for rec in recs)

    # A clean stop and a plain restart: the signal is gone, so the server starts from the
    # shutdown checkpoint it wrote itself.
    compute.stop("fast")
    ckpt = parse_lsn(controldata(compute)["Latest checkpoint location"])
    assert ckpt > end
    compute.start()
    log = compute.log_text()
    assert log.count("from file \"fjord.signal\"") == 1
    assert compute.sql("SELECT count(*) FROM t") == [(1100,)]
    compute.sql("INSERT INTO t VALUES (5000, 'after restart')")
    assert compute.sql("SELECT v FROM t WHERE id = 5000") == [("after restart",)]
    compute.stop("fast")
    # A session that closed just before the fast stop may still be exiting when it comes.
    assert unexpected_lines(compute.log_text(), ["terminating connection due to administrator command"]) == []


BAD_SIGNALS = {
    "garbage": ("hello\n", r"invalid contents of file \"fjord.signal\""),
    "missing-prev": ("LSN: {end}\n", r"invalid contents of file \"fjord.signal\""),
    "extra-line": ("LSN: {end}\nPREV LSN: none\nMORE: 1\n", r"invalid contents of file \"fjord.signal\""),
    "bad-lsn": ("LSN: 0/XYZ\nPREV LSN: none\n", r"invalid contents of file \"fjord.signal\""),
    "spaces": ("LSN:  {end}\nPREV LSN: none\n", r"invalid contents of file \"fjord.signal\""),
    "lsn-mismatch": (
        "LSN: {other}\nPREV LSN: none\n",
        r"names start LSN {other}, but the control file's latest checkpoint location is {end}",
    ),
    "prev-after-lsn": ("LSN: {end}\nPREV LSN: {other}\n", r"names previous record LSN {other}, which is not a record position before"),
}


@pytest.mark.parametrize("case", sorted(BAD_SIGNALS))
def test_malformed_signal_is_fatal(pg_factory, case):
    src, info = make_source(pg_factory)
    end = info["END"]
    fields = {"end": fmt_lsn(end), "other": fmt_lsn(end + 8)}
    content, expected = BAD_SIGNALS[case]
    compute = pg_factory("compute")
    make_basebackup(src, compute, info, content.format(**fields))
    r = try_start(compute)
    assert r.returncode != 0, r.stdout
    log = compute.log_text()
    assert re.search(r"FATAL:  .*" + expected.format(**fields), log), log
    # Nothing was consumed or written.
    assert (compute.datadir / "fjord.signal").exists()
    assert controldata(compute)["Database cluster state"] == "shut down"


def test_signal_after_the_server_ran_is_fatal(pg_factory):
    """A data directory that ran after its basebackup must not start at the stale LSN again."""
    src, info = make_source(pg_factory)
    compute = pg_factory("compute")
    signal = f"LSN: {fmt_lsn(info['END'])}\nPREV LSN: {fmt_lsn(info['C'])}\n"
    make_basebackup(src, compute, info, signal)
    compute.start()
    compute.sql("INSERT INTO t VALUES (5000, 'moves WAL on')")
    compute.stop("fast")
    (compute.datadir / "fjord.signal").write_text(signal)
    r = try_start(compute)
    assert r.returncode != 0
    assert "names start LSN" in compute.log_text()


def test_signal_with_other_startup_files_is_fatal(pg_factory):
    src, info = make_source(pg_factory)
    compute = pg_factory("compute")
    make_basebackup(src, compute, info, f"LSN: {fmt_lsn(info['END'])}\nPREV LSN: none")  # no final newline
    (compute.datadir / "recovery.signal").write_text("")
    r = try_start(compute)
    assert r.returncode != 0
    # recovery.signal alone would be archive recovery without WAL; standby.signal (with
    # or without it) makes a hot standby (patch 0009, test_runner/compute/test_replica.py).
    assert 'file "fjord.signal" cannot be combined with "recovery.signal"' in compute.log_text()
    (compute.datadir / "recovery.signal").unlink()
    (compute.datadir / "backup_label").write_text("")
    r = try_start(compute)
    assert r.returncode != 0
    assert 'file "fjord.signal" cannot be combined with "backup_label"' in compute.log_text()
    (compute.datadir / "backup_label").unlink()
    compute.start()
    assert compute.sql("SELECT count(*) FROM t") == [(1000,)]


def test_crash_before_first_checkpoint(pg_factory):
    """Known gap, pinned: after a crash before the server's first checkpoint, pg_control
    still points at the checkpoint record at END that was never in local WAL. A restart
    fails loudly; putting the signal back is refused because the state is not shut down."""
    src, info = make_source(pg_factory)
    compute = pg_factory("compute")
    signal = f"LSN: {fmt_lsn(info['END'])}\nPREV LSN: {fmt_lsn(info['C'])}\n"
    make_basebackup(src, compute, info, signal)
    compute.start()
    compute.sql("INSERT INTO t VALUES (5000, 'not checkpointed')")
    compute.stop("immediate")
    r = try_start(compute)
    assert r.returncode != 0
    assert "could not locate a valid checkpoint record" in compute.log_text()
    (compute.datadir / "fjord.signal").write_text(signal)
    r = try_start(compute)
    assert r.returncode != 0
    assert 'file "fjord.signal" found, but the control file does not say the database was shut down' in compute.log_text()


def test_without_signal_the_basebackup_does_not_start(pg_factory):
    """The fabricated directory really has no checkpoint record: only the signal starts it."""
    src, info = make_source(pg_factory)
    compute = pg_factory("compute")
    make_basebackup(src, compute, info, None)
    r = try_start(compute)
    assert r.returncode != 0
    assert "could not locate a valid checkpoint record" in compute.log_text()
