package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/valyala/fastjson"

	"github.com/tidemq/tidemq/sdk"
)

// The wire format of openapi.yaml, as much of it as the load needs.

// PropRun and PropSentAt are the message properties a run puts on every
// message: the run's id, and the Unix time in nanoseconds at which the send
// request was built (in open loop, at which it was scheduled).
const (
	PropRun    = "loadtest.run"
	PropSentAt = "loadtest.sentAt"
)

// letters returns n random lowercase letters: a body that needs no JSON
// escaping and compresses about as well as text does.
func letters(n int, seed uint64) string {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = 'a' + byte(r.IntN(26))
	}
	return string(b)
}

// appendMessage appends one SendMessage object to buf.
func appendMessage(buf []byte, body, runID string, sentAtNs int64) []byte {
	buf = append(buf, `{"body":"`...)
	buf = append(buf, body...)
	buf = append(buf, `","properties":{"`+PropRun+`":"`...)
	buf = append(buf, runID...)
	buf = append(buf, `","`+PropSentAt+`":"`...)
	buf = strconv.AppendInt(buf, sentAtNs, 10)
	buf = append(buf, `"}}`...)
	return buf
}

// txCheckAfterSeconds is the check delay of a transactional run's half
// messages: far beyond any commit's latency, so that no check-back runs.
const txCheckAfterSeconds = 60

// txField is the transaction member of a transactional send's JSON.
const txField = `"transaction":{"checkAfterSeconds":60}`

// sendBody is a SendMessage (n == 1 and !batch) or a SendBatch of n
// messages, all stamped sentAtNs; with tx, half messages of one
// transaction.
func sendBody(n int, batch, tx bool, body, runID string, sentAtNs int64) []byte {
	buf := make([]byte, 0, n*(len(body)+96)+64)
	if !batch {
		buf = appendMessage(buf, body, runID, sentAtNs)
		if tx {
			buf = append(append(buf[:len(buf)-1], ','), txField+"}"...)
		}
		return buf
	}
	buf = append(buf, `{"messages":[`...)
	for i := range n {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendMessage(buf, body, runID, sentAtNs)
	}
	if tx {
		return append(buf, "],"+txField+"}"...)
	}
	return append(buf, "]}"...)
}

// txReply is the part of a half message's send reply (single or batch) a
// transactional run reads.
type txReply struct {
	TransactionID string `json:"transactionId"`
}

// plainSendBody is sendBody for the plain client: n messages of fresh
// random bytes from src, marshalled by encoding/json.
func plainSendBody(n int, batch, tx bool, size int, src io.Reader, runID string, sentAtNs int64) ([]byte, error) {
	msgs := make([]sdk.SendMessage, n)
	for i := range msgs {
		body := make([]byte, size)
		if _, err := io.ReadFull(src, body); err != nil {
			return nil, err
		}
		msgs[i] = sdk.NewBinaryMessage(body)
		msgs[i].Properties = map[string]string{PropRun: runID, PropSentAt: strconv.FormatInt(sentAtNs, 10)}
	}
	var t *sdk.Transaction
	if tx {
		t = &sdk.Transaction{CheckAfterSeconds: txCheckAfterSeconds}
	}
	if !batch {
		msgs[0].Transaction = t
		return json.Marshal(msgs[0])
	}
	return json.Marshal(sdk.SendBatch{Messages: msgs, Transaction: t})
}

// plainPulled is what the plain client makes of a pull reply: each body
// decoded from its encoding, as a consumer would before using it, and the
// load's view of each message.
func plainPulled(res *sdk.PullResult) (pullResult, error) {
	out := pullResult{Messages: make([]pulledMessage, len(res.Messages))}
	for i, m := range res.Messages {
		if _, err := m.Bytes(); err != nil {
			return out, fmt.Errorf("message %s: body: %w", m.MessageID, err)
		}
		pm := &out.Messages[i]
		pm.DeliveryAttempt, pm.ReceiptHandle = m.DeliveryAttempt, m.ReceiptHandle
		pm.Properties.Run, pm.Properties.SentAt = m.Properties[PropRun], m.Properties[PropSentAt]
	}
	return out, nil
}

type pullRequest struct {
	MaxMessages      int    `json:"maxMessages"`
	WaitSeconds      int    `json:"waitSeconds"`
	InvisibleSeconds int    `json:"invisibleSeconds"`
	ConsumerID       string `json:"consumerId"`
}

// pulledMessage is the part of a PulledMessage the load looks at. The two
// properties are struct fields, not a map: no map per pulled message in
// the load generator's share of the CPU.
type pulledMessage struct {
	DeliveryAttempt int    `json:"deliveryAttempt"`
	ReceiptHandle   string `json:"receiptHandle"`
	Properties      struct {
		Run    string `json:"loadtest.run"`
		SentAt string `json:"loadtest.sentAt"`
	} `json:"properties"`
}

type pullResult struct {
	Messages []pulledMessage `json:"messages"`
}

// Pull replies are read with fastjson, which finds a string's end with a
// byte search where json v2 checks every byte: the 1 KiB bodies the load
// does not look at cost json v2 ~2 µs per message, a fifth of the CPU of a
// pull phase, taken from the broker on the same cores. The whole reply is
// still parsed and checked.
var (
	pullParsers fastjson.ParserPool
	pullBuffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}
)

func decodePull(body io.Reader, out *pullResult) error {
	buf := pullBuffers.Get().(*bytes.Buffer)
	defer pullBuffers.Put(buf)
	buf.Reset()
	if _, err := buf.ReadFrom(body); err != nil {
		return err
	}
	p := pullParsers.Get()
	defer pullParsers.Put(p)
	v, err := p.ParseBytes(buf.Bytes())
	if err != nil {
		return err
	}
	list := v.Get("messages")
	if list == nil {
		return errors.New("no messages field")
	}
	msgs, err := list.Array()
	if err != nil {
		return fmt.Errorf("messages: %w", err)
	}
	out.Messages = make([]pulledMessage, len(msgs))
	for i, m := range msgs {
		pm := &out.Messages[i]
		attempt, handle := m.Get("deliveryAttempt"), m.Get("receiptHandle")
		if attempt == nil || handle == nil {
			return fmt.Errorf("message %d: no deliveryAttempt or receiptHandle", i)
		}
		if pm.DeliveryAttempt, err = attempt.Int(); err != nil {
			return fmt.Errorf("deliveryAttempt: %w", err)
		}
		h, err := handle.StringBytes()
		if err != nil {
			return fmt.Errorf("receiptHandle: %w", err)
		}
		pm.ReceiptHandle = string(h)
		if props := m.Get("properties"); props != nil {
			pm.Properties.Run = string(props.GetStringBytes("loadtest.run"))
			pm.Properties.SentAt = string(props.GetStringBytes("loadtest.sentAt"))
		}
	}
	return nil
}

type ackRequest struct {
	ReceiptHandles []string `json:"receiptHandles"`
}

type ackResult struct {
	Acked  int64 `json:"acked"`
	Failed []struct {
		Code string `json:"code"`
	} `json:"failed"`
}

// requestError is a failed request, with the code it is counted under.
type requestError struct {
	Code   string
	Status int
	Detail string
	Err    error
}

func (e *requestError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Detail)
	}
	return fmt.Sprintf("%s: %v", e.Code, e.Err)
}

func (e *requestError) Unwrap() error { return e.Err }

// errorCode is the code a failed request is counted under.
func errorCode(err error) string {
	if re, ok := errors.AsType[*requestError](err); ok {
		return re.Code
	}
	return "transport"
}

// do sends one JSON request to path (below the scenario's URL) and, on a
// 2xx reply, decodes it into out (or discards it when out is nil). Any
// other reply is a *requestError coded by its problem's `code`.
// The plain client decodes replies with encoding/json.
func (r *runner) do(ctx context.Context, method, path string, body []byte, out any) error {
	return doWith(ctx, r.s.Client, r.s.URL, r.s.Token, method, path, body, out, r.s.ClientKind == ClientPlain)
}

// doAt is do to the base URL of producer or consumer i (Scenario.URLs).
func (r *runner) doAt(ctx context.Context, i int, method, path string, body []byte, out any) error {
	base := r.s.URL
	if n := len(r.s.URLs); n > 0 {
		base = r.s.URLs[i%n]
	}
	return doWith(ctx, r.s.Client, base, r.s.Token, method, path, body, out, r.s.ClientKind == ClientPlain)
}

// doJSON is runner.do for any client, base URL and token, lean.
func doJSON(ctx context.Context, client *http.Client, baseURL, token, method, path string, body []byte, out any) error {
	return doWith(ctx, client, baseURL, token, method, path, body, out, false)
}

// doWith is doJSON, decoding a reply with encoding/json when plain.
func doWith(ctx context.Context, client *http.Client, baseURL, token, method, path string, body []byte, out any, plain bool) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+path, rd)
	if err != nil {
		return &requestError{Code: "transport", Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		code := "transport"
		if errors.Is(err, context.DeadlineExceeded) {
			code = "timeout"
		}
		return &requestError{Code: code, Err: err}
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var p struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(raw, &p) != nil || p.Code == "" {
			p.Code = "http_" + strconv.Itoa(resp.StatusCode)
			p.Detail = string(raw)
		}
		return &requestError{Code: p.Code, Status: resp.StatusCode, Detail: p.Detail}
	}
	if pr, ok := out.(*pullResult); ok && !plain {
		err = decodePull(resp.Body, pr)
	} else if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
	} else if plain {
		if err = json.NewDecoder(resp.Body).Decode(out); err == nil {
			_, err = io.Copy(io.Discard, resp.Body) // the rest, for keep-alive
		}
	} else {
		// json v2: a pull reply of 256 KiB took encoding/json ~10 µs per
		// message, a quarter of the consume phases' CPU in the load
		// generator rather than the broker.
		err = jsonv2.UnmarshalRead(resp.Body, out)
	}
	if err != nil {
		code := "transport"
		if errors.Is(err, context.DeadlineExceeded) {
			code = "timeout"
		}
		return &requestError{Code: code, Err: fmt.Errorf("reading the reply: %w", err)}
	}
	return nil
}
