package core_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/pebblestore"
)

// lowSpaceFS is an in-memory filesystem that reports as free whatever
// the test sets, to play a disk filling up and emptying again.
type lowSpaceFS struct {
	vfs.FS
	avail atomic.Int64
	reads atomic.Int64 // GetDiskUsage calls
}

func (f *lowSpaceFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	f.reads.Add(1)
	a := uint64(f.avail.Load())
	return vfs.DiskUsage{AvailBytes: a, TotalBytes: 1 << 40, UsedBytes: 1<<40 - a}, nil
}

// lowSpaceBroker opens a broker keeping minFree bytes in reserve on a
// lowSpaceFS that reports 1 GiB free until the test says otherwise.
func lowSpaceBroker(t *testing.T, minFree int64) (*lowSpaceFS, *core.Broker) {
	t.Helper()
	fs := &lowSpaceFS{FS: vfs.NewMem()}
	fs.avail.Store(1 << 30)
	store, err := pebblestore.Open("db", pebblestore.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, MinFreeBytes: minFree, Logger: quiet})
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
	return fs, b
}

func TestDiskNearlyFullRefusesSendsAndRecovers(t *testing.T) {
	fs, b := lowSpaceBroker(t, 64<<20)
	ctx := context.Background()
	if _, _, err := b.PutSubscription(ctx, "t", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("before")}}); err != nil {
		t.Fatal(err)
	}

	fs.avail.Store(10 << 20) // below the reserve
	// Filled by someone else: noticed at the broker's next reading of free
	// space, at most spaceReadInterval (100 ms) after its last.
	time.Sleep(150 * time.Millisecond)
	_, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("refused")}})
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

// Free space is read at most every 100 ms while it is plentiful, and at
// every commit once the sends since the last reading could have used up the
// room above the reserve.
func TestFreeSpaceIsReadWhenItMatters(t *testing.T) {
	const reserve = 64 << 20
	fs, b := lowSpaceBroker(t, reserve)
	ctx := context.Background()

	readsBefore, began := fs.reads.Load(), time.Now()
	const sends = 50
	for range sends {
		if _, err := b.Send(ctx, "t", []*core.Message{{Body: []byte("plenty of room")}}); err != nil {
			t.Fatal(err)
		}
	}
	reads, most := fs.reads.Load()-readsBefore, int64(time.Since(began)/(100*time.Millisecond))+2
	if reads < 1 || reads > most {
		t.Errorf("%d sends in %v read free space %d times, want 1 to %d", sends, time.Since(began), reads, most)
	}

	// 100 KiB above the reserve: a 64 KiB send fits, but at four bytes of
	// disk per byte sent the next could not, so each one reads again.
	fs.avail.Store(reserve + 100<<10)
	time.Sleep(150 * time.Millisecond) // past the last reading's 100 ms
	body := make([]byte, 64<<10)
	for i := range 5 {
		readsBefore := fs.reads.Load()
		if _, err := b.Send(ctx, "t", []*core.Message{{Body: body}}); err != nil {
			t.Fatalf("send %d, 100 KiB above the reserve: %v", i, err)
		}
		if n := fs.reads.Load() - readsBefore; n != 1 {
			t.Errorf("send %d near the reserve read free space %d times, want 1", i, n)
		}
	}
}

// TestDiskFullOnTmpfs fills a real, size-limited filesystem: a 96 MiB
// tmpfs mounted by the test (root only), holding Pebble and a ballast file.
// Sends are refused with ErrInsufficientStorage before the disk is full;
// everything acknowledged is readable, survives a reopen, and sends work
// again once the ballast is removed.
func TestDiskFullOnTmpfs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a size-limited tmpfs needs root; the disk-full rule is also covered by TestDiskNearlyFullRefusesSendsAndRecovers")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=96m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (%v: %s); the disk-full rule is also covered by TestDiskNearlyFullRefusesSendsAndRecovers", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	ballast := filepath.Join(mnt, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 40<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(mnt, "data")
	open := func() (*pebblestore.Store, *core.Broker) {
		store, err := pebblestore.Open(dir, pebblestore.Options{MemTableBytes: 4 << 20, CacheBytes: 8 << 20})
		if err != nil {
			t.Fatal(err)
		}
		b, err := core.New(store, core.Options{AutoCreate: true, MinFreeBytes: 16 << 20})
		if err != nil {
			t.Fatal(err)
		}
		return store, b
	}
	store, b := open()
	t.Cleanup(func() { _ = b.Close(); _ = store.Close() }) // on a failure path; Close is idempotent
	ctx := context.Background()
	if _, _, err := b.PutSubscription(ctx, "t", "g", core.SubscriptionConfig{}); err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 64<<10)
	_, _ = rand.NewChaCha8([32]byte{7}).Read(body) // random: zstd cannot shrink it
	acked := 0
	var refused error
	for i := 0; i < 2000 && refused == nil; i++ {
		msgs := make([]*core.Message, 8)
		for j := range msgs {
			msgs[j] = &core.Message{Body: body}
		}
		if _, err := b.Send(ctx, "t", msgs); err != nil {
			refused = err
			break
		}
		acked += len(msgs)
	}
	if !errors.Is(refused, core.ErrInsufficientStorage) {
		t.Fatalf("after %d acknowledged messages the send ended with %v, want ErrInsufficientStorage", acked, refused)
	}
	if acked == 0 {
		t.Fatal("the disk was full before anything was stored")
	}
	t.Logf("%d messages of 64 KiB acknowledged before the 16 MiB reserve was reached; then: %v", acked, refused)
	info, _ := b.GetTopic("t")
	if info.Messages != int64(acked) {
		t.Fatalf("topic holds %d messages, %d were acknowledged", info.Messages, acked)
	}
	// Reopen on the nearly full disk: every acknowledged message is there.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	store, b = open()
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
		if err := store.Close(); err != nil {
			t.Error(err)
		}
	})
	if info, _ := b.GetTopic("t"); info.Messages != int64(acked) {
		t.Fatalf("after reopening, %d messages, %d were acknowledged", info.Messages, acked)
	}
	got := 0
	for got < acked {
		ds, err := b.Pull(ctx, "t", "g", core.PullRequest{MaxMessages: 100})
		if err != nil || len(ds) == 0 {
			t.Fatalf("pulled %d of %d acknowledged messages: %v", got, acked, err)
		}
		got += len(ds)
	}
	// Space returns: sends are accepted again.
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Send(ctx, "t", []*core.Message{{Body: body}}); err != nil {
		t.Fatalf("send after space returned: %v", err)
	}
}
