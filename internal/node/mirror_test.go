package node

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Two nodes of two regions: the destination's runner (wired with its
// broker) copies the source's topic, and resumes after a restart on its
// data directory, the definition and skip record read back from the store.
func TestMirrorResumesAfterRestart(t *testing.T) {
	hzCfg := testConfig(t)
	hzCfg.Region = "hz"
	hz, err := Start(context.Background(), hzCfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hz.Shutdown(context.Background()) })
	sgCfg := testConfig(t)
	sgCfg.Region = "sg"
	sg, err := Start(context.Background(), sgCfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	do := func(method, url, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	hzURL := "http://" + hz.Addr()
	if code := send(t, hzURL, ""); code != http.StatusCreated {
		t.Fatalf("send: %d", code)
	}
	if code, body := do("PUT", "http://"+sg.Addr()+"/v1/mirrors/from-hz",
		`{"source":{"url":"`+hzURL+`","topic":"orders"},"topic":"orders"}`); code != http.StatusCreated {
		t.Fatalf("PUT mirror: %d %s", code, body)
	}
	copied := func(n *Node, want string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			_, body := do("GET", "http://"+n.Addr()+"/v1/mirrors/from-hz", "")
			if strings.Contains(body, `"copied":`+want+`,`) && strings.Contains(body, `"lag":0,`) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("mirror after 20 s: %s; want copied %s", body, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	copied(sg, "1")
	if err := sg.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code := send(t, hzURL, ""); code != http.StatusCreated {
			t.Fatalf("send: %d", code)
		}
	}
	sg, err = Start(context.Background(), sgCfg, quiet())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sg.Shutdown(context.Background()) })
	copied(sg, "3")
	if _, body := do("GET", "http://"+sg.Addr()+"/healthz", ""); !strings.Contains(body, `"region":"sg"`) {
		t.Errorf("healthz %s", body)
	}
}
