package core

import (
	"encoding/base64"
	"encoding/binary"
)

// A receipt handle names one lease: subscription, queue, offset and the
// lease id, so a handle from an earlier delivery of the same message is told
// apart from the current one. It is opaque to clients.
type receipt struct {
	subID   uint32
	queueID uint32
	offset  uint64
	leaseID uint64
}

const receiptVersion = 1

func (r receipt) String() string {
	var raw [25]byte
	raw[0] = receiptVersion
	binary.BigEndian.PutUint32(raw[1:], r.subID)
	binary.BigEndian.PutUint32(raw[5:], r.queueID)
	binary.BigEndian.PutUint64(raw[9:], r.offset)
	binary.BigEndian.PutUint64(raw[17:], r.leaseID)
	var text [34]byte // RawURLEncoding.EncodedLen(25): one allocation, the string's
	base64.RawURLEncoding.Encode(text[:], raw[:])
	return string(text[:])
}

func parseReceipt(s string) (receipt, bool) {
	var raw [25]byte
	if base64.RawURLEncoding.DecodedLen(len(s)) != len(raw) {
		return receipt{}, false
	}
	n, err := base64.RawURLEncoding.Decode(raw[:], []byte(s))
	if err != nil || n != len(raw) || raw[0] != receiptVersion {
		return receipt{}, false
	}
	return receipt{
		subID:   binary.BigEndian.Uint32(raw[1:]),
		queueID: binary.BigEndian.Uint32(raw[5:]),
		offset:  binary.BigEndian.Uint64(raw[9:]),
		leaseID: binary.BigEndian.Uint64(raw[17:]),
	}, true
}
