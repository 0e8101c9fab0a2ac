package gateway

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
)

// The web console (GET /), the API reference (GET /docs) and their static
// files (GET /console/*) are embedded in the binary: they work offline, with
// no CDN. The pages are plain HTML, CSS and ES modules with no build step;
// docs/console.md describes them.

//go:embed console
var consoleFiles embed.FS

// checkJaegerUI keeps a Jaeger UI URL only when it is an absolute http(s)
// URL: it ends up in a link on the console's pages.
func checkJaegerUI(raw string, log interface{ Warn(string, ...any) }) string {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return ""
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		log.Warn("console: ignoring the Jaeger UI URL: it must be an absolute http(s) URL", "jaeger_ui", raw)
		return ""
	}
	return raw
}

// consoleCSP keeps the pages on their own origin: scripts, styles, fonts and
// API calls come from this server only, so nothing is fetched from a CDN
// and nothing is sent elsewhere (Redoc's telemetry included). Styles may be
// inline because Redoc injects its own; the Jaeger link is a plain link.
const consoleCSP = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; " +
	"img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; worker-src 'self' blob:; " +
	"object-src 'none'; base-uri 'self'; form-action 'self'; frame-ancestors 'none'"

func setPageHeaders(h http.Header) {
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// consoleAsset is one embedded file, ready to serve.
type consoleAsset struct {
	body        []byte
	contentType string
	etag        string
}

var (
	consoleOnce sync.Once
	assetFiles  map[string]consoleAsset // by path under console/
	consolePage *template.Template
)

func loadConsole() {
	assetFiles = map[string]consoleAsset{}
	err := fs.WalkDir(consoleFiles, "console", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := consoleFiles.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		assetFiles[strings.TrimPrefix(p, "console/")] = consoleAsset{
			body: body, contentType: assetType(p), etag: `W/"` + hex.EncodeToString(sum[:12]) + `"`,
		}
		return nil
	})
	if err != nil {
		panic("gateway: embedded console: " + err.Error()) // the files are compiled in
	}
	consolePage = template.Must(template.New("index.html").Parse(string(assetFiles["index.html"].body)))
}

// assetType is the Content-Type of an embedded file. JavaScript is sent as
// application/javascript, a type the compression middleware knows.
func assetType(p string) string {
	switch path.Ext(p) {
	case ".html":
		return "text/html; charset=utf-8"
	case ".js", ".mjs":
		return "application/javascript; charset=utf-8"
	case ".css":
		return "text/css; charset=utf-8"
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	case ".json":
		return "application/json"
	}
	return "text/plain; charset=utf-8" // LICENSE, README.md
}

// console serves the console page, with the Jaeger UI URL in a meta tag.
func (s *Server) console(w http.ResponseWriter, r *http.Request) {
	consoleOnce.Do(loadConsole)
	var buf bytes.Buffer
	if err := consolePage.Execute(&buf, struct{ JaegerUI string }{s.opts.JaegerUI}); err != nil {
		s.writeError(w, r, err)
		return
	}
	h := w.Header()
	setPageHeaders(h)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	_, _ = w.Write(buf.Bytes())
}

// docs serves the API reference page; Redoc renders /openapi.yaml in it.
func (s *Server) docs(w http.ResponseWriter, r *http.Request) {
	s.serveAsset(w, r, "docs.html")
}

// consoleAssets serves the console's static files under /console/.
func (s *Server) consoleAssets(w http.ResponseWriter, r *http.Request) {
	s.serveAsset(w, r, chi.URLParam(r, "*"))
}

func (s *Server) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	consoleOnce.Do(loadConsole)
	a, ok := assetFiles[name]
	if !ok || name == "index.html" { // the console page is served at / only
		writeProblem(w, problemOf(problemKind{404, "not_found", "Not found"}, "no such path: "+r.URL.Path))
		return
	}
	h := w.Header()
	if strings.HasSuffix(name, ".html") {
		setPageHeaders(h)
	} else {
		h.Set("X-Content-Type-Options", "nosniff")
	}
	h.Set("Content-Type", a.contentType)
	h.Set("Cache-Control", "no-cache") // revalidate: the ETag makes that cheap
	h.Set("ETag", a.etag)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
