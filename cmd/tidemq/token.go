package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/tidemq/tidemq/gateway"
)

// tokenCommand mints a token: it prints the token (give it to the client;
// it is shown once) and the tokens-file entry holding only its SHA-256.
func tokenCommand(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("tidemq token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "client", "name of the token in the tokens file")
	actions := fs.String("actions", "publish,subscribe", "comma-separated actions: publish, subscribe, admin")
	topics := fs.String("topics", "", "comma-separated topic patterns (exact or ending in *); empty means all")
	groups := fs.String("groups", "", "comma-separated group patterns for subscribe; empty means all")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		return 0 // asked for: the usage is the answer, as with tidemq --help
	} else if err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tidemq token: unexpected argument %q: it takes only flags\n", fs.Arg(0))
		return 2
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		fmt.Fprintln(stderr, "tidemq token:", err)
		return 1
	}
	token := "tmq_" + base64.RawURLEncoding.EncodeToString(raw[:])
	list := func(s string) string {
		var parts []string
		for p := range strings.SplitSeq(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				parts = append(parts, fmt.Sprintf("%q", p))
			}
		}
		return "[" + strings.Join(parts, ", ") + "]"
	}
	grant := "{actions: " + list(*actions)
	if *topics != "" {
		grant += ", topics: " + list(*topics)
	}
	if *groups != "" {
		grant += ", groups: " + list(*groups)
	}
	grant += "}"
	entry := fmt.Sprintf("  - name: %s\n    sha256: %s\n    grants:\n      - %s\n", *name, gateway.HashToken(token), grant)
	if _, err := gateway.ParseTokens([]byte("tokens:\n" + entry)); err != nil {
		fmt.Fprintln(stderr, "tidemq token:", err)
		return 2
	}
	fmt.Fprintf(stdout, "token: %s\n\n# add to the tokens file (under tokens:), then send SIGHUP to reload:\n%s", token, entry)
	return 0
}
