package core

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"hash"
	"sync"
)

// A receipt handle names one lease. It is opaque to clients and laid out as
//
//	version(1)=2 | group(4) | epoch(8) | subscription(4) | queue(4) |
//	offset(8) | lease id(8) | MAC(16)
//
// big-endian, 53 bytes, base64url without padding (71 characters).
//
// The MAC is HMAC-SHA256, cut to 16 bytes, over every byte before it, under
// the node's receipt key: a client holding one handle cannot build another
// (lease ids are small counters, so without it a neighbour's handle is a
// few guesses away), and a handle that does not verify is receipt_invalid,
// like one that does not parse.
//
// The epoch is a durable counter raised on every start of the broker, and
// lease ids count from 1 within it: a handle of an earlier epoch was leased
// before a restart (still good for an ack while nobody got the message
// since), one of a later epoch was never given by this store.
//
// The group names the replica group that gave the handle (0 on a single
// node), so a cluster can send a handle to, and judge it by, its group.
type receipt struct {
	group   uint32
	epoch   uint64
	subID   uint32
	queueID uint32
	offset  uint64
	leaseID uint64
}

const (
	receiptVersion = 2
	receiptBody    = 37 // the bytes the MAC covers
	receiptMACLen  = 16
	receiptRawLen  = receiptBody + receiptMACLen
	// ReceiptKeyLen is the length of a key core makes itself; any
	// non-empty key works, 32 bytes suffice for HMAC-SHA256.
	ReceiptKeyLen = 32
)

// receiptEncoding is strict so that one handle has one spelling: the last
// character's spare bits must be zero.
var (
	receiptEncoding = base64.RawURLEncoding.Strict()
	receiptTextLen  = receiptEncoding.EncodedLen(receiptRawLen)
)

// receiptSealer makes and checks handles under one key. Every delivered
// message gets a handle, so the keyed hashes are pooled: hmac.New costs
// allocations and two hash blocks, Reset on a used one neither.
type receiptSealer struct {
	pool sync.Pool // *receiptScratch
}

type receiptScratch struct {
	mac hash.Hash
	raw [receiptRawLen]byte
	sum [sha256.Size]byte
	txt [72]byte // ≥ receiptTextLen
}

// newReceiptSealer uses key, or a random key for the sealer's lifetime if
// key is empty.
func newReceiptSealer(key []byte) *receiptSealer {
	if len(key) == 0 {
		key = make([]byte, ReceiptKeyLen)
		_, _ = rand.Read(key) // crypto/rand.Read never fails
	}
	key = append([]byte(nil), key...) // the caller's slice may change
	k := &receiptSealer{}
	k.pool.New = func() any { return &receiptScratch{mac: hmac.New(sha256.New, key)} }
	return k
}

// macOfBody is the MAC of the handle body in sc.raw, in sc.sum.
func (sc *receiptScratch) macOfBody() []byte {
	sc.mac.Reset()
	sc.mac.Write(sc.raw[:receiptBody])
	return sc.mac.Sum(sc.sum[:0])[:receiptMACLen]
}

func (k *receiptSealer) seal(r receipt) string {
	sc := k.pool.Get().(*receiptScratch)
	raw := sc.raw[:]
	raw[0] = receiptVersion
	binary.BigEndian.PutUint32(raw[1:], r.group)
	binary.BigEndian.PutUint64(raw[5:], r.epoch)
	binary.BigEndian.PutUint32(raw[13:], r.subID)
	binary.BigEndian.PutUint32(raw[17:], r.queueID)
	binary.BigEndian.PutUint64(raw[21:], r.offset)
	binary.BigEndian.PutUint64(raw[29:], r.leaseID)
	copy(raw[receiptBody:], sc.macOfBody())
	txt := sc.txt[:receiptTextLen]
	receiptEncoding.Encode(txt, raw)
	s := string(txt) // the one allocation: the string's
	k.pool.Put(sc)
	return s
}

// open parses and verifies a handle; a handle that does not parse, is of
// another version or does not verify under this key is refused alike.
func (k *receiptSealer) open(s string) (receipt, bool) {
	if len(s) != receiptTextLen {
		return receipt{}, false
	}
	sc := k.pool.Get().(*receiptScratch)
	defer k.pool.Put(sc)
	copy(sc.txt[:], s)
	n, err := receiptEncoding.Decode(sc.raw[:], sc.txt[:receiptTextLen])
	raw := sc.raw[:]
	if err != nil || n != receiptRawLen || raw[0] != receiptVersion {
		return receipt{}, false
	}
	if !hmac.Equal(sc.macOfBody(), raw[receiptBody:]) {
		return receipt{}, false
	}
	return receipt{
		group:   binary.BigEndian.Uint32(raw[1:]),
		epoch:   binary.BigEndian.Uint64(raw[5:]),
		subID:   binary.BigEndian.Uint32(raw[13:]),
		queueID: binary.BigEndian.Uint32(raw[17:]),
		offset:  binary.BigEndian.Uint64(raw[21:]),
		leaseID: binary.BigEndian.Uint64(raw[29:]),
	}, true
}
