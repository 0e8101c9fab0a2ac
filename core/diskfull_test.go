package core_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// lowSpaceFS is an in-memory filesystem that reports as free whatever
// the test sets, to play a disk filling up and emptying again.
type lowSpaceFS struct {
	vfs.FS
	avail atomic.Int64
}

func (f *lowSpaceFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	a := uint64(f.avail.Load())
	return vfs.DiskUsage{AvailBytes: a, TotalBytes: 1 << 40, UsedBytes: 1<<40 - a}, nil
}

func TestDiskNearlyFullRefusesSendsAndRecovers(t *testing.T) {
	fs := &lowSpaceFS{FS: vfs.NewMem()}
	fs.avail.Store(1 << 30)
	store, err := pebblestore.Open("db", pebblestore.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, MinFreeBytes: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	ctx := context.Background()
	if _, _, err := b.PutSubscription(ctx, "t", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("before")}}); err != nil {
		t.Fatal(err)
	}

	fs.avail.Store(10 << 20) // below the reserve
	_, err = b.Send(ctx, "t", []*core.Message{{Body: []byte("refused")}})
	if !errors.Is(err, core.ErrInsufficientStorage) {
		t.Fatalf("send on a nearly full disk: %v, want ErrInsufficientStorage", err)
	}
	// What was acknowledged is still there, and consumers still work.
	got, err := b.Pull(ctx, "t", "g", core.PullRequest{MaxMessages: 10})
	if err != nil || len(got) != 1 || string(got[0].Message.Body) != "before" {
		t.Fatalf("pull on a nearly full disk: %v %d", err, len(got))
	}
	if n, _, err := b.Ack(ctx, "t", "g", []string{got[0].ReceiptHandle}); err != nil || n != 1 {
		t.Fatalf("ack on a nearly full disk: %d %v", n, err)
	}

	fs.avail.Store(1 << 30) // space is back
	if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("after")}}); err != nil {
		t.Fatalf("send after space returned: %v", err)
	}
	if info, _ := b.GetTopic("t"); info.Messages != 2 {
		t.Fatalf("topic holds %d messages, want 2 (the refused one not stored)", info.Messages)
	}
}
