// Package pebblestore is the Pebble implementation of core.Store.
//
// # Files
//
// One file per record family, each holding its batch writes, its reads
// and its part of Load: meta.go (topics, subscriptions, the highest ids,
// the broker's counters and epoch), messages.go (the log, the queue index,
// the time index, queue positions), index.go (secondary indexes), parked.go
// (retries, delayed sends and their timers), transactions.go (transaction
// records; their half messages are parked records), dead.go (dead letters),
// dedup.go (remembered sends), history.go (delivery history), consumers.go
// (acks and broadcast members), attempts.go (delivery attempts), raftlog.go
// (raft groups' logs and stable stores). keys.go
// defines every key; record.go the message record; format.go the layout's
// version; batch.go and store.go what the families share; replica.go
// applying encoded batches, checkpoints and fingerprints; statesnap.go
// streaming the replicated state out and in (raft snapshots). The storage
// tricks (below) are walsync.go, fsyncring_*.go and walspare.go, their
// gauges metrics.go.
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
//	mE      mE                                            broker epoch u64, raised on every start (receipt handles carry it)
//	mI      mI                                            highest topic id u32, highest subscription/cursor id u32 ever given
//	mC      mC                                            broker counters: next seq u64, last store time ms u64, highest record id u64
//	mV      mV                                            format version u32 (format.go)
//	mR      mR                                            ∅: a RestoreState under way, the state half-replaced (statesnap.go)
//	ma      ma group                                      a raft group's applied index u64 (applied.go)
//	mw      mw group                                      the session u64 whose batches the group's state machine applies (applied.go)
//	mK      mK                                            the cluster's receipt key (32 bytes), replicated so any leader judges any handle
//	q       q topicID queueID                             next offset u64, bytes u64
//	L       L seq                                         message record (see record.go)
//	Q       Q topicID queueID firstOffset 'r'             queue-index run: per offset from firstOffset, uvarint seq delta, varint storedAtMs delta, uvarint size, tagHash, keyHash
//	T       T topicID queueID storedAtMs firstOffset      ∅ (sparse: one per queue per commit)
//	I       I topicID bucket kind hash seq                ∅ (kind i = a message id that is not a NUID, by FNV hash; k = key; t = tag; bucket = storedAt hour)
//	I       I topicID dueBucket 'd' idHash parkedID       ∅ (a delayed message not yet due, found by id: written and deleted with its P record)
//	I       I topicID bucket 'r' firstDigest firstSeq     NUID id run: (digest delta, seq delta) uvarint pairs for the entries after the first
//	H       H topicID queueID offset cursorID attempt     delivery history: consumer, deliveredAt, outcome, reason, settledAt
//	C       C cursorID queueID                            acked watermark u64
//	A       A cursorID queueID offset                     ∅ (an ack above the watermark)
//	F       F cursorID queueID offset                     delivery attempts: failed attempts uvarint, orderly suspension end ms varint (queue 0xffffffff: a parked retry, offset = its R id)
//	R       R id                                          parked retry: header + message record
//	P       P id                                          parked delayed send: header + message record
//	h       h id                                          parked half message: header (dueMs = its delay after the commit) + message record
//	x       x id                                          open transaction record (JSON core.TransactionRecord: txId, topic, parked ids, message ids, checks, next check)
//	y       y id                                          settled transaction record (JSON; its state, when, by whom; dropped by its timer after the topic's retention)
//	D       D dueMs id                                    kind u8 (timer of an R or P record, or x: a transaction's next check or a settled one's end)
//	X       X subID deadAtMs id                           dead message: attempt, cursor, reason, message record
//	U       U topicID dedupKey                            remembered send result (5 minutes)
//	r       r group 'l' index                             raft log entry of group (u32): version u8, index, term, type, data, extensions, appendedAt (raftlog.go)
//	r       r group 's' key                               raft stable store value of group (SetUint64: u64)
//
// A store writes mV when it is created; Open refuses a data dir of another
// version, or one holding keys without one, naming the version it found
// and the one it reads.
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
//     first retained offset.
//   - A message id that is a NUID (every id the broker makes) is indexed
//     by its digest (core.IDIndex: its sequence number, which grows with
//     every id a process makes), and consecutive digests of a batch are one
//     key, a run (kind r): the first digest and seq in the key, the rest as
//     deltas in the value, at most 256 entries and 2^20 digest units from
//     the first. A lookup (core.IndexNUID) reads the runs of each bucket
//     whose first digest lies within 2^20 below the one it wants: that is
//     every run that can hold it. A send of 100 messages is one id-index
//     key: a key per message cost a batch send ~10% of its rate in
//     memtable inserts and compactions (docs/BENCHMARKS.md), and random
//     hashes a skiplist search per insert as well. Other ids (kind i),
//     keys and tags have a key per message.
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
//   - The broker's counters (core.Counters, key mC) are stored in the
//     batch of every commit that advances them: the next log seq, the last
//     store time and the highest id given to a history, parked or dead
//     record. A restart, or a later leader applying the same writes,
//     continues them instead of starting from a clock or from the log's
//     last key: seqs keep growing after retention has cut the whole log
//     (old index entries never name a new message), store times stay
//     monotonic when the wall clock steps back, and no id is given twice.
//     It is one 24-byte key per commit.
//   - Every write after Open's format key (mV, written once at creation),
//     raft keys aside, goes through a core.Batch, so a batch's Repr is the
//     whole of a commit: a store created empty that applies another's
//     batches in commit order (Store.ApplyBatch) holds the same keys and
//     values, which Store.Fingerprint compares. Applying reads nothing and decides
//     nothing. Delivery attempts (F) are stored so that a replica taking
//     over counts them on.
//   - Raft groups (RaftStore: a hashicorp/raft LogStore and StableStore)
//     share the node's Pebble under the prefix r, then the group id, so one
//     group's log is one contiguous span: FirstIndex and LastIndex are a
//     seek to either end of it, and truncating a log (DeleteRange) is one
//     range tombstone. Every raft write (StoreLogs as one batch,
//     DeleteRange, Set, SetUint64) is synced before it returns: raft
//     acknowledges entries and votes once they are stored. A log is
//     encoded by the store (version byte first) rather than by a general
//     codec, so equal logs are equal bytes and a later layout can be told
//     apart. Raft keys are written outside core.Batch and differ between
//     replicas (each has its own votes and log tail): Fingerprint, which
//     compares the replicated state, leaves them out; Checkpoint still
//     copies the whole store.
//   - A transaction's record is open (x) until committed or rolled back,
//     then settled (y), deleted from x in the same batch: Load reads only
//     the open ones, which are few, while settled ones stay a topic's
//     retention so that commit and rollback stay idempotent. Its half
//     messages (h) are parked copies like P records, but have no timer:
//     the record's timer (D, kind x) drives the checks, and a commit
//     appends them and deletes them in one batch. Records are keyed by id,
//     not topic: a topic's delete drops its open ones by name (core knows
//     them), and settled ones expire by their timer.
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
// # Storage tricks
//
// Every acknowledged send waits for an fdatasync of Pebble's WAL (150–300
// µs on a small VM's disk, ~1 ms in its tail), so the store shortens that
// wait in three ways, each on by default, each an Options field that turns
// it off, each counted by a gauge the store registers through
// Options.MeterProvider (metrics.go). All three apply only on the real
// disk (Options.FS nil). Every way, a synced commit returns once its data
// is durable: fdatasync(2) has returned, with its error.
//
// The fsync ring (walsync.go, fsyncring_linux.go). A goroutine in a
// blocking syscall keeps its scheduler P until the runtime's monitor takes
// it back, and that monitor sleeps longer the less it has to do: traces of
// 64 single-send producers showed an fsync running with one P or none busy
// for 28–32% of the run, runnable goroutines waiting. So a WAL's
// fdatasync is handed to a kernel worker through io_uring and the syncing
// goroutine waits on an eventfd in the netpoller, holding no P. Other
// files (sstables, blob files, the MANIFEST) are synced by background work
// and keep Pebble's path. Where io_uring is unavailable (not Linux, or
// disabled by sysctl or seccomp) syncs are plain syscalls. Off:
// Options.NoFsyncRing (--fsync-ring=false), plain fdatasync calls, and no
// spinning either. Gauge: tidemq.store.wal.uring_syncs, the syncs the ring
// ran.
//
// Sync spinning (walsync.go). How a sync through the ring waits depends on
// who else wants the CPU: while other goroutines wait for a P it parks,
// giving its P to them; when none does it polls for the completion,
// yielding the CPU to other threads between looks, for up to 1 ms, and
// parks once others have been kept waiting 25 µs (spinPolicy). A CPU left
// idle through the fsync is halted by the VM, and waking it, then the
// goroutines the commit answers, put ~100 µs between a lone send's handler
// and its client; spinning took a lone send's p50 from ~390 to ~330 µs for
// ~120 µs more CPU per send, CPU nobody else was asking for. The same
// holds for the committer's own wait: a synced commit that core marks
// alone (Batch.Commit's alone: one caller committing on its own goroutine,
// nothing queued behind it, which core knows and the store cannot) applies
// its batch without waiting (DB.ApplyNoSyncWait), then, while no other
// goroutine waits for a P, polls the WAL's count of ended syncs before
// Batch.SyncWait, so Pebble's WAL flusher finds it not parked and wakes
// nobody: that wake-up was 26–34 µs of a lone send's p50
// (Store.commitPolling). Commits core does not mark alone (the appender's
// group commits, whose callers are many and whose CPU others want) park.
// Off: Options.NoSyncSpin (--sync-spin=false), where idle CPU is billed or
// under a CPU quota: syncs nobody waits on sleep in the syscall and every
// commit parks. Gauge: tidemq.store.wal.polled_commits, the commits that
// polled.
//
// WAL spares (walspare.go). An fdatasync of a file that grew since its
// last sync writes its inode too (size, new blocks): on ext4 one more
// synchronous write before the disk's cache flush (appending 1,300 bytes
// and syncing took 169 µs on a growing file, 98 µs on one whose blocks
// were written with zeros before; fallocate does not help, its extents are
// "unwritten" and converting them is metadata again). Pebble recycles WAL
// files for this reason, but a recycled log is only as long as the
// memtable it held, and Pebble grows its memtables from 256 KiB, so a new
// store's first WALs are new files or short recycled ones. The store
// keeps one spare, tidemq-wal-spare: a file zero-filled to the length of
// Pebble's next WAL (1.1 × its memtable: from 282 KiB after an open up to
// 70 MiB by default) and synced, which becomes that WAL in place of a new
// file or of a recycled one shorter than half of it. A used spare becomes
// a recycled log of the right length in its turn, so once the memtables
// have grown no more spares are made. A spare is made only once the store
// has filled a memtable, only with eight full spares' worth of free disk,
// and in the background, 1 MiB written and synced at a time;
// tidemq-wal-spare.tmp is one being made, removed at the next open if a
// crash cut it short. Pebble reads a WAL's zeros past its last record as
// the end of the log, as it reads what its own recycling leaves there.
// The spare counts in the store's disk bytes (core's
// tidemq.store.disk.bytes). Off: Options.NoWALSpares (--wal-spares=false),
// Pebble's own new and recycled files. Gauge: tidemq.store.wal.spares_used,
// the WALs that were spares.
//
// The store also reports Pebble's health: tidemq.store.l0.sublevels and
// tidemq.store.write_stalls.
package pebblestore
