package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/go-chi/chi/v5"
)

// validate checks the request against openapi.yaml; the body's content
// only when checkBody (its media type always).
func (s *Server) validate(r *http.Request, body []byte, checkBody bool) error {
	if !checkBody {
		if op := s.onlyNames(r); op != nil {
			return checkMediaType(op, r.Header.Get("Content-Type"), body)
		}
	}
	// A shallow copy carries the already decoded body; the headers are
	// copied only in the rare case they must change.
	vr := new(http.Request)
	*vr = *r
	vr.Body = io.NopCloser(bytes.NewReader(body))
	vr.ContentLength = int64(len(body))
	if !checkBody {
		// kin-openapi's security check reads (copies) any body it is given,
		// even with ExcludeRequestBody.
		vr.Body, vr.ContentLength = http.NoBody, 0
	}
	if noType := vr.Header.Get("Content-Type") == "" && len(body) > 0; noType || vr.Header.Get("Content-Encoding") != "" {
		vr.Header = vr.Header.Clone()
		vr.Header.Del("Content-Encoding")
		if noType {
			vr.Header.Set("Content-Type", "application/json")
		}
	}
	route, params, err := s.oaRouter.FindRoute(vr)
	if err != nil {
		return badRequest("", "%v", err)
	}
	if err := checkMediaType(route.Operation, vr.Header.Get("Content-Type"), body); err != nil {
		return err
	}
	err = openapi3filter.ValidateRequest(r.Context(), &openapi3filter.RequestValidationInput{
		Request: vr, PathParams: params, Route: route,
		Options: &openapi3filter.Options{
			AuthenticationFunc:  openapi3filter.NoopAuthenticationFunc,
			SkipSettingDefaults: true,
			ExcludeRequestBody:  !checkBody,
		},
	})
	if err == nil {
		return nil
	}
	return validationProblem(err)
}

// checkMediaType refuses a body whose Content-Type op does not take.
func checkMediaType(op *openapi3.Operation, contentType string, body []byte) error {
	rb := op.RequestBody
	if rb == nil || rb.Value == nil || len(body) == 0 {
		return nil
	}
	if contentType == "" {
		contentType = "application/json"
	}
	mt, err := mediaType(contentType)
	if err != nil || rb.Value.Content.Get(mt) == nil {
		return newHTTPError(415, "unsupported_media_type", "Unsupported media type",
			"Content-Type %q is not accepted here (accepted: %s)", contentType, strings.Join(mediaTypes(rb.Value.Content), ", "))
	}
	return nil
}

// mediaType is mime.ParseMediaType's media type, without its parameter
// map (an allocation on every send) when a client sends one of the two
// types the API takes, as they are written.
func mediaType(contentType string) (string, error) {
	switch contentType {
	case "application/json", "application/octet-stream":
		return contentType, nil
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return mt, err
}

// hotOp is what validate needs of a hot route's operation without asking
// kin-openapi: the operation, and the names of its header parameters.
type hotOp struct {
	op      *openapi3.Operation
	headers []string
}

// opKey names an operation by method and chi route pattern.
type opKey struct{ method, pattern string }

// onlyNames returns the operation of a request to a hot route whose only
// parameters are its path names, which prepare has checked with
// core.ValidateName (the Name schema's rule; TestValidateNameIsTheNameSchema);
// nil otherwise. Then kin-openapi has nothing left to check (the body is
// the handler's) and is skipped: routing and parameter checks were ~5 µs
// of a send.
func (s *Server) onlyNames(r *http.Request) *openapi3.Operation {
	rc := chi.RouteContext(r.Context())
	if rc == nil || r.URL.RawQuery != "" {
		return nil // kin-openapi checks (or words the refusal of) a query
	}
	h, ok := s.hotOps[opKey{r.Method, rc.RoutePattern()}]
	if !ok {
		return nil
	}
	for _, name := range h.headers {
		if _, present := r.Header[name]; present {
			return nil
		}
	}
	return h.op
}

// hotOperations indexes the operations of the routes given by method and
// chi pattern (which writes path templates as OpenAPI does).
func hotOperations(doc *openapi3.T, routes ...string) (map[opKey]hotOp, error) {
	out := map[opKey]hotOp{}
	for _, route := range routes {
		method, pattern, _ := strings.Cut(route, " ")
		item := doc.Paths.Find(pattern)
		if item == nil || item.GetOperation(method) == nil {
			return nil, fmt.Errorf("gateway: %s is not in openapi.yaml", route)
		}
		h := hotOp{op: item.GetOperation(method)}
		for _, p := range append(item.Parameters, h.op.Parameters...) {
			if p.Value.In == openapi3.ParameterInHeader {
				h.headers = append(h.headers, http.CanonicalHeaderKey(p.Value.Name))
			}
		}
		out[opKey{method, pattern}] = h
	}
	return out, nil
}

func mediaTypes(c openapi3.Content) []string {
	out := make([]string, 0, len(c))
	for mt := range c {
		out = append(out, mt)
	}
	slices.Sort(out)
	return out
}

// validationProblem turns a kin-openapi error into invalid_request with the
// JSON pointer of the bad field.
func validationProblem(err error) error {
	var re *openapi3filter.RequestError
	if !errors.As(err, &re) {
		return badRequest("", "%v", err)
	}
	var se *openapi3.SchemaError
	if errors.As(re.Err, &se) {
		if re.Parameter != nil {
			return badRequest("", "parameter %q: %s", re.Parameter.Name, se.Reason)
		}
		path := se.JSONPointer()
		// kin-openapi reports an unknown field at its parent object.
		if m := unsupportedProperty.FindStringSubmatch(se.Reason); m != nil {
			path = append(path, m[1])
		}
		pointer := jsonPointer(path)
		where := pointer
		if where == "" {
			where = "the body"
		}
		return badRequest(pointer, "%s: %s", where, se.Reason)
	}
	if re.Parameter != nil {
		return badRequest("", "parameter %q: %v", re.Parameter.Name, re.Err)
	}
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return badRequest("", "malformed JSON at byte %d: %v", syn.Offset, syn)
	}
	return badRequest("", "%s", strings.TrimPrefix(re.Error(), "request body has an error: "))
}

var unsupportedProperty = regexp.MustCompile(`^property "(.*)" is unsupported$`)

// jsonPointer builds an RFC 6901 pointer; the whole document is "".
func jsonPointer(path []string) string {
	var b strings.Builder
	for _, seg := range path {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(seg))
	}
	return b.String()
}
