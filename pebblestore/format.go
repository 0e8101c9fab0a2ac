package pebblestore

import (
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// formatVersion is the version of the key layout this build reads and
// writes (doc.go). A store records it at creation (keyFormat, u32); a
// change of layout that an older build would misread gets a new version,
// and a build refuses a data dir of any version it does not know rather
// than read it wrong.
const formatVersion = 1

// errFormat reports a data dir whose layout this build does not read.
var errFormat = errors.New("pebblestore: unsupported data dir format")

// checkFormat reads the store's format version, writing it into a store
// that holds nothing yet. A dir with keys but no version was written by a
// build before versions, whose layout is not this one's.
func checkFormat(db *pebble.DB, dir string) error {
	v, closer, err := db.Get(keyFormat)
	switch {
	case err == nil:
		defer closer.Close()
		if len(v) != 4 {
			return fmt.Errorf("%w: %s has format version %x (%d bytes); this build reads version %d", errFormat, dir, v, len(v), formatVersion)
		}
		if got := be.Uint32(v); got != formatVersion {
			return fmt.Errorf("%w: %s has format version %d; this build reads version %d", errFormat, dir, got, formatVersion)
		}
		return nil
	case !errors.Is(err, pebble.ErrNotFound):
		return fmt.Errorf("pebblestore: reading the format version of %s: %w", dir, err)
	}
	it, err := db.NewIter(&pebble.IterOptions{})
	if err != nil {
		return err
	}
	holdsKeys := it.First()
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("pebblestore: reading %s: %w", dir, err)
	}
	if holdsKeys {
		return fmt.Errorf("%w: %s holds data but no format version (found none); this build reads version %d", errFormat, dir, formatVersion)
	}
	if err := db.Set(keyFormat, be.AppendUint32(nil, formatVersion), pebble.Sync); err != nil {
		return fmt.Errorf("pebblestore: writing the format version of %s: %w", dir, err)
	}
	return nil
}
