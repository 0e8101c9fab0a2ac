package sdk_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The quickstarts of examples/ run against a real in-process server, each
// with its own topic, and must succeed and leave their messages acked.

func TestExampleQuickstarts(t *testing.T) {
	t.Parallel()
	for _, ex := range []struct {
		name  string
		tools []string
		cmd   []string // the script's path is filled in
		sent  int
	}{
		{"curl", []string{"bash", "curl"}, []string{"bash", "../examples/curl/quickstart.sh"}, 5},
		{"python", []string{"python3"}, []string{"python3", "../examples/python/quickstart.py"}, 4},
		{"js", []string{"node"}, []string{"node", "../examples/js/quickstart.mjs"}, 4},
	} {
		t.Run(ex.name, func(t *testing.T) {
			t.Parallel()
			for _, tool := range ex.tools {
				if _, err := exec.LookPath(tool); err != nil {
					t.Skipf("%s is not on PATH", tool)
				}
			}
			if _, err := os.Stat(filepath.FromSlash(ex.cmd[1])); err != nil {
				t.Fatal(err)
			}
			srv := startServer(t)
			topic := "quickstart-" + ex.name
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, ex.cmd[0], append(ex.cmd[1:], topic)...)
			cmd.Env = append(os.Environ(), "TIDEMQ_URL="+srv.URL)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(ex.cmd, " "), err, out)
			}
			for _, want := range []string{"created topic " + topic, "sent a batch of 3", "pulled ", "acked", "nacked", "deliveryAttempt 2", "OK"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
			// Everything it sent is there; its group was deleted.
			c := newClient(t, srv.URL)
			top, err := c.GetTopic(t.Context(), topic)
			if err != nil {
				t.Fatal(err)
			}
			if top.Messages != int64(ex.sent) || len(top.Subscriptions) != 0 {
				t.Errorf("after the quickstart: %d messages (want %d), subscriptions %v", top.Messages, ex.sent, top.Subscriptions)
			}

			// A failure makes it exit non-zero.
			bad := exec.CommandContext(ctx, ex.cmd[0], append(ex.cmd[1:], "-not-a-valid-name")...)
			bad.Env = append(os.Environ(), "TIDEMQ_URL="+srv.URL)
			if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), "invalid_name") {
				t.Errorf("with a bad topic name: %v\n%s", err, out)
			}
		})
	}
}
