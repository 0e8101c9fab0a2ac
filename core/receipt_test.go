package core_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidemq/tidemq/core"
)

// The handle layout of core/receipt.go, which these tests attack as a
// client would: version | group | epoch | sub | queue | offset | lease | MAC.
const (
	hGroup, hEpoch, hSub, hQueue, hOffset, hLease, hMAC = 1, 5, 13, 17, 21, 29, 37
	hLen                                                = 53
)

var handleEnc = base64.RawURLEncoding.Strict()

func handleBytes(t *testing.T, h string) []byte {
	t.Helper()
	raw, err := handleEnc.DecodeString(h)
	if err != nil || len(raw) != hLen {
		t.Fatalf("handle %q: %d bytes, %v; want %d", h, len(raw), err, hLen)
	}
	return raw
}

// resign gives raw the MAC it would have under key: only a holder of the
// node's key can do this.
func resign(key, raw []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write(raw[:hMAC])
	copy(raw[hMAC:], m.Sum(nil))
	return handleEnc.EncodeToString(raw)
}

func withUint64(raw []byte, at int, v uint64) []byte {
	out := append([]byte(nil), raw...)
	binary.BigEndian.PutUint64(out[at:], v)
	return out
}

func withUint32(raw []byte, at int, v uint32) []byte {
	out := append([]byte(nil), raw...)
	binary.BigEndian.PutUint32(out[at:], v)
	return out
}

// settleAll tries a handle with every call that takes one and asserts each
// refuses it as receipt_invalid without settling anything.
func settleAll(t *testing.T, e *env, topic, group, h, what string) {
	t.Helper()
	ctx := t.Context()
	calls := map[string]func() (int, []core.HandleResult, error){
		"extend": func() (int, []core.HandleResult, error) {
			return e.b.Extend(ctx, topic, group, []string{h}, time.Second)
		},
		"ack":        func() (int, []core.HandleResult, error) { return e.b.Ack(ctx, topic, group, []string{h}) },
		"nack":       func() (int, []core.HandleResult, error) { return e.b.Nack(ctx, topic, group, []string{h}, 0, "x") },
		"deadletter": func() (int, []core.HandleResult, error) { return e.b.DeadLetter(ctx, topic, group, []string{h}, "x") },
	}
	for name, call := range calls {
		n, failed, err := call()
		if err != nil || n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptInvalid) {
			t.Errorf("%s with %s: n=%d failed=%v err=%v, want receipt invalid", name, what, n, failed, err)
		}
	}
}

// TestForgedHandlesRefused is a consumer with rights on the group building
// another consumer's handle from its own: each field changed (lease ids
// are small counters, so the victim's is a few guesses away), or the MAC
// changed. Every try is receipt_invalid and the victim's lease stands.
func TestForgedHandlesRefused(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	e.send("t", "attacker's", "victim's")
	mine := e.pull("t", "g", core.PullRequest{MaxMessages: 1, ConsumerID: "attacker", Invisible: time.Minute})
	theirs := e.pull("t", "g", core.PullRequest{MaxMessages: 1, ConsumerID: "victim", Invisible: time.Minute})
	if len(mine) != 1 || len(theirs) != 1 {
		t.Fatalf("pulled %d and %d", len(mine), len(theirs))
	}
	own := handleBytes(t, mine[0].ReceiptHandle)
	victim := handleBytes(t, theirs[0].ReceiptHandle)

	// The attack: the attacker's handle with the victim's offset and each
	// lease id up to 32 (the signature left as it was, or guessed).
	var forged []string
	for lease := uint64(1); lease <= 32; lease++ {
		raw := withUint64(withUint64(own, hOffset, binary.BigEndian.Uint64(victim[hOffset:])), hLease, lease)
		forged = append(forged, handleEnc.EncodeToString(raw))
		guess := append([]byte(nil), raw...)
		copy(guess[hMAC:], victim[hMAC:])
		if string(guess) != string(victim) { // with the right lease id it is no forgery
			forged = append(forged, handleEnc.EncodeToString(guess))
		}
	}
	// Each field of the victim's own handle altered, the MAC kept.
	for _, raw := range [][]byte{
		withUint32(victim, hGroup, 1),
		withUint64(victim, hEpoch, binary.BigEndian.Uint64(victim[hEpoch:])-1),
		withUint64(victim, hEpoch, binary.BigEndian.Uint64(victim[hEpoch:])+1),
		withUint32(victim, hSub, binary.BigEndian.Uint32(victim[hSub:])+1),
		withUint32(victim, hQueue, 1),
		withUint64(victim, hOffset, 0),
		withUint64(victim, hLease, binary.BigEndian.Uint64(victim[hLease:])+1),
		append([]byte{1}, victim[1:]...), // version
	} {
		forged = append(forged, handleEnc.EncodeToString(raw))
	}
	// Bits of the victim's MAC flipped.
	for i := hMAC; i < hLen; i++ {
		raw := append([]byte(nil), victim...)
		raw[i] ^= 1 << (i % 8)
		forged = append(forged, handleEnc.EncodeToString(raw))
	}
	for i, h := range forged {
		if h == theirs[0].ReceiptHandle {
			t.Fatalf("forgery %d is the victim's handle itself", i)
		}
		settleAll(t, e, "t", "g", h, fmt.Sprintf("forgery %d", i))
	}

	// Had any extend of 1s hit, the lease would end within 2s; nack and
	// deadletter would have taken the message at once.
	clk.Advance(5 * time.Second)
	if got := e.drain("t", "g", core.PullRequest{ConsumerID: "attacker"}); len(got) != 0 {
		t.Fatalf("the victim's message was handed out again: %v", bodies(got))
	}
	if info := e.subInfo("t", "g"); info.Inflight != 2 || info.DLQ != 0 || info.Retrying != 0 {
		t.Errorf("inflight=%d dlq=%d retrying=%d, want 2, 0, 0", info.Inflight, info.DLQ, info.Retrying)
	}
	if n, failed := e.ack("t", "g", theirs[0].ReceiptHandle); n != 1 || len(failed) != 0 {
		t.Errorf("the victim's ack: acked=%d failed=%v, want 1", n, failed)
	}
}

// TestValidlySignedButForeignHandles uses the test key to sign handles the
// broker never gave: another group, a later epoch. Both are invalid; the
// control (the real handle re-signed) shows the signing is the broker's.
func TestValidlySignedButForeignHandles(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	e.send("t", "a")
	got := e.pull("t", "g", core.PullRequest{})
	if len(got) != 1 {
		t.Fatalf("pulled %d", len(got))
	}
	key := e.opts.ReceiptKey
	raw := handleBytes(t, got[0].ReceiptHandle)
	if again := resign(key, append([]byte(nil), raw...)); again != got[0].ReceiptHandle {
		t.Fatalf("re-signed %q, the broker gave %q: the test's layout is not the broker's", again, got[0].ReceiptHandle)
	}
	epoch := binary.BigEndian.Uint64(raw[hEpoch:])
	settleAll(t, e, "t", "g", resign(key, withUint32(raw, hGroup, 7)), "another group")
	settleAll(t, e, "t", "g", resign(key, withUint64(raw, hEpoch, epoch+1)), "a later epoch")
	if n, failed := e.ack("t", "g", got[0].ReceiptHandle); n != 1 || len(failed) != 0 {
		t.Errorf("the real handle: acked=%d failed=%v, want 1", n, failed)
	}
}

// TestHandleOfAnotherKeyInvalid: the same store reopened under another key
// refuses the handles of the first, where the same key would take them.
func TestHandleOfAnotherKeyInvalid(t *testing.T) {
	e := newEnv(t, core.Options{ReceiptKey: []byte("first key")})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	e.send("t", "a", "b")
	old := e.pull("t", "g", core.PullRequest{})
	if len(old) != 2 {
		t.Fatalf("pulled %d", len(old))
	}
	e.restart()
	if n, failed := e.ack("t", "g", old[0].ReceiptHandle); n != 1 || len(failed) != 0 {
		t.Fatalf("same key after a restart: acked=%d failed=%v, want 1", n, failed)
	}
	e.opts.ReceiptKey = []byte("second key")
	e.restart()
	n, failed := e.ack("t", "g", old[1].ReceiptHandle)
	if n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptInvalid) {
		t.Errorf("another key: acked=%d failed=%v, want receipt invalid", n, failed)
	}
	if got := bodies(e.drain("t", "g", core.PullRequest{})); len(got) != 1 || got[0] != "b" {
		t.Errorf("delivered %v after the refused ack, want [b]", got)
	}
}

// TestEpochDurableAndRaised: every start commits a higher epoch before it
// serves, and handles carry it.
func TestEpochDurableAndRaised(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	var last uint64
	for i := range 3 {
		snap, err := e.store.Load()
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if snap.Epoch <= last {
			t.Fatalf("start %d: stored epoch %d, after %d", i, snap.Epoch, last)
		}
		last = snap.Epoch
		e.send("t", "m")
		got := e.pull("t", "g", core.PullRequest{})
		if len(got) != 1 {
			t.Fatalf("start %d: pulled %d", i, len(got))
		}
		if h := binary.BigEndian.Uint64(handleBytes(t, got[0].ReceiptHandle)[hEpoch:]); h != last {
			t.Errorf("start %d: handle of epoch %d, stored %d", i, h, last)
		}
		e.ackAll("t", "g", got)
		e.restart()
	}
}

// TestOldEpochLeaseIDsDoNotMatch: lease ids start again at 1 on every
// start, so a message's first lease after a restart can carry the very
// lease id its handle had before. Only the epoch tells them apart: the old
// handle is expired and moves nothing of the new lease.
func TestOldEpochLeaseIDsDoNotMatch(t *testing.T) {
	clk := newClock()
	e := newEnv(t, core.Options{Now: clk.Now})
	e.putTopic("t", 1)
	e.subscribe("t", "g", core.SubscriptionConfig{})
	e.send("t", "a")
	old := e.pull("t", "g", core.PullRequest{Invisible: time.Minute})
	e.restart()
	cur := e.pull("t", "g", core.PullRequest{Invisible: time.Minute})
	if len(old) != 1 || len(cur) != 1 {
		t.Fatalf("pulled %d and %d", len(old), len(cur))
	}
	o, c := handleBytes(t, old[0].ReceiptHandle), handleBytes(t, cur[0].ReceiptHandle)
	if string(o[hSub:hMAC]) != string(c[hSub:hMAC]) {
		t.Fatalf("the two leases differ in more than the epoch (%x, %x): the test needs them alike", o[hSub:hMAC], c[hSub:hMAC])
	}
	ctx := t.Context()
	for name, call := range map[string]func() (int, []core.HandleResult, error){
		"extend": func() (int, []core.HandleResult, error) {
			return e.b.Extend(ctx, "t", "g", []string{old[0].ReceiptHandle}, time.Second)
		},
		"nack": func() (int, []core.HandleResult, error) {
			return e.b.Nack(ctx, "t", "g", []string{old[0].ReceiptHandle}, 0, "x")
		},
		"ack": func() (int, []core.HandleResult, error) {
			return e.b.Ack(ctx, "t", "g", []string{old[0].ReceiptHandle})
		},
	} {
		n, failed, err := call()
		if err != nil || n != 0 || len(failed) != 1 || !errors.Is(failed[0].Err, core.ErrReceiptExpired) {
			t.Errorf("%s with the old handle: n=%d failed=%v err=%v, want receipt expired", name, n, failed, err)
		}
	}
	clk.Advance(5 * time.Second)
	if got := e.drain("t", "g", core.PullRequest{}); len(got) != 0 {
		t.Fatalf("the new lease was cut by the old handle: %v delivered again", bodies(got))
	}
	e.ackAll("t", "g", cur)
}

// TestDuplicateHandlesCountOnce: a handle listed twice in one call is
// settled and counted once, and a bad one reported once.
func TestDuplicateHandlesCountOnce(t *testing.T) {
	e := newEnv(t, core.Options{})
	e.putTopic("t", 1)
	retries := 5
	e.subscribe("t", "g", core.SubscriptionConfig{MaxRetries: &retries})
	e.send("t", "a", "b", "c", "d")
	got := e.pull("t", "g", core.PullRequest{})
	if len(got) != 4 {
		t.Fatalf("pulled %d", len(got))
	}
	ctx := t.Context()
	a, b, c := got[0].ReceiptHandle, got[1].ReceiptHandle, got[2].ReceiptHandle

	n, failed, err := e.b.Extend(ctx, "t", "g", []string{a, a, b, a}, time.Minute)
	if err != nil || n != 2 || len(failed) != 0 {
		t.Errorf("extend [a a b a]: n=%d failed=%v err=%v, want 2", n, failed, err)
	}
	n, failed = e.ack("t", "g", a, a, "junk", "junk")
	if n != 1 || len(failed) != 1 || failed[0].ReceiptHandle != "junk" {
		t.Errorf("ack [a a junk junk]: n=%d failed=%v, want 1 and junk once", n, failed)
	}
	n, failed, err = e.b.DeadLetter(ctx, "t", "g", []string{b, b}, "x")
	if err != nil || n != 1 || len(failed) != 0 {
		t.Errorf("deadletter [b b]: n=%d failed=%v err=%v, want 1", n, failed, err)
	}
	n, failed, err = e.b.Nack(ctx, "t", "g", []string{c, c}, 0, "x")
	if err != nil || n != 1 || len(failed) != 0 {
		t.Errorf("nack [c c]: n=%d failed=%v err=%v, want 1", n, failed, err)
	}
	if info := e.subInfo("t", "g"); info.DLQ != 1 || info.Inflight != 1 {
		t.Errorf("dlq=%d inflight=%d, want 1 (b) and 1 (d)", info.DLQ, info.Inflight)
	}
	// c comes back once, on its second delivery.
	var again []core.Delivered
	deadline := time.Now().Add(10 * time.Second)
	for len(again) == 0 && time.Now().Before(deadline) {
		again = e.pull("t", "g", core.PullRequest{Wait: 200 * time.Millisecond})
	}
	if len(again) != 1 || string(again[0].Message.Body) != "c" || again[0].Attempt != 2 {
		t.Fatalf("after nack [c c]: %d deliveries %v, want c once on attempt 2", len(again), bodies(again))
	}
	e.ackAll("t", "g", append(again, got[3]))
}
