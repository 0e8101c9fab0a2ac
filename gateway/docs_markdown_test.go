package gateway_test

import (
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/tidemq/tidemq/gateway"
)

// TestDocsShowNoRawMarkdown: /docs renders every Markdown description of
// openapi.yaml (info, servers, tags, operations), so none of the page's
// text shows a code span's backticks. Redoc renders some fields (a
// server's description) as plain text; those must not hold Markdown.
func TestDocsShowNoRawMarkdown(t *testing.T) {
	doc, err := gateway.LoadSpec()
	if err != nil {
		t.Fatal(err)
	}
	srv := startConsoleServer(t, "", nil)
	b := newBrowser(t, srv.URL)
	b.do("opening /docs", chromedp.Navigate(srv.URL+"/docs"))
	b.wait("the introduction renders", `document.body.innerText.includes("Delivery guarantee: at least once")`)
	check := func(where string) {
		t.Helper()
		text := b.eval(`document.body.innerText`)
		for line := range strings.Lines(text) {
			if strings.Contains(line, "`") {
				t.Errorf("%s shows raw Markdown: %q", where, strings.TrimSpace(line))
			}
		}
	}
	check("the introduction")
	for _, tag := range doc.Tags {
		// A tag's operations show when its hash is opened; wait for the
		// first one's summary.
		var first string
		for _, item := range doc.Paths.Map() {
			for _, op := range item.Operations() {
				if first == "" && len(op.Tags) > 0 && op.Tags[0] == tag.Name {
					first = op.Summary
				}
			}
		}
		b.wait("the sidebar links to "+tag.Name, `!!document.querySelector('a[href="#/`+tag.Name+`"]')`)
		b.do("opening the "+tag.Name+" operations", chromedp.Evaluate[chromedp.Void](`location.hash = "#/`+tag.Name+`"`))
		b.wait("the reference shows "+first, `document.body.innerText.includes(`+jsString(first)+`)`)
		check("the " + tag.Name + " operations")
	}
}
