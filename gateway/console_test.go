package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/tidemq/tidemq/core"
	"github.com/tidemq/tidemq/gateway"
	"github.com/tidemq/tidemq/pebblestore"
)

// Console tests: the web console (/), its static files (/console/*) and the
// API reference (/docs), in a real headless Chromium driven by chromedp,
// against the real wiring (Pebble, core, gateway) in-process.
//
// Chromium is Debian's /usr/bin/chromium. When it is missing and the test
// runs as root, it is installed with apt-get; otherwise the browser tests
// skip. Set TIDEMQ_UPDATE_SCREENSHOT=1 to rewrite docs/console.png.

const (
	consoleTestTimeout = 60 * time.Second
	stepTimeout        = 15 * time.Second // one step of a test: a wait, a click, a form
)

// ---------------------------------------------------------------- server

type consoleServer struct {
	URL  string
	gw   *gateway.Server
	hc   *http.Client
	logs *consoleLog
}

// startConsoleServer wires pebblestore → core → gateway as cmd/tidemq does;
// wrap, when given, wraps the gateway's handler (to stand in for the
// security that is not built yet).
func startConsoleServer(t *testing.T, jaegerUI string, wrap func(http.Handler) http.Handler) *consoleServer {
	t.Helper()
	return startConsoleServerWith(t, gateway.Options{JaegerUI: jaegerUI}, wrap)
}

// startConsoleServerWith is startConsoleServer with the gateway's options
// (their Logger is the test's).
func startConsoleServerWith(t *testing.T, opts gateway.Options, wrap func(http.Handler) http.Handler) *consoleServer {
	t.Helper()
	logs := &consoleLog{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	store, err := pebblestore.Open(t.TempDir(), pebblestore.Options{Logger: logger})
	if err != nil {
		t.Fatalf("pebblestore.Open: %v", err)
	}
	b, err := core.New(store, core.Options{AutoCreate: true, Logger: logger})
	if err != nil {
		_ = store.Close()
		t.Fatalf("core.New: %v", err)
	}
	opts.Logger = logger
	gw, err := gateway.New(b, opts)
	if err != nil {
		_ = b.Close()
		_ = store.Close()
		t.Fatalf("gateway.New: %v", err)
	}
	var h http.Handler = gw
	if wrap != nil {
		h = wrap(gw)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		b.StopPolling()
		srv.Close()
		if err := b.Close(); err != nil {
			t.Errorf("broker Close: %v", err)
		}
		if err := store.Close(); err != nil {
			t.Errorf("store Close: %v", err)
		}
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return &consoleServer{URL: srv.URL, gw: gw, hc: srv.Client(), logs: logs}
}

// consoleLog collects the server's log, shown when a test fails.
type consoleLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *consoleLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *consoleLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// call does one API request over plain HTTP and decodes the JSON reply into
// out (when not nil); it fails the test on a status other than want.
func (s *consoleServer) call(t *testing.T, method, path string, body any, want int, out any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := s.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, path, res.StatusCode, want, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: decoding %s: %v", method, path, raw, err)
		}
	}
}

func (s *consoleServer) send(t *testing.T, topic string, msg map[string]any) string {
	t.Helper()
	var res struct {
		MessageID string `json:"messageId"`
	}
	s.call(t, "POST", "/v1/topics/"+topic+"/messages", msg, http.StatusCreated, &res)
	return res.MessageID
}

type consolePulled struct {
	MessageID     string `json:"messageId"`
	ReceiptHandle string `json:"receiptHandle"`
}

func (s *consoleServer) pull(t *testing.T, topic, group string, max int) []consolePulled {
	t.Helper()
	var res struct {
		Messages []consolePulled `json:"messages"`
	}
	s.call(t, "POST", "/v1/topics/"+topic+"/subscriptions/"+group+"/pull",
		map[string]any{"maxMessages": max, "waitSeconds": 5, "consumerId": "worker-1"}, http.StatusOK, &res)
	return res.Messages
}

func consoleHandles(msgs []consolePulled) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ReceiptHandle
	}
	return out
}

// ---------------------------------------------------------------- browser

const chromiumPath = "/usr/bin/chromium"

var (
	chromiumOnce sync.Once
	chromiumErr  error
)

// needChromium returns the path of Chromium, installing Debian's package
// when it is missing and the test runs as root; otherwise the test skips.
func needChromium(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("browser test skipped in -short mode (it drives a real Chromium)")
	}
	if _, err := os.Stat(chromiumPath); err == nil {
		return chromiumPath
	}
	if os.Geteuid() != 0 {
		t.Skipf("browser test skipped: %s is missing and the test is not root, so it cannot install it; run `apt-get install -y chromium`", chromiumPath)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skipf("browser test skipped: %s is missing and there is no apt-get to install it", chromiumPath)
	}
	chromiumOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		for _, args := range [][]string{{"update"}, {"install", "-y", "chromium"}} {
			cmd := exec.CommandContext(ctx, "apt-get", args...)
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			out, err := cmd.CombinedOutput()
			if err != nil {
				tail := out[max(0, len(out)-2000):]
				chromiumErr = fmt.Errorf("apt-get %s: %v\n%s", strings.Join(args, " "), err, tail)
				return
			}
		}
		if _, err := os.Stat(chromiumPath); err != nil {
			chromiumErr = fmt.Errorf("apt-get installed chromium but %s is still missing: %v", chromiumPath, err)
		}
	})
	if chromiumErr != nil {
		t.Fatalf("installing Chromium for the browser tests: %v", chromiumErr)
	}
	return chromiumPath
}

// browser is one headless Chromium tab, watching what the page does: every
// uncaught exception and every request it sends elsewhere than the server
// under test fails the test.
type browser struct {
	t      *testing.T
	ctx    context.Context // the tab, bounded by consoleTestTimeout
	origin string

	mu       sync.Mutex
	problems []string                     // exceptions, CSP violations
	offsite  map[network.RequestID]string // requests to another origin, until the CSP blocks them
	authz    []string                     // Authorization headers of the API requests seen
}

// redocLogo is the one thing a page asks of another origin: Redoc draws its
// "API docs by Redocly" logo from Redocly's CDN. The pages' CSP blocks it
// (so nothing leaves the machine) and Redoc then hides the image.
const redocLogo = "https://cdn.redoc.ly/redoc/logo-mini"

func newBrowser(t *testing.T, origin string) *browser {
	t.Helper()
	path := needChromium(t)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("force-color-profile", "srgb"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	b := &browser{t: t, origin: origin, offsite: map[network.RequestID]string{}}
	tabCtx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithListener(b.observe))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser to exit, before its profile dir goes
	})
	if err := chromedp.Do(tabCtx); err != nil { // starts the browser, with no timeout
		t.Fatalf("starting Chromium: %v", err)
	}
	ctx, cancel := context.WithTimeout(tabCtx, consoleTestTimeout)
	t.Cleanup(cancel)
	b.ctx = ctx
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, p := range b.problems {
			t.Errorf("in the page: %s", p)
		}
		for _, u := range b.offsite {
			t.Errorf("in the page: a request went to another origin (the pages must work offline): %s", u)
		}
	})
	return b
}

// observe runs in the tab's event loop: it only records.
func (b *browser) observe(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			msg = d.Exception.Description
		}
		b.problems = append(b.problems, fmt.Sprintf("uncaught exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
	case *log.EventEntryAdded:
		if e := ev.Entry; e != nil && strings.Contains(e.Text, "Content Security Policy") && !strings.Contains(e.Text, redocLogo) {
			b.problems = append(b.problems, "CSP violation: "+e.Text)
		}
	case *network.EventRequestWillBeSent:
		u := ev.Request.URL
		if !strings.HasPrefix(u, b.origin+"/") && u != b.origin && !strings.HasPrefix(u, "data:") && !strings.HasPrefix(u, "blob:") && !strings.HasPrefix(u, "about:") {
			b.offsite[ev.RequestID] = u
		}
		if strings.Contains(u, "/v1/") {
			a, _ := ev.Request.Headers["Authorization"].(string)
			b.authz = append(b.authz, a)
		}
	case *network.EventLoadingFailed:
		if u, ok := b.offsite[ev.RequestID]; ok && ev.BlockedReason == network.BlockedReasonCsp && strings.HasPrefix(u, redocLogo) {
			delete(b.offsite, ev.RequestID) // blocked before it left
		}
	}
}

// do runs actions, each step bounded so that a failure leaves time to
// show the page.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, stepTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fail(what, err)
	}
}

// wait polls a JavaScript condition until it is truthy.
func (b *browser) wait(what, expr string) {
	b.t.Helper()
	_, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(stepTimeout)))
	if err != nil {
		b.fail("waiting until "+what, err)
	}
}

func (b *browser) eval(expr string) string {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](expr))
	if err != nil {
		b.fail("evaluating "+expr, err)
	}
	return v
}

// checkLabels fails the test for a visible form control that has no
// accessible name (a label, aria-label or aria-labelledby).
func (b *browser) checkLabels(where string) {
	b.t.Helper()
	unlabelled := b.eval(`Array.from(document.querySelectorAll("input, select, textarea, button"))
		.filter((el) => el.offsetParent !== null)
		.filter((el) => !(el.labels && el.labels.length) && !el.getAttribute("aria-label") && !el.getAttribute("aria-labelledby") && !(el.tagName === "BUTTON" && el.textContent.trim()))
		.map((el) => el.outerHTML.slice(0, 120)).join("\n")`)
	if unlabelled != "" {
		b.t.Errorf("%s: form controls without a label:\n%s", where, unlabelled)
	}
}

func (b *browser) fail(what string, err error) {
	b.t.Helper()
	page, perr := chromedp.Run(b.ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 3000)`))
	if perr != nil {
		page = "(cannot read the page: " + perr.Error() + ")"
	}
	if shot, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot()); err == nil {
		p := filepath.Join(os.TempDir(), strings.ReplaceAll(b.t.Name(), "/", "_")+"-failure.png")
		if os.WriteFile(p, shot, 0o644) == nil {
			page += "\n(screenshot: " + p + ")"
		}
	}
	b.t.Fatalf("%s: %v\npage now:\n%s", what, err, page)
}

func css(sel string) chromedp.CSS { return chromedp.CSS(sel) }

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// textOf is a JavaScript expression: the text of the first element matching sel, or "".
func textOf(sel string) string {
	return fmt.Sprintf(`(document.querySelector(%s)?.textContent ?? "")`, jsString(sel))
}

// ---------------------------------------------------------------- tests

// TestConsoleServesPages checks the pages and files over plain HTTP: types,
// security headers, caching, the Jaeger meta tag, 404s, and that the
// console's own files fetch nothing from elsewhere.
func TestConsoleServesPages(t *testing.T) {
	srv := startConsoleServer(t, `http://jaeger.test:16686/?a="b"&c`, nil)
	get := func(path string, h map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		for k, v := range h {
			req.Header.Set(k, v)
		}
		res, err := srv.hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res, string(body)
	}

	res, page := get("/", nil)
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	if want := `<meta name="tidemq-jaeger-ui" content="http://jaeger.test:16686/?a=&#34;b&#34;&amp;c">`; !strings.Contains(page, want) {
		t.Errorf("GET / lacks the escaped Jaeger meta tag %s", want)
	}
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "connect-src 'self'") || !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("GET /: Content-Security-Policy = %q", csp)
	}

	for path, ctype := range map[string]string{
		"/docs":                "text/html",
		"/console/app.js":      "application/javascript",
		"/console/console.css": "text/css",
		"/console/favicon.svg": "image/svg+xml",
		"/console/vendor/redoc/redoc.standalone.js": "application/javascript",
		"/console/vendor/redoc/LICENSE":             "text/plain",
		"/console/vendor/README.md":                 "text/plain",
	} {
		res, body := get(path, nil)
		if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), ctype) || len(body) == 0 {
			t.Errorf("GET %s: %d %q, %d bytes; want 200 %s", path, res.StatusCode, res.Header.Get("Content-Type"), len(body), ctype)
			continue
		}
		if etag := res.Header.Get("ETag"); path != "/" && etag != "" {
			again, _ := get(path, map[string]string{"If-None-Match": etag})
			if again.StatusCode != http.StatusNotModified {
				t.Errorf("GET %s with If-None-Match %s: %d, want 304", path, etag, again.StatusCode)
			}
		} else {
			t.Errorf("GET %s: no ETag", path)
		}
	}
	if _, lic := get("/console/vendor/redoc/LICENSE", nil); !strings.Contains(lic, "MIT License") {
		t.Error("the Redoc licence is not served beside the bundle")
	}
	// Redoc's 2 MB bundle is compressed for browsers that ask.
	if res, _ := get("/console/vendor/redoc/redoc.standalone.js", map[string]string{"Accept-Encoding": "gzip"}); res.Header.Get("Content-Encoding") != "gzip" {
		t.Errorf("Redoc bundle: Content-Encoding %q, want gzip", res.Header.Get("Content-Encoding"))
	}

	for _, path := range []string{"/console/", "/console/nope.js", "/console/index.html", "/console/../openapi.yaml", "/console/vendor"} {
		res, body := get(path, nil)
		if path == "/console/../openapi.yaml" && res.StatusCode == 200 && strings.HasPrefix(body, "openapi:") {
			continue // the client cleaned the path: that is /openapi.yaml
		}
		if res.StatusCode != 404 || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
			t.Errorf("GET %s: %d %s, want a 404 problem", path, res.StatusCode, res.Header.Get("Content-Type"))
		}
	}

	// No CDN: the console's own pages and modules load nothing from another origin.
	for _, path := range []string{"/", "/docs", "/console/app.js", "/console/api.js", "/console/dom.js", "/console/chart.js", "/console/docs.js", "/console/console.css"} {
		_, body := get(path, nil)
		for _, bad := range []string{`src="http`, `href="http`, `from "http`, `from 'http`, `import("http`, `url(http`, `@import`} {
			if strings.Contains(body, bad) {
				t.Errorf("%s refers to another origin (%s): the console must work offline", path, bad)
			}
		}
	}
}

func TestConsoleSetConsoleRejectsBadJaegerURL(t *testing.T) {
	srv := startConsoleServer(t, "javascript:alert(1)", nil)
	res, err := srv.hc.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(body), `<meta name="tidemq-jaeger-ui" content="">`) {
		t.Errorf("a javascript: Jaeger URL was not dropped")
	}
	if !strings.Contains(srv.logs.String(), "ignoring the Jaeger UI URL") {
		t.Errorf("a bad Jaeger URL was not logged")
	}
}

// TestConsoleTopicSendQuery: create a topic in the UI (and see a problem
// shown), send a message from the UI, find it by key, open its detail
// (text and hex body, Jaeger link).
func TestConsoleTopicSendQuery(t *testing.T) {
	const jaeger = "http://jaeger.test:16686"
	srv := startConsoleServer(t, jaeger+"/", nil)
	b := newBrowser(t, srv.URL)

	b.do("opening the console", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#create-topic-form")))
	b.wait("the empty topic list shows", `document.body.innerText.includes("No topics yet")`)
	b.checkLabels("topics")

	b.do("creating a topic",
		chromedp.SendKeys(css("#new-topic-name"), "orders"),
		chromedp.SetValue(css("#new-topic-queues"), "4"),
		chromedp.SetValue(css("#new-topic-retention"), "48"),
		chromedp.Click(css("#create-topic")),
		chromedp.WaitVisible(css(`tr[data-topic="orders"]`)))
	b.wait("the topic is reported created", textOf(".form-status")+`.includes("Created topic orders")`)
	var topic struct {
		Queues         int `json:"queues"`
		RetentionHours int `json:"retentionHours"`
	}
	srv.call(t, "GET", "/v1/topics/orders", nil, 200, &topic)
	if topic.Queues != 4 || topic.RetentionHours != 48 {
		t.Errorf("topic made in the UI has %d queues, %d h; want 4, 48", topic.Queues, topic.RetentionHours)
	}

	// A problem from the API shows with its title and detail.
	b.do("shrinking the topic",
		chromedp.SendKeys(css("#new-topic-name"), "orders"),
		chromedp.SetValue(css("#new-topic-queues"), "2"),
		chromedp.Click(css("#create-topic")))
	b.wait("the problem shows", textOf("#create-topic-form .problem")+`.includes("Queue count cannot decrease")`)
	if detail := b.eval(textOf("#create-topic-form .problem-detail")); detail == "" {
		t.Error("the problem's detail is not shown")
	}

	// Send from the UI.
	b.do("opening the topic", chromedp.Click(css(`tr[data-topic="orders"] th a`)), chromedp.WaitVisible(css("#tab-send")), chromedp.WaitVisible(css(".stats .stat")))
	b.do("sending a message",
		chromedp.Click(css("#tab-send")),
		chromedp.WaitVisible(css("#send-form")),
		chromedp.Click(css("#send-form details summary")), // open "More options", to check its labels too
		chromedp.SendKeys(css("#send-tag"), "TagA"),
		chromedp.SendKeys(css("#send-keys"), "order-1001, customer-42"),
		chromedp.SendKeys(css("#send-body"), "hello from the console"),
		chromedp.Click(css("#send-submit")),
		chromedp.WaitVisible(css("#send-result-link")))
	b.checkLabels("send")
	id := b.eval(`document.querySelector("#send-result-link").dataset.messageId`)
	var got struct {
		Message struct {
			Body string   `json:"body"`
			Tag  string   `json:"tag"`
			Keys []string `json:"keys"`
		} `json:"message"`
	}
	srv.call(t, "GET", "/v1/topics/orders/messages/"+id, nil, 200, &got)
	if got.Message.Body != "hello from the console" || got.Message.Tag != "TagA" || strings.Join(got.Message.Keys, ",") != "order-1001,customer-42" {
		t.Errorf("the message sent from the UI is %+v", got.Message)
	}

	// Find it by key, open it.
	b.do("querying by key",
		chromedp.Click(css("#tab-messages")),
		chromedp.WaitVisible(css("#query-form")),
		chromedp.SendKeys(css("#q-value"), "order-1001"),
		chromedp.Click(css("#q-submit")),
		chromedp.WaitVisible(css(fmt.Sprintf(`#query-results tr[data-message-id=%q]`, id))))
	if n := b.eval(`String(document.querySelectorAll("#query-results tbody tr").length)`); n != "1" {
		t.Errorf("query by key found %s rows, want 1", n)
	}
	b.do("opening the message",
		chromedp.Click(css(fmt.Sprintf(`#query-results tr[data-message-id=%q] a`, id))),
		chromedp.WaitVisible(css("#message-body")))
	b.wait("the body shows as text", textOf("#message-body")+` === "hello from the console"`)
	b.do("switching to hex", chromedp.Click(css(`label[for="body-hex"]`)))
	b.wait("the body shows as hex", textOf("#message-body")+`.includes("68 65 6c 6c 6f 20 66 72")`)
	b.checkLabels("message")
	wantLink := jaeger + "/search?service=tidemq&tags=" + url.QueryEscape(`{"messaging.message.id":"`+id+`"}`)
	wantLink = strings.ReplaceAll(wantLink, "+", "%20")
	if link := b.eval(`document.querySelector("#jaeger-link")?.getAttribute("href") ?? ""`); link != wantLink {
		t.Errorf("Jaeger link = %q, want %q", link, wantLink)
	}
	b.wait("the per-subscription section shows", `document.body.innerText.includes("No subscription tracks this message yet")`)
}

// TestConsoleLagAndSeek: create a subscription in the UI, watch its lag
// follow sends and acks made through the API, and seek with the dry-run
// preview. It takes docs/console.png on the way.
func TestConsoleLagAndSeek(t *testing.T) {
	srv := startConsoleServer(t, "", nil)
	srv.call(t, "PUT", "/v1/topics/orders", map[string]any{"queues": 4}, http.StatusCreated, nil)
	srv.call(t, "PUT", "/v1/topics/payments", map[string]any{"queues": 2}, http.StatusCreated, nil)
	srv.call(t, "PUT", "/v1/topics/orders/subscriptions/analytics", map[string]any{"mode": "broadcast", "filter": "TagA || TagB"}, http.StatusCreated, nil)
	b := newBrowser(t, srv.URL)

	b.do("opening the topic", chromedp.Navigate(srv.URL+"/#/topics/orders"), chromedp.WaitVisible(css("#create-sub-form")),
		chromedp.WaitVisible(css(".stats .stat")), chromedp.WaitVisible(css(`tr[data-group="analytics"]`)))
	b.do("creating a subscription",
		chromedp.SendKeys(css("#new-sub-group"), "billing"),
		chromedp.SendKeys(css("#new-sub-filter"), " || TagB"), // "*" is prefilled: "* || TagB" is refused
		chromedp.Click(css("#create-sub")))
	b.wait("the filter problem shows", textOf("#create-sub-form .problem")+` !== ""`)
	b.do("fixing the filter",
		chromedp.SetValue(css("#new-sub-filter"), "*"),
		chromedp.Click(css("#create-sub")),
		chromedp.WaitVisible(css(`tr[data-group="billing"]`)))
	lagIs := func(n int) string {
		return fmt.Sprintf(`document.querySelector('tr[data-group="billing"] td.lag')?.dataset.lag === "%d"`, n)
	}
	b.wait("lag 0", lagIs(0))

	for i := range 3 {
		srv.send(t, "orders", map[string]any{"body": fmt.Sprintf(`{"order":%d}`, 1000+i), "tag": "TagA", "keys": []string{fmt.Sprintf("order-%d", 1000+i)}})
	}
	b.wait("lag 3 after three sends", lagIs(3))

	got := srv.pull(t, "orders", "billing", 2)
	if len(got) != 2 {
		t.Fatalf("pulled %d messages, want 2", len(got))
	}
	srv.call(t, "POST", "/v1/topics/orders/subscriptions/billing/ack", map[string]any{"receiptHandles": consoleHandles(got)}, 200, nil)
	b.wait("lag 1 after two acks", lagIs(1))
	b.wait("the consumer shows", textOf(`tr[data-group="billing"]`)+`.includes("worker-1")`)

	for i := range 5 {
		srv.send(t, "orders", map[string]any{"body": "more", "tag": "TagB", "keys": []string{fmt.Sprintf("order-%d", 2000+i)}})
	}
	srv.send(t, "payments", map[string]any{"body": "pay"})
	b.wait("lag 6 after five more sends", lagIs(6))
	b.wait("the sparkline has a line", `document.querySelectorAll('tr[data-group="billing"] polyline').length === 1`)
	b.wait("the send rate shows", `/\d/.test(`+textOf(".stat.rate dd")+`)`)

	shot, err := chromedp.Run(b.ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.fail("taking the screenshot", err)
	}
	if img, err := png.Decode(bytes.NewReader(shot)); err != nil || img.Bounds().Dx() < 800 {
		t.Errorf("screenshot: %v", err)
	}
	if os.Getenv("TIDEMQ_UPDATE_SCREENSHOT") != "" {
		if err := os.WriteFile(filepath.Join("..", "docs", "console.png"), shot, 0o644); err != nil {
			t.Errorf("writing docs/console.png: %v", err)
		}
	}

	// The subscription's page: big chart, then seek with the dry run first.
	b.do("opening the subscription",
		chromedp.Click(css(`tr[data-group="billing"] th a`)),
		chromedp.WaitVisible(css("#seek-form")))
	b.wait("the lag shows", `document.querySelector("#sub-lag")?.dataset.lag === "6"`)
	b.wait("the big chart has a line", `document.querySelectorAll(".chart-big polyline").length === 1`)
	b.checkLabels("subscription")
	var dry struct {
		Total int `json:"total"`
	}
	srv.call(t, "POST", "/v1/topics/orders/subscriptions/billing/seek", map[string]any{"to": "earliest", "dryRun": true}, 200, &dry)
	b.do("previewing a seek to earliest",
		chromedp.Click(css("#seek-preview")),
		chromedp.WaitVisible(css("#seek-dry-total")))
	if text := b.eval(textOf("#seek-dry-total")); !strings.HasPrefix(text, fmt.Sprintf("%d message", dry.Total)) {
		t.Errorf("seek preview says %q, the API's dry run says %d", text, dry.Total)
	}
	b.do("confirming the seek", chromedp.Click(css("#confirm-ok")))
	b.wait("the seek is reported", textOf("#seek-form .form-status")+`.startsWith("Moved")`)
	b.wait("lag 8 after the rewind", `document.querySelector("#sub-lag")?.dataset.lag === "8"`)
}

// TestConsoleRedrive: dead messages (made through the API) show with their
// reasons; redrive one selected, then all, each after its dry-run count.
func TestConsoleRedrive(t *testing.T) {
	srv := startConsoleServer(t, "", nil)
	srv.call(t, "PUT", "/v1/topics/invoices/subscriptions/mailer", map[string]any{}, http.StatusCreated, nil)
	id1 := srv.send(t, "invoices", map[string]any{"body": "poison one", "keys": []string{"inv-1"}})
	id2 := srv.send(t, "invoices", map[string]any{"body": "poison two", "keys": []string{"inv-2"}})
	got := srv.pull(t, "invoices", "mailer", 10)
	if len(got) != 2 {
		t.Fatalf("pulled %d messages, want 2", len(got))
	}
	srv.call(t, "POST", "/v1/topics/invoices/subscriptions/mailer/deadletter",
		map[string]any{"receiptHandles": consoleHandles(got), "reason": "cannot parse invoice"}, 200, nil)

	b := newBrowser(t, srv.URL)
	row := func(id string) string { return fmt.Sprintf(`tr[data-message-id=%q]`, id) }
	b.do("opening the DLQ",
		chromedp.Navigate(srv.URL+"/#/topics/invoices/subscriptions/mailer/dlq"),
		chromedp.WaitVisible(css(row(id1))), chromedp.WaitVisible(css(row(id2))))
	b.wait("the reason shows", textOf(row(id1)+" td.reason")+` === "cannot parse invoice"`)
	b.wait("the tab counts them", textOf("#tab-dlq")+`.includes("(2)")`)
	b.checkLabels("dlq")

	b.do("redriving one",
		chromedp.Click(css(row(id1)+" input.dlq-select")),
		chromedp.WaitEnabled(css("#redrive-selected")),
		chromedp.Click(css("#redrive-selected")),
		chromedp.WaitVisible(css("#redrive-dry-count")))
	b.wait("the dry run counts one", textOf("#redrive-dry-count")+`.startsWith("1 dead message ")`)
	b.do("confirming", chromedp.Click(css("#confirm-ok")))
	b.wait("the redriven message leaves the list", `!document.querySelector(`+jsString(row(id1))+`) && !!document.querySelector(`+jsString(row(id2))+`)`)

	b.do("redriving all",
		chromedp.Click(css("#redrive-all")),
		chromedp.WaitVisible(css("#redrive-dry-count")))
	b.wait("the dry run counts one", textOf("#redrive-dry-count")+`.startsWith("1 dead message ")`)
	b.do("confirming", chromedp.Click(css("#confirm-ok")), chromedp.WaitVisible(css("#dlq-empty")))

	var sub struct {
		DLQ int `json:"dlq"`
	}
	srv.call(t, "GET", "/v1/topics/invoices/subscriptions/mailer", nil, 200, &sub)
	if sub.DLQ != 0 {
		t.Errorf("dlq = %d after redriving all, want 0", sub.DLQ)
	}
	again := srv.pull(t, "invoices", "mailer", 10)
	ids := map[string]bool{}
	for _, m := range again {
		ids[m.MessageID] = true
	}
	if !ids[id1] || !ids[id2] {
		t.Errorf("after the redrive, a pull got %v; want %s and %s", again, id1, id2)
	}
}

// TestConsoleDocs: /docs renders the embedded openapi.yaml with the bundled
// Redoc, offline.
func TestConsoleDocs(t *testing.T) {
	srv := startConsoleServer(t, "", nil)
	b := newBrowser(t, srv.URL)
	b.do("opening /docs", chromedp.Navigate(srv.URL+"/docs"))
	b.wait("the introduction renders", `document.body.innerText.includes("Delivery guarantee: at least once")`)
	b.wait("the status line is gone", `document.querySelector("#docs-status").hidden`)
	// Redoc shows one tag's operations at a time, routed by the hash (the
	// sidebar's links); going there by the hash keeps the test free of
	// clicks on a sidebar that is still unfolding.
	for _, c := range []struct{ tag, op string }{
		{"dlq", "Re-drive dead messages"}, {"consumption", "Pull messages (long poll)"}, {"topics", "Create a topic, or grow it"},
	} {
		b.wait("the sidebar links to "+c.tag, `!!document.querySelector('a[href="#/`+c.tag+`"]')`)
		b.do("opening the "+c.tag+" operations", chromedp.Evaluate[chromedp.Void](`location.hash = "#/`+c.tag+`"`))
		b.wait("the reference shows "+c.op, `document.body.innerText.includes(`+jsString(c.op)+`)`)
	}
}

// TestConsoleAsksForToken: when the API answers 401, the console asks for a
// token, shows the problem, and sends the token as a bearer on every call.
func TestConsoleAsksForToken(t *testing.T) {
	const token = "s3cret-token"
	guard := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if (strings.HasPrefix(r.URL.Path, "/v1/") || r.URL.Path == "/openapi.yaml") && r.Header.Get("Authorization") != "Bearer "+token {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusUnauthorized)
				_, _ = io.WriteString(w, `{"type":"https://tidemq.dev/problems/unauthenticated","title":"Unauthenticated","status":401,"detail":"unknown bearer token","code":"unauthenticated"}`)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
	srv := startConsoleServer(t, "", guard)
	b := newBrowser(t, srv.URL)

	b.do("opening the console", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#token-input")))
	b.wait("the problem shows in the dialog", textOf("#token-reason")+`.includes("unknown bearer token")`)
	b.do("giving a wrong token",
		chromedp.SendKeys(css("#token-input"), "wrong"),
		chromedp.Click(css("#token-ok")))
	b.wait("the console asks again", `document.querySelector("#token-dialog").open && `+textOf("#token-reason")+`.includes("Unauthenticated")`)
	b.do("giving the right token",
		chromedp.SendKeys(css("#token-input"), token),
		chromedp.Click(css("#token-ok")))
	b.wait("the dialog closes", `!document.querySelector("#token-dialog").open`)
	b.wait("the topics load", `document.body.innerText.includes("No topics yet")`)
	b.do("creating a topic with the token",
		chromedp.WaitVisible(css("#create-topic-form")),
		chromedp.SendKeys(css("#new-topic-name"), "secure"),
		chromedp.Click(css("#create-topic")),
		chromedp.WaitVisible(css(`tr[data-topic="secure"]`)))
	if got := b.eval(`sessionStorage.getItem("tidemq.token")`); got != token {
		t.Errorf("sessionStorage token = %q", got)
	}
	b.mu.Lock()
	authz := append([]string(nil), b.authz...)
	b.mu.Unlock()
	var with int
	for _, a := range authz {
		if a == "Bearer "+token {
			with++
		}
	}
	if with < 2 {
		t.Errorf("API requests carried the token %d times (headers seen: %q)", with, authz)
	}
	// The API reference reads the same token.
	b.do("opening /docs", chromedp.Navigate(srv.URL+"/docs"))
	b.wait("the reference renders", `document.body.innerText.includes("Delivery guarantee: at least once")`)
}

// TestConsoleCluster: the Cluster page shows a three-node cluster (a test
// double of gateway.Cluster) with each group's leader and term, and per
// member its state, suffrage, indexes and lag behind the leader; it
// follows a leader change by itself, shows a no_leader problem, and
// recovers.
func TestConsoleCluster(t *testing.T) {
	fc := newFakeCluster()
	srv := startConsoleServerWith(t, gateway.Options{Cluster: fc}, nil)
	b := newBrowser(t, srv.URL)

	b.do("opening the console", chromedp.Navigate(srv.URL+"/"), chromedp.WaitVisible(css("#create-topic-form")))
	b.do("opening the cluster page", chromedp.Click(css("#nav-cluster")), chromedp.WaitVisible(css(`tr[data-member="n3"]`)))
	if cur := b.eval(`document.querySelector("#nav-cluster").getAttribute("aria-current")`); cur != "page" {
		t.Errorf("the Cluster link's aria-current is %q on the cluster page", cur)
	}
	member := func(id, cell string) string {
		return textOf(fmt.Sprintf(`.cluster-group[data-group="g1"] tr[data-member=%q] td.%s`, id, cell))
	}
	lag := func(id string) string {
		return fmt.Sprintf(`(document.querySelector('.cluster-group[data-group="g1"] tr[data-member=%q] td.lag')?.dataset.lag ?? "")`, id)
	}
	b.wait("the leader and term show", textOf(`.cluster-group[data-group="g1"] .leader`)+` === "n2" && `+textOf(`.cluster-group[data-group="g1"] .term`)+` === "7"`)
	for _, m := range []struct{ id, state, suffrage, last, applied, lag string }{
		{"n1", "follower", "voter", "1234", "1230", "10"},
		{"n2", "leader", "voter", "1240", "1240", "0"},
		{"n3", "follower", "voter", "1200", "1190", "50"},
	} {
		for cell, want := range map[string]string{"state": m.state, "suffrage": m.suffrage, "last": m.last, "applied": m.applied} {
			expr := member(m.id, cell)
			if cell == "last" || cell == "applied" {
				expr += `.replace(/\D/g, "")` // digits only: the page groups them as the browser's locale does
			}
			if got := b.eval(expr); got != want {
				t.Errorf("member %s: %s shows %q, want %q", m.id, cell, got, want)
			}
		}
		if got := b.eval(lag(m.id)); got != m.lag {
			t.Errorf("member %s: lag %q, want %s (the leader's lastIndex − its appliedIndex)", m.id, got, m.lag)
		}
	}
	if got := b.eval(textOf("#cluster-alive")); got != "2 of 3" {
		t.Errorf("nodes alive shows %q, want 2 of 3", got)
	}
	if got := b.eval(textOf(`tr[data-node="n3"] td.alive`)); got != "down" {
		t.Errorf("node n3 shows %q, want down", got)
	}
	if got := b.eval(textOf("#cluster-node")); got != "n1" {
		t.Errorf("answering node shows %q, want n1", got)
	}
	b.checkLabels("cluster")

	// A new leader, a new term, members catching up and a new non-voter:
	// the page follows by itself.
	fc.mu.Lock()
	g := &fc.view.Groups[0]
	g.Leader, g.Term = "n3", 8
	g.Members[0].AppliedIndex, g.Members[0].LastIndex = 1290, 1300
	g.Members[1].State, g.Members[1].AppliedIndex, g.Members[1].LastIndex = "unknown", 1250, 1250
	g.Members[2].State, g.Members[2].AppliedIndex, g.Members[2].LastIndex = "leader", 1300, 1300
	g.Members = append(g.Members, gateway.ClusterMember{ID: "n4", ClusterAddr: "127.0.0.1:7004", HTTPAddr: "127.0.0.1:8084", Suffrage: "nonvoter", State: "follower"})
	fc.view.Nodes[1].Alive, fc.view.Nodes[2].Alive = false, true
	fc.mu.Unlock()
	b.wait("the new leader shows", textOf(`.cluster-group[data-group="g1"] .leader`)+` === "n3" && `+textOf(`.cluster-group[data-group="g1"] .term`)+` === "8"`)
	for id, want := range map[string]string{"n1": "10", "n2": "50", "n3": "0", "n4": "1300"} {
		if got := b.eval(lag(id)); got != want {
			t.Errorf("after the leader change, member %s: lag %q, want %s", id, got, want)
		}
	}
	if got := b.eval(member("n4", "suffrage")); got != "nonvoter" {
		t.Errorf("the new member's suffrage shows %q", got)
	}
	if got := b.eval(member("n2", "state")); got != "unknown" {
		t.Errorf("n2's state shows %q, want unknown", got)
	}

	// A group electing its leader: the problem shows, then goes.
	fc.setErr(fmt.Errorf("group g1: %w", gateway.ErrNoLeader))
	b.wait("the no_leader problem shows", textOf(".view .problem")+`.includes("No leader")`)
	fc.setErr(nil)
	b.wait("the problem goes", `document.querySelector(".view .problem").hidden`)
	b.wait("the view is back", textOf(`.cluster-group[data-group="g1"] .leader`)+` === "n3"`)
}

// TestConsoleClusterSingleNode: a node without a cluster shows as a
// cluster of one: itself, the leader of g1, a voter with no lag.
func TestConsoleClusterSingleNode(t *testing.T) {
	srv := startConsoleServer(t, "", nil)
	b := newBrowser(t, srv.URL)
	b.do("opening the cluster page", chromedp.Navigate(srv.URL+"/#/cluster"), chromedp.WaitVisible(css(`tr[data-member="tidemq"]`)))
	b.wait("it says it runs alone", `!!document.querySelector("#cluster-single")`)
	row := `.cluster-group[data-group="g1"] tr[data-member="tidemq"]`
	for sel, want := range map[string]string{
		row + " td.state": "leader", row + " td.suffrage": "voter", row + " td.lag": "0",
		".cluster-group .leader": "tidemq", "#cluster-alive": "1 of 1",
	} {
		if got := b.eval(textOf(sel)); got != want {
			t.Errorf("%s shows %q, want %q", sel, got, want)
		}
	}
	if n := b.eval(`String(document.querySelectorAll(".cluster-group").length)`); n != "1" {
		t.Errorf("%s groups shown, want 1", n)
	}
}

// TestConsoleTransactions: the topic page lists open transactions and
// commits or rolls one back; the message page marks a half message.
func TestConsoleTransactions(t *testing.T) {
	srv := startConsoleServer(t, "", nil)
	srv.call(t, "PUT", "/v1/topics/payments/subscriptions/ledger", map[string]any{}, http.StatusCreated, nil)
	var one, two struct{ MessageID, TransactionID string }
	for _, r := range []*struct{ MessageID, TransactionID string }{&one, &two} {
		srv.call(t, "POST", "/v1/topics/payments/messages", map[string]any{"body": "half", "transaction": map[string]any{"checkAfterSeconds": 3600}}, http.StatusCreated, r)
	}
	b := newBrowser(t, srv.URL)
	row := func(id string) string { return fmt.Sprintf(`tr[data-transaction=%q]`, id) }
	b.do("opening the transactions",
		chromedp.Navigate(srv.URL+"/#/topics/payments/transactions"),
		chromedp.WaitVisible(css(row(one.TransactionID))), chromedp.WaitVisible(css(row(two.TransactionID))))
	b.wait("the half messages count", `[...document.querySelectorAll(".stat")].some((s) => s.textContent.startsWith("Half messages") && s.textContent.endsWith("2"))`)
	b.checkLabels("transactions")
	b.do("committing one",
		chromedp.Click(css(row(one.TransactionID)+" button:not(.danger)")),
		chromedp.WaitVisible(css("#confirm-ok")), chromedp.Click(css("#confirm-ok")))
	b.wait("it leaves the list", `!document.querySelector(`+jsString(row(one.TransactionID))+`)`)
	b.do("rolling back the other",
		chromedp.Click(css(row(two.TransactionID)+" button.danger")),
		chromedp.WaitVisible(css("#confirm-ok")), chromedp.Click(css("#confirm-ok")))
	b.wait("the list is empty", `document.querySelector("#transactions").textContent.includes("No open transactions")`)
	got := srv.pull(t, "payments", "ledger", 10)
	if len(got) != 1 || got[0].MessageID != one.MessageID {
		t.Fatalf("pulled %v, want only the committed half message", got)
	}

	var three struct{ MessageID string }
	srv.call(t, "POST", "/v1/topics/payments/messages", map[string]any{"body": "half", "transaction": map[string]any{"checkAfterSeconds": 3600}}, http.StatusCreated, &three)
	b.do("opening a half message", chromedp.Navigate(srv.URL+"/#/topics/payments/messages/"+three.MessageID))
	b.wait("it is marked half", `document.body.textContent.includes("half message: waiting for its transaction")`)
}
