package lazyfs

import (
	"context"
	"math"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is go-fuse's loopback node, told of what changes a file's durable
// state: new inodes, writes and truncations (through handle), syncs.
type node struct {
	*fs.LoopbackNode
	lfs *FS
}

// WrapChild makes every node of the tree one of ours.
func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), lfs: n.lfs}
}

var (
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)
	_ fs.FileReaddirenter   = (*dirHandle)(nil)
	_ fs.FileSeekdirer      = (*dirHandle)(nil)
	_ fs.FileReleasedirer   = (*dirHandle)(nil)
	_ fs.FileFsyncdirer     = (*dirHandle)(nil)
	_ fs.FileWriter         = (*handle)(nil)
	_ fs.FileWritever       = (*handle)(nil)
	_ fs.FileReader         = (*handle)(nil)
	_ fs.FileSetattrer      = (*handle)(nil)
	_ fs.FileAllocater      = (*handle)(nil)
	_ fs.FileGetattrer      = (*handle)(nil)
	_ fs.FileLseeker        = (*handle)(nil)
	_ fs.FileFlusher        = (*handle)(nil)
	_ fs.FileReleaser       = (*handle)(nil)
	_ fs.FileFsyncer        = (*handle)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeStatfser       = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeReadlinker     = (*node)(nil)
	_ fs.InodeEmbedder      = (*node)(nil)
)

// path is the node's path in dir/live.
func (n *node) path() string { return filepath.Join(n.lfs.live, n.Path(nil)) }

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	var before syscall.Stat_t
	existed := syscall.Lstat(filepath.Join(n.path(), name), &before) == nil
	ch, fh, fuseFlags, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return ch, fh, fuseFlags, errno
	}
	switch {
	case !existed:
		n.lfs.created(out.Attr.Ino)
	case flags&syscall.O_TRUNC != 0:
		n.lfs.truncated(out.Attr.Ino, 0)
	}
	return ch, n.lfs.wrap(fh, out.Attr.Ino), fuseFlags, 0
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fuseFlags, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return fh, fuseFlags, errno
	}
	var st syscall.Stat_t
	lf := fh.(*fs.LoopbackFile)
	fd, _ := lf.PassthroughFd()
	if err := syscall.Fstat(fd, &st); err != nil {
		_ = lf.Release(ctx)
		return nil, 0, fs.ToErrno(err)
	}
	if flags&syscall.O_TRUNC != 0 {
		n.lfs.truncated(st.Ino, 0)
	}
	return n.lfs.wrap(fh, st.Ino), fuseFlags, 0
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Mkdir(ctx, name, mode, out)
	if errno == 0 {
		n.lfs.created(out.Attr.Ino)
	}
	return ch, errno
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Mknod(ctx, name, mode, rdev, out)
	if errno == 0 {
		n.lfs.created(out.Attr.Ino)
	}
	return ch, errno
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, errno := n.LoopbackNode.Symlink(ctx, target, name, out)
	if errno == 0 {
		n.lfs.created(out.Attr.Ino)
	}
	return ch, errno
}

// Setattr records a truncation, whether made through a handle or a path.
func (n *node) Setattr(ctx context.Context, f fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	errno := n.LoopbackNode.Setattr(ctx, f, in, out)
	if sz, ok := in.GetSize(); ok && errno == 0 {
		n.lfs.truncated(out.Ino, int64(sz))
	}
	return errno
}

// Fsync is every fsync and fdatasync of a file, and of a directory opened
// without a handle of ours.
func (n *node) Fsync(ctx context.Context, f fs.FileHandle, flags uint32) syscall.Errno {
	if h, ok := f.(*handle); ok {
		return n.lfs.syncFile(h.fd)
	}
	if n.StableAttr().Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return n.lfs.syncDir(n.path())
	}
	fd, err := syscall.Open(n.path(), syscall.O_RDONLY, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	defer syscall.Close(fd)
	return n.lfs.syncFile(fd)
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ds, fuseFlags, errno := n.LoopbackNode.OpendirHandle(ctx, flags)
	if errno != 0 {
		return ds, fuseFlags, errno
	}
	return &dirHandle{ds: ds, n: n}, fuseFlags, 0
}

// CopyFileRange is refused as unimplemented, so that the kernel copies
// with reads and writes, which are tracked.
func (n *node) CopyFileRange(context.Context, fs.FileHandle, uint64, *fs.Inode, fs.FileHandle, uint64, uint64, uint64) (uint32, syscall.Errno) {
	return 0, syscall.ENOSYS
}

// dirHandle is the loopback's directory stream, its fsync ours.
type dirHandle struct {
	ds fs.FileHandle
	n  *node
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	return d.ds.(fs.FileReaddirenter).Readdirent(ctx)
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	return d.ds.(fs.FileSeekdirer).Seekdir(ctx, off)
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	d.ds.(fs.FileReleasedirer).Releasedir(ctx, flags)
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.lfs.syncDir(d.n.path())
}

// handle is the loopback's file handle, its writes, truncations and
// syncs told to the FS. It offers no passthrough descriptor, so that the
// kernel sends every write here.
type handle struct {
	lf  *fs.LoopbackFile
	fd  int
	ino uint64
	lfs *FS
}

func (f *FS) wrap(fh fs.FileHandle, ino uint64) fs.FileHandle {
	lf := fh.(*fs.LoopbackFile)
	fd, _ := lf.PassthroughFd()
	return &handle{lf: lf, fd: fd, ino: ino, lfs: f}
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	n, errno := h.lf.Write(ctx, data, off)
	h.lfs.wrote(h.ino, off, int64(n))
	return n, errno
}

func (h *handle) Writev(ctx context.Context, data [][]byte, off int64) (uint32, syscall.Errno) {
	n, errno := h.lf.Writev(ctx, data, off)
	h.lfs.wrote(h.ino, off, int64(n))
	return n, errno
}

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return h.lf.Read(ctx, buf, off)
}

func (h *handle) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Setattr(ctx, in, out) // node.Setattr records a truncation
}

// Allocate records the bytes a punch, zeroing, collapse or insert
// changed. A plain allocation changes no byte, only perhaps the size,
// which a sync copies anyway.
func (h *handle) Allocate(ctx context.Context, off, size uint64, mode uint32) syscall.Errno {
	errno := h.lf.Allocate(ctx, off, size, mode)
	if errno != 0 {
		return errno
	}
	switch {
	case mode&(unix.FALLOC_FL_COLLAPSE_RANGE|unix.FALLOC_FL_INSERT_RANGE) != 0:
		h.lfs.wrote(h.ino, int64(off), math.MaxInt64-int64(off)) // every byte after off moved
	case mode&(unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_ZERO_RANGE) != 0:
		h.lfs.wrote(h.ino, int64(off), int64(size))
	}
	return 0
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	return h.lf.Getattr(ctx, out)
}

func (h *handle) Lseek(ctx context.Context, off uint64, whence uint32) (uint64, syscall.Errno) {
	return h.lf.Lseek(ctx, off, whence)
}

func (h *handle) Flush(ctx context.Context) syscall.Errno { return h.lf.Flush(ctx) }

func (h *handle) Release(ctx context.Context) syscall.Errno { return h.lf.Release(ctx) }

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	return h.lfs.syncFile(h.fd)
}
