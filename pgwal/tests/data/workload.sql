-- The workload whose WAL is pgwal's real-WAL fixture; regenerate.sh runs it. Each block
-- names the records it is there to produce.

-- Heap inserts, btree, smgr create; a COPY for heap2 multi-insert.
CREATE TABLE t (id int PRIMARY KEY, v text) WITH (fillfactor = 70);
INSERT INTO t SELECT g, repeat('x', 50) || g FROM generate_series(1, 400) g;
CREATE TABLE c (id int, v text);
COPY c (id) FROM PROGRAM 'seq 1 300';

-- Full-page images after each checkpoint, with every wal_compression method.
CHECKPOINT;
SET wal_compression = off;
UPDATE t SET v = v || 'a' WHERE id % 40 = 1;
CHECKPOINT;
SET wal_compression = pglz;
UPDATE t SET v = v || 'b' WHERE id % 40 = 2;
CHECKPOINT;
SET wal_compression = lz4;
UPDATE t SET v = v || 'c' WHERE id % 40 = 3;
CHECKPOINT;
SET wal_compression = zstd;
DELETE FROM t WHERE id % 40 = 4;

-- Subtransactions, an abort, two-phase commit and rollback (with a dropped relation).
BEGIN;
INSERT INTO t VALUES (1001, 's1');
SAVEPOINT a;
INSERT INTO t VALUES (1002, 's2');
SAVEPOINT b;
INSERT INTO t VALUES (1003, 's3');
RELEASE b;
COMMIT;
BEGIN;
INSERT INTO t VALUES (1004, 'aborted');
ROLLBACK;
BEGIN;
INSERT INTO t VALUES (1005, '2pc');
PREPARE TRANSACTION 'fixture-commit';
COMMIT PREPARED 'fixture-commit';
BEGIN;
CREATE TABLE t2pc (a int);
INSERT INTO t VALUES (1006, '2pc');
PREPARE TRANSACTION 'fixture-abort';
ROLLBACK PREPARED 'fixture-abort';

-- VACUUM sets visibility-map bits (heap2 visible); changes to those pages clear them.
VACUUM (FREEZE) t;
UPDATE t SET v = 'updated' WHERE id = 5;
DELETE FROM t WHERE id = 100;
INSERT INTO t VALUES (2000, 'into an all-visible page');
BEGIN;
SELECT id FROM t WHERE id = 200 FOR UPDATE;
COMMIT;
DELETE FROM c WHERE id % 10 = 0;
VACUUM (FREEZE) c;
COPY c (id) FROM PROGRAM 'seq 1 20';

-- Multixacts: a row locked by the transaction, then locked or updated by a subtransaction.
BEGIN;
SELECT id FROM t WHERE id = 300 FOR KEY SHARE;
SAVEPOINT s;
UPDATE t SET v = 'multi' WHERE id = 300;
COMMIT;
BEGIN;
SELECT id FROM t WHERE id = 301 FOR SHARE;
SAVEPOINT s;
SELECT id FROM t WHERE id = 301 FOR UPDATE;
COMMIT;

-- Truncation: VACUUM cuts empty tail pages (smgr truncate); TRUNCATE and DROP drop files
-- at commit.
DELETE FROM c WHERE id > 100;
VACUUM c;
CREATE TABLE t2 AS SELECT g FROM generate_series(1, 100) g;
TRUNCATE t2;
DROP TABLE t2;

-- The relation mapper: rewriting a mapped catalog.
VACUUM FULL pg_class;

-- Databases: FILE_COPY create (with its checkpoints) and drop.
CREATE DATABASE fixture_copy STRATEGY file_copy;
DROP DATABASE fixture_copy;

-- A segment switch, then a little work in the next segment.
SELECT pg_switch_wal() IS NOT NULL AS switched;
INSERT INTO t VALUES (3000, 'after the switch');

-- Last, because the copy that follows is megabytes of WAL the fixture cuts off.
CREATE DATABASE fixture_wal_log STRATEGY wal_log;
