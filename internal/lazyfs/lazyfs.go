// Package lazyfs is a FUSE file system that can lose power: a loopback
// mount that remembers what was made durable and, on PowerLoss, forgets
// everything else, as a machine's page cache is forgotten when it stops.
// SIGKILL cannot tell a working fsync from a missing one (the kernel keeps
// a killed process's writes); a test that kills, calls PowerLoss and
// restarts can. The idea is Jepsen's LazyFS.
//
// # Durability model
//
// The mount serves dir/live, where every operation happens at once, as the
// page cache would have it. What a power loss keeps is, per inode:
//
//   - a regular file's content and size as of its last fsync or fdatasync
//     (the two are the same here), from any descriptor of the file and
//     whichever way it is issued (fsync(2), io_uring): every one reaches
//     the file system as a FUSE fsync;
//   - a directory's entries (name → inode, and a symlink's target) as of
//     the directory's last fsync. Creating, renaming, linking or removing
//     a name is durable only once the directory holding it (each of them,
//     for a rename across two) is synced; a file's own fsync does not make
//     its name durable. A durable name of a file never synced is an empty
//     file.
//
// Nothing else is kept: modes are the ones seen at the directory's sync,
// times, owners and extended attributes are not restored, device nodes and
// fifos are dropped, and shared writable mmaps are not tracked. A
// directory that two durable parents both name (moved, and both synced at
// different moments) comes back under the first name found.
//
// Synced content is copied, at each sync, to dir/synced (one file per
// inode); nothing is fsynced for real: the machine does not lose power,
// only the mount does.
package lazyfs

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// FS is a mounted power-loss file system.
type FS struct {
	mountpoint string
	live       string // what the mount shows
	synced     string // synced content, one file per inode id

	mountMu sync.Mutex // orders mount, unmount and PowerLoss
	server  *fuse.Server

	mu     sync.Mutex
	ids    map[uint64]uint64 // live inode number → inode id
	nextID uint64
	dirty  map[uint64]*dirtyFile       // by inode id: what changed since the last sync
	dirs   map[uint64]map[string]entry // durable entries, by directory id
	rootID uint64
	stats  Stats
}

// entry is a durable directory entry.
type entry struct {
	id     uint64
	mode   uint32 // type and permissions, from lstat
	target string // a symlink's
}

// dirtyFile is what a sync of a file must copy: the spans written since
// the last sync, and the smallest size it was truncated to (-1: none), so
// that bytes cut off and grown again come back as zeros.
type dirtyFile struct {
	spans       []span
	truncatedTo int64
}

type span struct{ off, end int64 }

// Stats counts what the file system saw since it was mounted.
type Stats struct {
	FileSyncs, DirSyncs int64 // fsync and fdatasync calls
	PowerLosses         int64
	LostBytes           int64 // bytes of files written and not synced when the power was lost
}

// Supported says why this process cannot mount a FUSE file system, or nil
// if it may: it needs /dev/fuse and root (the mount is made with mount(2),
// without fusermount).
func Supported() error {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("lazyfs: no /dev/fuse: %w", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("lazyfs: mounting needs root (mount(2) without fusermount)")
	}
	return nil
}

// Mount mounts a power-loss file system on mountpoint, with its state in
// dir (dir/live and dir/synced, created if missing). Whatever dir/live
// already holds counts as synced: dir/synced is made anew from it.
func Mount(mountpoint, dir string) (*FS, error) {
	if err := Supported(); err != nil {
		return nil, err
	}
	f := &FS{mountpoint: mountpoint, live: filepath.Join(dir, "live"), synced: filepath.Join(dir, "synced")}
	if err := os.RemoveAll(f.synced); err != nil {
		return nil, fmt.Errorf("lazyfs: %w", err)
	}
	for _, d := range []string{f.live, f.synced} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("lazyfs: %w", err)
		}
	}
	if err := f.adopt(); err != nil {
		return nil, err
	}
	f.mountMu.Lock()
	defer f.mountMu.Unlock()
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *FS) mount() error {
	root, err := fs.NewLoopbackRoot(f.live)
	if err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	server, err := fs.Mount(f.mountpoint, &node{LoopbackNode: root.(*fs.LoopbackNode), lfs: f}, &fs.Options{
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true, // mount(2) or nothing: no fusermount needed
			FsName:            "lazyfs",
			Name:              "lazyfs",
			DisableXAttrs:     true,
		},
	})
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", f.mountpoint, err)
	}
	f.server = server
	return nil
}

// unmount unmounts, waiting a bounded time for the kernel to let go of
// files closed by a process that just died.
func (f *FS) unmount() error {
	if f.server == nil {
		return nil
	}
	var err error
	for deadline := time.Now().Add(5 * time.Second); ; {
		if err = f.server.Unmount(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazyfs: unmount %s: %w", f.mountpoint, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.server.Wait()
	f.server = nil
	return nil
}

// Unmount unmounts the file system. If the mount stays busy it is
// detached (MNT_DETACH) so that nothing is left mounted, and the error
// says so. The state in dir stays; it is idempotent.
func (f *FS) Unmount() error {
	f.mountMu.Lock()
	defer f.mountMu.Unlock()
	err := f.unmount()
	if err != nil {
		if derr := syscall.Unmount(f.mountpoint, unix.MNT_DETACH); derr != nil {
			err = errors.Join(err, derr)
		}
		f.server = nil
	}
	return err
}

// PowerLoss drops every write not made durable: it unmounts (nothing may
// hold a file open on the mount), replaces dir/live by the durable state
// and mounts again.
func (f *FS) PowerLoss() error {
	f.mountMu.Lock()
	defer f.mountMu.Unlock()
	if err := f.unmount(); err != nil {
		return err
	}
	if err := f.restore(); err != nil {
		return err
	}
	return f.mount()
}

// Stats returns the counts so far.
func (f *FS) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stats
}

// restore rebuilds dir/live from the durable state, then adopts it.
func (f *FS) restore() error {
	f.mu.Lock()
	f.stats.LostBytes += f.unsyncedBytes()
	f.stats.PowerLosses++
	old := f.synced + ".old"
	dirs, rootID := f.dirs, f.rootID
	f.mu.Unlock()

	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	if err := os.Rename(f.synced, old); err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	if err := os.RemoveAll(f.live); err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	for _, d := range []string{f.live, f.synced} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("lazyfs: %w", err)
		}
	}
	r := restorer{from: old, dirs: dirs, made: map[uint64]string{}}
	if err := r.dir(rootID, f.live); err != nil {
		return err
	}
	if err := os.RemoveAll(old); err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	return f.adopt()
}

// unsyncedBytes counts the bytes of live files written since their last
// sync. Callers hold mu.
func (f *FS) unsyncedBytes() int64 {
	var n int64
	counted := map[uint64]bool{}
	_ = filepath.WalkDir(f.live, func(p string, e os.DirEntry, err error) error {
		var st syscall.Stat_t
		if err != nil || !e.Type().IsRegular() || syscall.Lstat(p, &st) != nil {
			return nil
		}
		id, ok := f.ids[st.Ino]
		if !ok || counted[id] || f.dirty[id] == nil {
			return nil
		}
		counted[id] = true
		for _, s := range f.dirty[id].spans {
			n += max(0, min(s.end, st.Size)-s.off)
		}
		return nil
	})
	return n
}

type restorer struct {
	from string
	dirs map[uint64]map[string]entry
	made map[uint64]string // inode id → the path it was made at
}

func (r *restorer) dir(id uint64, path string) error {
	r.made[id] = path
	ents := r.dirs[id]
	names := make([]string, 0, len(ents))
	for name := range ents {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		e, p := ents[name], filepath.Join(path, name)
		perm := os.FileMode(e.mode & 0o7777)
		switch e.mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if _, done := r.made[e.id]; done {
				continue // named by two durable parents: keep the first
			}
			if err := os.Mkdir(p, perm); err != nil {
				return fmt.Errorf("lazyfs: restore: %w", err)
			}
			if err := r.dir(e.id, p); err != nil {
				return err
			}
		case syscall.S_IFREG:
			if first, done := r.made[e.id]; done {
				if err := os.Link(first, p); err != nil {
					return fmt.Errorf("lazyfs: restore: %w", err)
				}
				continue
			}
			if err := copyFile(filepath.Join(r.from, strconv.FormatUint(e.id, 10)), p, perm); err != nil {
				return err
			}
			r.made[e.id] = p
		case syscall.S_IFLNK:
			if err := os.Symlink(e.target, p); err != nil {
				return fmt.Errorf("lazyfs: restore: %w", err)
			}
		}
	}
	return nil
}

// copyFile copies from (an empty file if it does not exist) to a new file.
func copyFile(from, to string, perm os.FileMode) error {
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	in, err := os.Open(from)
	if errors.Is(err, os.ErrNotExist) {
		return out.Close()
	}
	if err != nil {
		_ = out.Close()
		return fmt.Errorf("lazyfs: %w", err)
	}
	defer in.Close()
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("lazyfs: %w", err)
	}
	return out.Close()
}

// adopt makes dir/live, as it is, the durable state: new inode ids, every
// file copied to dir/synced, every directory's entries recorded.
func (f *FS) adopt() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ids, f.dirty, f.dirs = map[uint64]uint64{}, map[uint64]*dirtyFile{}, map[uint64]map[string]entry{}
	id, err := f.adoptDir(f.live)
	f.rootID = id
	return err
}

func (f *FS) adoptDir(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return 0, fmt.Errorf("lazyfs: %w", err)
	}
	id := f.idOf(st.Ino)
	ents, err := os.ReadDir(path)
	if err != nil {
		return 0, fmt.Errorf("lazyfs: %w", err)
	}
	for _, e := range ents {
		p := filepath.Join(path, e.Name())
		switch {
		case e.IsDir():
			if _, err := f.adoptDir(p); err != nil {
				return 0, err
			}
		case e.Type().IsRegular():
			if err := syscall.Lstat(p, &st); err != nil {
				return 0, fmt.Errorf("lazyfs: %w", err)
			}
			if _, known := f.ids[st.Ino]; known {
				continue // a hard link of a file copied already
			}
			if err := copyFile(p, f.syncedPath(f.idOf(st.Ino)), 0o600); err != nil {
				return 0, err
			}
		}
	}
	return id, f.recordDir(id, path)
}

func (f *FS) syncedPath(id uint64) string {
	return filepath.Join(f.synced, strconv.FormatUint(id, 10))
}

// idOf returns the id of a live inode, giving it one if it has none.
// Callers hold mu.
func (f *FS) idOf(ino uint64) uint64 {
	if id, ok := f.ids[ino]; ok {
		return id
	}
	return f.newInode(ino)
}

// newInode gives a live inode just created a new id: its number may be
// that of a removed inode whose durable content and names stay.
// Callers hold mu.
func (f *FS) newInode(ino uint64) uint64 {
	if old, ok := f.ids[ino]; ok {
		delete(f.dirty, old)
	}
	f.nextID++
	f.ids[ino] = f.nextID
	return f.nextID
}

func (f *FS) created(ino uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.newInode(ino)
}

func (f *FS) dirtyOf(ino uint64) *dirtyFile {
	id := f.idOf(ino)
	d := f.dirty[id]
	if d == nil {
		d = &dirtyFile{truncatedTo: -1}
		f.dirty[id] = d
	}
	return d
}

// wrote records a write of n bytes at off, after it was made: a sync that
// misses the record copies it next time.
func (f *FS) wrote(ino uint64, off, n int64) {
	if n <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.dirtyOf(ino)
	d.spans = addSpan(d.spans, span{off, off + n})
}

// addSpan adds s to spans, sorted and disjoint, merging what it touches.
func addSpan(spans []span, s span) []span {
	if k := len(spans); k == 0 || spans[k-1].end < s.off {
		return append(spans, s) // past the end: appending, the usual case
	}
	// The first span ending at or after s.off, and the first starting past s.end.
	i, _ := slices.BinarySearchFunc(spans, s.off, func(x span, off int64) int { return cmp.Compare(x.end, off) })
	j, _ := slices.BinarySearchFunc(spans, s.end+1, func(x span, end int64) int { return cmp.Compare(x.off, end) })
	if i < j {
		s.off, s.end = min(s.off, spans[i].off), max(s.end, spans[j-1].end)
	}
	return slices.Replace(spans, i, j, s)
}

// truncated records a truncation to size.
func (f *FS) truncated(ino uint64, size int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.dirtyOf(ino)
	if d.truncatedTo < 0 || size < d.truncatedTo {
		d.truncatedTo = size
	}
}

// syncFile makes the live file open as fd durable: its spans written
// since the last sync and its size are copied to its synced file.
func (f *FS) syncFile(fd int) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	// The descriptor may be write-only: read through another one.
	in, err := os.Open("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fs.ToErrno(err)
	}
	defer in.Close()

	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats.FileSyncs++
	id := f.idOf(st.Ino)
	d := f.dirty[id]
	out, err := os.OpenFile(f.syncedPath(id), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return syscall.EIO
	}
	defer out.Close()
	if d != nil && d.truncatedTo >= 0 {
		if err := out.Truncate(d.truncatedTo); err != nil {
			return syscall.EIO
		}
	}
	if err := out.Truncate(st.Size); err != nil {
		return syscall.EIO
	}
	if d != nil {
		for _, s := range d.spans {
			end := min(s.end, st.Size)
			if s.off >= end {
				continue
			}
			if _, err := io.Copy(io.NewOffsetWriter(out, s.off), io.NewSectionReader(in, s.off, end-s.off)); err != nil {
				return syscall.EIO
			}
		}
	}
	delete(f.dirty, id)
	return 0
}

// syncDir makes the entries of the live directory at path durable.
func (f *FS) syncDir(path string) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return fs.ToErrno(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats.DirSyncs++
	if err := f.recordDir(f.idOf(st.Ino), path); err != nil {
		return syscall.EIO
	}
	return 0
}

// recordDir records the live entries of directory id at path as its
// durable ones. Callers hold mu.
func (f *FS) recordDir(id uint64, path string) error {
	ents, err := os.ReadDir(path)
	if err != nil {
		return fmt.Errorf("lazyfs: %w", err)
	}
	durable := make(map[string]entry, len(ents))
	for _, e := range ents {
		p := filepath.Join(path, e.Name())
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			if errors.Is(err, syscall.ENOENT) {
				continue // removed meanwhile
			}
			return fmt.Errorf("lazyfs: %w", err)
		}
		de := entry{id: f.idOf(st.Ino), mode: st.Mode}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFREG, syscall.S_IFDIR:
		case syscall.S_IFLNK:
			if de.target, err = os.Readlink(p); err != nil {
				continue
			}
		default:
			continue
		}
		durable[e.Name()] = de
	}
	f.dirs[id] = durable
	return nil
}
