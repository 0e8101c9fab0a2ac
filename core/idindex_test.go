package core_test

import (
	"testing"

	"github.com/nats-io/nuid"

	"github.com/tidemq/tidemq/core"
)

// TestIDIndexOrdersNUIDs: the ids one NUID generator makes get growing
// digests under IndexNUID (that order is what makes the index cheap to
// insert into); anything that is not a NUID keeps IndexID and IndexHash.
func TestIDIndexOrdersNUIDs(t *testing.T) {
	for range 3 {
		gen := nuid.New()
		var last uint64
		for i := range 20_000 {
			id := gen.Next()
			kind, digest := core.IDIndex(id)
			if kind != core.IndexNUID {
				t.Fatalf("NUID %q: kind %q, want %q", id, kind, core.IndexNUID)
			}
			if i > 0 && digest <= last {
				t.Fatalf("NUID %q: digest %x after %x: not growing", id, digest, last)
			}
			last = digest
		}
	}
	for _, id := range []string{"", "order-1", "0123456789ABCDEFGHIJK", "0123456789ABCDEFGHIJKLM", "0123456789AB-DEFGHIJKL", "0123456789ABCDEFGHIJK\u00e9"} {
		kind, digest := core.IDIndex(id)
		if kind != core.IndexID || digest != core.IndexHash(id) {
			t.Errorf("IDIndex(%q) = %q, %x; want IndexID, IndexHash", id, kind, digest)
		}
	}
}
