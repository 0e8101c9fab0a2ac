package gateway

import (
	"fmt"
	"regexp/syntax"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/tidemq/tidemq"
)

// bodyLimits are the bounds the hot-body decoders (decode.go) hold fields
// to, read from openapi.yaml's schemas: the spec is the one place a limit
// is written, and TestBodyLimitsFollowTheSpec fails if one is copied into
// the code.
type bodyLimits struct {
	keys          itemCount // SendMessage.keys
	key           textLength
	shardingKey   textLength
	dedupKey      textLength
	tag           textLength // the Tag pattern's repeat, ^[^|\s]{1,64}$
	delaySeconds  intRange
	bodyEncodings []string
	batch         itemCount // SendBatch.messages
	maxMessages   intRange  // PullRequest
	waitSeconds   intRange
	invisible     intRange
	consumerID    textLength
	handles       itemCount // AckRequest.receiptHandles
	checkAfter    intRange  // Transaction.checkAfterSeconds
}

// textLength bounds a string's length in characters; max 0 is no bound.
type textLength struct{ min, max int }

// itemCount bounds an array's length.
type itemCount struct{ min, max int }

// intRange bounds an integer, both ends included.
type intRange struct{ lo, hi int64 }

// specLimits are the limits of the embedded openapi.yaml, read once.
var specLimits = sync.OnceValues(func() (*bodyLimits, error) { return readBodyLimits(tidemq.OpenAPI) })

// readBodyLimits reads the hot bodies' limits from an OpenAPI document;
// a limit the decoders need and the document does not give is an error.
// The document is not validated here: New refuses an invalid one.
func readBodyLimits(spec []byte) (*bodyLimits, error) {
	doc, err := openapi3.NewLoader().LoadFromData(spec)
	if err != nil {
		return nil, fmt.Errorf("gateway: load openapi.yaml: %w", err)
	}
	r := limitReader{doc: doc}
	l := &bodyLimits{
		keys:          r.items("SendMessage", "keys"),
		shardingKey:   r.text(r.prop("SendMessage", "shardingKey")),
		dedupKey:      r.text(r.prop("SendMessage", "dedupKey")),
		tag:           r.patternRepeat(r.prop("SendMessage", "tag")),
		delaySeconds:  r.integer("SendMessage", "delaySeconds"),
		bodyEncodings: r.enum("SendMessage", "bodyEncoding"),
		batch:         r.items("SendBatch", "messages"),
		maxMessages:   r.integer("PullRequest", "maxMessages"),
		waitSeconds:   r.integer("PullRequest", "waitSeconds"),
		invisible:     r.integer("PullRequest", "invisibleSeconds"),
		consumerID:    r.text(r.prop("PullRequest", "consumerId")),
		handles:       r.items("AckRequest", "receiptHandles"),
		checkAfter:    r.integer("Transaction", "checkAfterSeconds"),
	}
	if keys := r.prop("SendMessage", "keys"); keys != nil {
		if keys.Items == nil || keys.Items.Value == nil {
			r.fail("SendMessage.keys has no items schema")
		} else {
			l.key = r.text(keys.Items.Value)
		}
	}
	if r.err != nil {
		return nil, fmt.Errorf("gateway: openapi.yaml: %w", r.err)
	}
	return l, nil
}

// limitReader reads schema bounds, keeping the first error.
type limitReader struct {
	doc *openapi3.T
	err error
}

func (r *limitReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

// prop is the schema of property name of component schema, nil (and an
// error kept) when there is none.
func (r *limitReader) prop(schema, name string) *openapi3.Schema {
	s := r.doc.Components.Schemas[schema]
	if s == nil || s.Value == nil {
		r.fail("no schema %s", schema)
		return nil
	}
	p := s.Value.Properties[name]
	if p == nil || p.Value == nil {
		r.fail("schema %s has no property %s", schema, name)
		return nil
	}
	return p.Value
}

func (r *limitReader) text(s *openapi3.Schema) textLength {
	if s == nil {
		return textLength{}
	}
	if s.MaxLength == nil {
		r.fail("a string schema the decoder bounds has no maxLength")
		return textLength{}
	}
	return textLength{min: int(s.MinLength), max: int(*s.MaxLength)}
}

func (r *limitReader) items(schema, name string) itemCount {
	s := r.prop(schema, name)
	if s == nil {
		return itemCount{}
	}
	if s.MaxItems == nil {
		r.fail("%s.%s has no maxItems", schema, name)
		return itemCount{}
	}
	return itemCount{min: int(s.MinItems), max: int(*s.MaxItems)}
}

func (r *limitReader) integer(schema, name string) intRange {
	s := r.prop(schema, name)
	if s == nil {
		return intRange{}
	}
	if s.Min == nil || s.Max == nil {
		r.fail("%s.%s needs a minimum and a maximum", schema, name)
		return intRange{}
	}
	return intRange{lo: int64(*s.Min), hi: int64(*s.Max)}
}

func (r *limitReader) enum(schema, name string) []string {
	s := r.prop(schema, name)
	if s == nil {
		return nil
	}
	var out []string
	for _, v := range s.Enum {
		str, ok := v.(string)
		if !ok {
			r.fail("%s.%s: enum value %v is not a string", schema, name, v)
			return nil
		}
		out = append(out, str)
	}
	if len(out) == 0 {
		r.fail("%s.%s has no enum", schema, name)
	}
	return out
}

// patternRepeat reads the length bounds of a pattern that is one repeated
// character class between anchors, as the Tag pattern ^[^|\s]{1,64}$ is.
func (r *limitReader) patternRepeat(s *openapi3.Schema) textLength {
	if s == nil {
		return textLength{}
	}
	re, err := syntax.Parse(s.Pattern, syntax.Perl)
	if err != nil {
		r.fail("pattern %q: %v", s.Pattern, err)
		return textLength{}
	}
	if re.Op == syntax.OpConcat && len(re.Sub) == 3 && re.Sub[0].Op == syntax.OpBeginText &&
		re.Sub[1].Op == syntax.OpRepeat && re.Sub[1].Max > 0 && re.Sub[2].Op == syntax.OpEndText {
		return textLength{min: re.Sub[1].Min, max: re.Sub[1].Max}
	}
	r.fail("pattern %q is not ^[class]{min,max}$", s.Pattern)
	return textLength{}
}

// oneOf words an enum for a problem: "utf8 or base64".
func oneOf(values []string) string {
	if len(values) <= 1 {
		return strings.Join(values, "")
	}
	return strings.Join(values[:len(values)-1], ", ") + " or " + values[len(values)-1]
}
