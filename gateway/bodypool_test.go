package gateway_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// The sends' body buffers are pooled (a buffer goes back once its request
// is answered): bodies sent at once by many producers, in batches, alone
// and raw, are each stored as sent. A buffer given back while its
// request's messages were still being stored would let another request's
// body overwrite them.
func TestPooledSendBodiesStoredAsSent(t *testing.T) {
	ts := startServer(t, serverConfig{})
	c := ts.client(t)
	c.createTopic("pool", 4)
	subscribe(c, "pool", "g")

	const producers, rounds, batch = 8, 12, 40
	want := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for p := range producers {
		wg.Go(func() {
			hc := &http.Client{}
			for r := range rounds {
				body := func(i int) string {
					// Lengths differ by request: a pooled buffer is taken up by
					// shorter and longer bodies.
					return fmt.Sprintf("p%d-r%d-m%d-%s", p, r, i, bytes.Repeat([]byte{'a' + byte((p+r+i)%26)}, 200+(p*37+r*11+i)%300))
				}
				var req *http.Request
				var sent []string
				switch r % 3 {
				case 0:
					msgs := make([]map[string]any, batch)
					for i := range msgs {
						sent = append(sent, body(i))
						msgs[i] = map[string]any{"body": sent[i]}
					}
					b, _ := json.Marshal(map[string]any{"messages": msgs})
					req, _ = http.NewRequest("POST", ts.URL+batchPath("pool"), bytes.NewReader(b))
					req.Header.Set("Content-Type", "application/json")
				case 1:
					sent = []string{body(0)}
					b, _ := json.Marshal(map[string]any{"body": sent[0]})
					req, _ = http.NewRequest("POST", ts.URL+sendPath("pool"), bytes.NewReader(b))
					req.Header.Set("Content-Type", "application/json")
				default:
					sent = []string{body(0)}
					req, _ = http.NewRequest("POST", ts.URL+sendPath("pool"), bytes.NewReader([]byte(sent[0])))
					req.Header.Set("Content-Type", "application/octet-stream")
				}
				resp, err := hc.Do(req)
				if err != nil {
					errs <- err
					return
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					errs <- fmt.Errorf("send: %s", resp.Status)
					return
				}
				mu.Lock()
				for _, s := range sent {
					want[s] = true
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	got := 0
	for got < len(want) {
		msgs := c.pull("pool", "g", map[string]any{"maxMessages": 256, "waitSeconds": 1})
		if len(msgs) == 0 {
			break
		}
		var handles []string
		for _, m := range msgs {
			body := m.Body
			if m.BodyEncoding == "base64" {
				b, err := base64.StdEncoding.DecodeString(body)
				if err != nil {
					t.Fatal(err)
				}
				body = string(b)
			}
			if !want[body] {
				t.Fatalf("message %s holds a body that was never sent: %.60q…", m.MessageID, body)
			}
			delete(want, body)
			handles = append(handles, m.ReceiptHandle)
		}
		c.ack("pool", "g", handles...)
	}
	if len(want) != 0 {
		t.Fatalf("%d bodies sent and acknowledged were not delivered", len(want))
	}
}
