// Package pebblestore is the Pebble implementation of core.Store.
//
// # Key layout
//
// Integers are big-endian and fixed-width, so keys sort in numeric order.
// Topic, subscription and cursor names are interned to u32 ids by core.
//
//	prefix  key                                          value
//	t       t topicID                                     topic record (JSON)
//	s       s subID                                       subscription record (JSON)
//	M       M subID consumerID                            cursor id u32 of a broadcast consumer
//	mI      mI                                            highest topic id u32, highest subscription/cursor id u32 ever given
//	q       q topicID queueID                             next offset u64, bytes u64
//	L       L seq                                         message record (see record.go)
//	Q       Q topicID queueID firstOffset 'r'             queue-index run: per offset from firstOffset, uvarint seq delta, varint storedAtMs delta, uvarint size, tagHash, keyHash
//	Q       Q topicID queueID offset                      seq u64, storedAtMs u64, tagHash u32, size u32, keyHash u32 (one per offset, written by earlier versions)
//	T       T topicID queueID storedAtMs firstOffset      ∅ (sparse: one per queue per commit)
//	I       I topicID bucket kind hash seq                ∅ (kind i=non-NUID message id, k=key, t=tag; n=NUID id, written before runs; bucket = storedAt hour)
//	I       I topicID dueBucket 'd' idHash parkedID       ∅ (a delayed message not yet due, found by id: written and deleted with its P record)
//	I       I topicID bucket 'r' firstDigest firstSeq     NUID id run: (digest delta, seq delta) uvarint pairs for the entries after the first
//	H       H topicID queueID offset cursorID attempt     delivery history: consumer, deliveredAt, outcome, reason, settledAt
//	C       C cursorID queueID                            acked watermark u64
//	A       A cursorID queueID offset                     ∅ (an ack above the watermark)
//	R       R id                                          parked retry: header + message record
//	P       P id                                          parked delayed send: header + message record
//	D       D dueMs id                                    kind u8 (timer of an R or P record)
//	X       X subID deadAtMs id                           dead message: attempt, cursor, reason, message record
//	U       U topicID dedupKey                            remembered send result (5 minutes)
//
// Why this shape:
//
//   - The commit log L is keyed by a broker-wide seq assigned in commit
//     order; queues keep only an index entry per message (Q), a few bytes
//     in a run: a batch's entries for consecutive offsets of one queue are
//     one key (at most 256), so a send of 100 messages over 8 queues
//     writes 8 queue-index keys. A pull reads the Q range from the last key
//     at or below its cursor (the run holding it), filters on tagHash (and,
//     for orderly subscriptions, keyHash) and reads bodies from L by seq.
//     Retention's cut rewrites the run it falls inside as the run of its
//     remaining entries, keyed at the cut, so a queue's first key is its
//     first retained offset. Per-offset keys (17 bytes, written by earlier
//     versions) are read alongside runs.
//   - A message id that is a NUID (every id the broker makes) is indexed
//     by its digest (core.IDIndex: its sequence number, which grows with
//     every id a process makes), and consecutive digests of a batch are one
//     key, a run (kind r): the first digest and seq in the key, the rest as
//     deltas in the value, at most 256 entries and 2^20 digest units from
//     the first. A lookup reads the runs of each bucket whose first digest
//     lies within 2^20 below the one it wants: that is every run that can
//     hold it. A send of 100 messages is one id-index key: per-message
//     keys (kind n, which data dirs of session 3 hold and lookups still
//     read) cost a batch send ~10% of its rate in memtable inserts and
//     compactions (docs/BENCHMARKS.md). Random hashes (kind i, older still)
//     cost a skiplist search per insert as well.
//   - Retention is a handful of range tombstones per topic: Q and H below
//     the new minimum offset, T below the cut time, I below the cut bucket
//     (time-bucket-first, so one tombstone per topic), and L below the oldest
//     seq any queue still holds. Parked (R, P) and dead (X) messages are
//     copies, so retention never removes a retry, a delayed message or a DLQ
//     entry. Deleting a topic is range tombstones too (its Q, T, I, H and q
//     ranges); its bodies in L stay until a retention pass cuts the log
//     past them, which passes do whenever the oldest held seq has moved
//     (one delete per body made a batch as large as the topic).
//   - The timer index D is scanned from the last due time processed, never
//     from the start of the prefix, so tombstones of fired timers (dropped
//     with one range tombstone a minute) are never iterated again.
//   - Leases are not stored: they live in memory (core), and losing them in
//     a crash only means redelivery, which at-least-once allows. Acks are
//     stored as a watermark per cursor and queue (C) plus the acks above it
//     (A), so out-of-order acks survive a restart.
//
// Message records (L, and the copies in R, P and X) are values of 256 bytes
// and more, which Pebble's value separation keeps in blob files: a
// compaction moves the keys and blob references, never the bodies. Blocks
// are 32 KiB (blob and data alike): a pull reads bodies in seq order, and
// each block read costs a pread and a cache allocation. A
// batch's index entries (Q, I, T) are buffered and added sorted at commit,
// after its log entries, so each memtable insert follows the previous one.
// Reading a record whose body is stored as is (bodies up to 4 KiB; larger
// ones are zstd frames) copies the value once: the body is the copy's tail
// and the message's strings point into its head (record.go), so a read
// message is one allocation plus its struct and properties map; whoever
// keeps one of its strings past the message clones it.
//
// A flush writes keys of every prefix at once (a commit appends to L, Q,
// I and q; an ack to H, A and C), so each L0 file spans nearly the whole
// key space and an L0 compaction rewrites every base-level file, however
// the keys inside interleave (no compaction of a sustained send is a
// move). Sorting the log before the indexes did not change that
// (measured); a small base level (8 MiB) and L0 compacted four files at a
// time bound the rewrite instead.
//
// Iterators are always bounded (LowerBound/UpperBound) and short-lived; no
// snapshot is held across calls.
//
// # WAL syncs
//
// On the real disk, Pebble's WAL files are wrapped (walsync.go): a WAL
// fdatasync is handed to a kernel worker through io_uring, and the syncing
// goroutine parks in the netpoller when other goroutines wait for a
// scheduler P, or polls for the completion when none does (Options.
// NoSyncSpin: the plain syscall then), instead of holding a P through the
// syscall. Where io_uring is unavailable it is the plain syscall. A commit
// the broker makes for a lone send (core.PollingBatch) waits for its sync
// the same way when syncs may spin: it applies the batch
// (DB.ApplyNoSyncWait), then, while no other goroutine waits for a P,
// polls the WAL's count of ended syncs before Batch.SyncWait, so the WAL
// flusher finds it not parked and wakes nobody (Store.commitPolling).
// Either way the commit returns once the data is durable.
//
// # WAL files
//
// Besides Pebble's files the directory may hold tidemq-wal-spare: a file
// zero-filled to the length of Pebble's next WAL (1.1 × its memtable: from
// 282 KiB after an open up to 70 MiB by default) and synced, which becomes
// that WAL in place of a new file or of a recycled one shorter than half
// of it (walspare.go). Syncing appends to
// blocks already written needs no inode write; a new file's every sync
// did. A spare is made only once the store has filled a memtable, only
// with eight full spares' worth of free disk, and in the background, 1 MiB
// written and synced at a time; tidemq-wal-spare.tmp is one being made,
// removed at the next open if a crash cut it short.
package pebblestore
