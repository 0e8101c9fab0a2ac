package pebblestore

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fsyncRing is an io_uring used for one thing: fdatasync on a kernel worker
// thread, its completion signalled on an eventfd the netpoller watches, so
// the waiting goroutine holds no P (see walsync.go). One sync is in flight
// at a time; Pebble syncs a WAL from a single goroutine.
type fsyncRing struct {
	mu     sync.Mutex
	fd     int
	rings  []byte // submission and completion rings, one mapping
	sqes   []byte
	params uringParams
	done   *os.File // eventfd, non-blocking, so reads park in the netpoller
	broken bool     // a submission or an fsync failed in the ring: plain syscalls from then on
	synced atomic.Int64
}

// The io_uring ABI (include/uapi/linux/io_uring.h), only what is used.
const (
	uringOffSQEs         = 0x10000000
	uringFeatSingleMmap  = 1 << 0
	uringOpFsync         = 3
	uringFsyncDatasync   = 1 << 0
	uringRegisterEventfd = 4
	uringSQESize         = 64
	uringCQESize         = 16
)

type uringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type uringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  uringSQOffsets
	cqOff                                                                  uringCQOffsets
}

type uringSQE struct {
	opcode     uint8
	flags      uint8
	ioprio     uint16
	fd         int32
	off        uint64
	addr       uint64
	len        uint32
	fsyncFlags uint32
	userData   uint64
	_          [3]uint64
}

type uringCQE struct {
	userData uint64
	res      int32
	flags    uint32
}

// The kernel reads these to the byte: a size that drifts fails the build.
var (
	_ [unsafe.Sizeof(uringParams{}) - 120]byte
	_ [120 - unsafe.Sizeof(uringParams{})]byte
	_ [unsafe.Sizeof(uringSQE{}) - uringSQESize]byte
	_ [uringSQESize - unsafe.Sizeof(uringSQE{})]byte
	_ [unsafe.Sizeof(uringCQE{}) - uringCQESize]byte
	_ [uringCQESize - unsafe.Sizeof(uringCQE{})]byte
)

// newFsyncRing sets up the ring, or says why it cannot (no io_uring in the
// kernel, disabled by sysctl or a seccomp profile): the caller then syncs
// with the plain syscall.
func newFsyncRing() (*fsyncRing, error) {
	r := &fsyncRing{fd: -1}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&r.params)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r.fd = int(fd)
	if err := r.setup(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *fsyncRing) setup() error {
	p := &r.params
	if p.features&uringFeatSingleMmap == 0 {
		return errors.New("io_uring: kernel lacks IORING_FEAT_SINGLE_MMAP (5.4+)")
	}
	size := max(int(p.sqOff.array)+int(p.sqEntries)*4, int(p.cqOff.cqes)+int(p.cqEntries)*uringCQESize)
	var err error
	if r.rings, err = unix.Mmap(r.fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("io_uring: mmap rings: %w", err)
	}
	if r.sqes, err = unix.Mmap(r.fd, uringOffSQEs, int(p.sqEntries)*uringSQESize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fmt.Errorf("io_uring: mmap entries: %w", err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("io_uring: eventfd: %w", err)
	}
	r.done = os.NewFile(uintptr(efd), "io_uring-completions")
	efd32 := int32(efd)
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), uringRegisterEventfd, uintptr(unsafe.Pointer(&efd32)), 1, 0, 0); errno != 0 {
		return fmt.Errorf("io_uring_register eventfd: %w", errno)
	}
	return nil
}

// ringWord is one of the rings' shared counters; the kernel reads and
// writes them with acquire/release ordering, Go's atomics are stronger.
func (r *fsyncRing) ringWord(off uint32) *uint32 {
	return (*uint32)(unsafe.Pointer(&r.rings[off]))
}

// fdatasync has a kernel worker fdatasync(2) fd and returns its result.
// While spinWhile (if not nil) says so, it polls for the completion,
// yielding the CPU to other threads between looks (the kernel worker may
// need this one); then it parks. synced false means the ring did not run
// the sync (it is set aside) and the caller must, the plain way.
func (r *fsyncRing) fdatasync(fd uintptr, spinWhile func() bool) (synced bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.broken {
		return false, nil
	}
	p := &r.params
	tail := atomic.LoadUint32(r.ringWord(p.sqOff.tail))
	slot := tail & *r.ringWord(p.sqOff.ringMask)
	*(*uringSQE)(unsafe.Pointer(&r.sqes[slot*uringSQESize])) = uringSQE{
		opcode: uringOpFsync, fd: int32(fd), fsyncFlags: uringFsyncDatasync,
	}
	*r.ringWord(p.sqOff.array + slot*4) = slot
	atomic.StoreUint32(r.ringWord(p.sqOff.tail), tail+1)
	if !r.submitOne() {
		// The entry may still sit in the ring; never entering the ring
		// again keeps it from completing for a later sync.
		r.broken = true
		return false, nil
	}
	var counter [8]byte
	for {
		head := atomic.LoadUint32(r.ringWord(p.cqOff.head))
		if head != atomic.LoadUint32(r.ringWord(p.cqOff.tail)) {
			cqe := (*uringCQE)(unsafe.Pointer(&r.rings[p.cqOff.cqes+(head&*r.ringWord(p.cqOff.ringMask))*uringCQESize]))
			res := cqe.res
			atomic.StoreUint32(r.ringWord(p.cqOff.head), head+1)
			switch errno := unix.Errno(-res); {
			case res >= 0:
			case errno == unix.EINVAL || errno == unix.EOPNOTSUPP:
				// A kernel whose ring cannot fsync this file: the plain
				// call decides, so the ring never adds an error (Pebble
				// treats a failed WAL sync as fatal).
				r.broken = true
				return false, nil
			default:
				return true, &os.SyscallError{Syscall: "fdatasync", Err: errno}
			}
			r.synced.Add(1)
			return true, nil
		}
		if spinWhile != nil && spinWhile() {
			yieldThread()
			continue
		}
		spinWhile = nil
		// Parks in the netpoller until the kernel posts a completion. A
		// count left from an earlier completion that was reaped without
		// reading it only costs one more turn of this loop.
		if _, err := r.done.Read(counter[:]); err != nil {
			return true, fmt.Errorf("io_uring: wait for fdatasync: %w", err)
		}
	}
}

// yieldThread gives the CPU to another thread that wants it (the kernel's
// io-wq worker, the journal), keeping this one's Go P: the polling loops'
// pause between looks.
func yieldThread() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// submitOne tells the kernel about the entry just queued.
func (r *fsyncRing) submitOne() bool {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 1, 0, 0, 0, 0)
		if errno != unix.EINTR {
			return errno == 0 && n == 1
		}
	}
}

// syncs counts the fdatasyncs the ring completed; a nil ring, none.
func (r *fsyncRing) syncs() int64 {
	if r == nil {
		return 0
	}
	return r.synced.Load()
}

// close releases the ring; a nil ring has nothing to release.
func (r *fsyncRing) close() error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	if r.sqes != nil {
		errs = append(errs, unix.Munmap(r.sqes))
		r.sqes = nil
	}
	if r.rings != nil {
		errs = append(errs, unix.Munmap(r.rings))
		r.rings = nil
	}
	if r.fd >= 0 {
		errs = append(errs, unix.Close(r.fd))
		r.fd = -1
	}
	if r.done != nil {
		errs = append(errs, r.done.Close())
		r.done = nil
	}
	return errors.Join(errs...)
}
