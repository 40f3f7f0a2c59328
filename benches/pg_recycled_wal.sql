-- Puts a fresh cluster's WAL in the state of one that has run a while: about 600 MB of WAL
-- written, then checkpointed, so that the segment files it used are renamed for reuse (with
-- the server's min_wal_size at 1GB, all of them are kept). A fresh cluster instead creates
-- each new 16 MB segment filled with zeros and flushed, and every commit waits meanwhile: at a
-- few thousand turns a second that is a stall of tens of milliseconds every second or two,
-- which a database in service does not have and which would otherwise be the benchmark's p99.
CREATE TABLE colloquy_bench_wal (filler TEXT);
INSERT INTO colloquy_bench_wal SELECT repeat('x', 500) FROM generate_series(1, 1000000);
DROP TABLE colloquy_bench_wal;
CHECKPOINT;
SELECT pg_switch_wal();
CHECKPOINT;
