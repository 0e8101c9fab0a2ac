package gateway

import (
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq"
)

// handlerFunc handles a validated request whose body has been read.
type handlerFunc func(w http.ResponseWriter, r *http.Request, body []byte) error

func (s *Server) routes() *chi.Mux {
	root := chi.NewRouter()
	// The middleware wraps each route's handler (and the 404 and 405
	// handlers), so it runs after chi has found the route, not around the
	// search: chi's search recurses once per node of the path (432 bytes
	// a level, a dozen levels for a pull or an ack), and with the
	// middleware's frames beneath it the search took a connection's
	// goroutine stack from 8 to 16 KiB, kept while the connection lives:
	// 8 KiB more for every parked long poll.
	mw := chi.Chain(s.requestLog, s.recoverer, s.compress)
	root.NotFound(mw.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problemOf(problemKind{404, "not_found", "Not found"}, "no such path: "+r.URL.Path))
	}).ServeHTTP)
	root.MethodNotAllowed(mw.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// RFC 9110 §15.5.6: a 405 lists the methods the path does serve.
		w.Header().Set("Allow", strings.Join(s.allowedMethods(r), ", "))
		writeProblem(w, problemOf(problemKind{405, "method_not_allowed", "Method not allowed"}, r.Method+" is not served on "+r.URL.Path))
	}).ServeHTTP)
	m := root.With(mw...)
	m.Get("/healthz", s.healthz)
	m.Get("/readyz", s.readyz)
	m.Get("/openapi.yaml", s.openapiYAML)
	m.Get("/", s.console)
	m.Get("/docs", s.docs)
	m.Get("/console/*", s.consoleAssets)
	m.Get("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if err := s.authorize(r, ActionAdmin, "", ""); err != nil {
			s.writeError(w, r, err)
			return
		}
		s.opts.Metrics.ServeHTTP(w, r)
	})

	m.Get("/v1/topics", s.api(ActionAdmin, s.listTopics))
	m.Put("/v1/topics/{topic}", s.api(ActionAdmin, s.putTopic))
	m.Get("/v1/topics/{topic}", s.api(ActionAdmin, s.getTopic))
	m.Delete("/v1/topics/{topic}", s.api(ActionAdmin, s.deleteTopic))
	m.Post("/v1/topics/{topic}/messages", s.writes(s.apiSend(s.timed("send", s.send))))
	// The raw form of the send at a path of its own, so that clients
	// generated from openapi.yaml reach it (the spec allows it nothing but
	// application/octet-stream); the handler is the send's.
	m.Post("/v1/topics/{topic}/messages:raw", s.writes(s.apiSend(s.timed("send", s.send))))
	m.Post("/v1/topics/{topic}/messages:batch", s.writes(s.apiSend(s.timed("batch_send", s.sendBatch))))
	m.Get("/v1/topics/{topic}/messages", s.api(ActionAdmin, s.queryMessages))
	m.Get("/v1/topics/{topic}/messages/{messageId}", s.api(ActionAdmin, s.getMessage))
	m.Get("/v1/topics/{topic}/transactions", s.api(ActionAdmin, s.listTransactions))
	m.Post("/v1/topics/{topic}/transactions/{transactionAction}", s.writes(s.api(ActionPublish, s.settleTransaction)))

	m.Get("/v1/topics/{topic}/subscriptions", s.api(ActionAdmin, s.listSubscriptions))
	m.Put("/v1/topics/{topic}/subscriptions/{group}", s.api(ActionAdmin, s.putSubscription))
	m.Get("/v1/topics/{topic}/subscriptions/{group}", s.api(ActionAdmin, s.getSubscription))
	m.Delete("/v1/topics/{topic}/subscriptions/{group}", s.api(ActionAdmin, s.deleteSubscription))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/pull", s.apiOwnBody(ActionSubscribe, s.timed("pull", s.pull)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/ack", s.writes(s.apiOwnBody(ActionSubscribe, s.timed("ack", s.handlesEndpoint("acked", decodeAck, s.ack)))))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/nack", s.writes(s.api(ActionSubscribe, s.handlesEndpoint("nacked", decodeHandles, s.nack))))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/extend", s.api(ActionSubscribe, s.handlesEndpoint("extended", decodeHandles, s.extend)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/deadletter", s.api(ActionSubscribe, s.handlesEndpoint("deadLettered", decodeHandles, s.deadLetter)))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/seek", s.api(ActionAdmin, s.seek))
	m.Get("/v1/topics/{topic}/subscriptions/{group}/dlq", s.api(ActionAdmin, s.listDeadLetters))
	m.Post("/v1/topics/{topic}/subscriptions/{group}/dlq:redrive", s.api(ActionAdmin, s.redrive))

	m.Get("/v1/mirrors", s.api(ActionAdmin, s.listMirrors))
	m.Put("/v1/mirrors/{name}", s.api(ActionAdmin, s.putMirror))
	m.Get("/v1/mirrors/{name}", s.api(ActionAdmin, s.getMirror))
	m.Delete("/v1/mirrors/{name}", s.api(ActionAdmin, s.deleteMirror))

	m.Get("/v1/cluster", s.api(ActionAdmin, s.getCluster))
	m.Post("/v1/cluster/members", s.api(ActionAdmin, s.addMember))
	m.Delete("/v1/cluster/members/{id}", s.api(ActionAdmin, s.removeMember))
	return root
}

// routeMethods are the methods the API's routes use, in the order Allow
// lists them.
var routeMethods = []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete}

// allowedMethods are the methods the router serves on r's path (chi keeps
// the ones it found to itself when a custom 405 handler is set).
func (s *Server) allowedMethods(r *http.Request) []string {
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	var out []string
	for _, m := range routeMethods {
		if s.mux.Match(chi.NewRouteContext(), m, path) {
			out = append(out, m)
		}
	}
	return out
}

// api wraps a handler: path names checked, body read (decompressed and
// capped), request validated against openapi.yaml, errors written as problems.
func (s *Server) api(action string, h handlerFunc) http.HandlerFunc {
	return s.endpoint(action, true, h)
}

// apiOwnBody is api for the hot routes, whose handlers check their JSON
// bodies against the spec as they decode them (decode.go); kin-openapi
// still checks everything else about the request.
func (s *Server) apiOwnBody(action string, h handlerFunc) http.HandlerFunc {
	return s.endpoint(action, false, h)
}

// apiSend is apiOwnBody for the sends, whose body buffers are pooled
// (prepare's recycle).
func (s *Server) apiSend(h handlerFunc) http.HandlerFunc {
	return s.endpointRecycling(ActionPublish, false, true, h)
}

func (s *Server) endpoint(action string, checkBody bool, h handlerFunc) http.HandlerFunc {
	return s.endpointRecycling(action, checkBody, false, h)
}

func (s *Server) endpointRecycling(action string, checkBody, recycle bool, h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := s.prepare(w, r, action, h, checkBody, recycle); err != nil {
			s.writeError(w, r, err)
		}
	}
}

// writes marks the routes whose requests the broker's group commit
// expects from the moment they arrive (Broker.Arriving): decoding a batch
// takes longer than a commit, and a commit that went without it would
// carry fewer requests for one fsync.
func (s *Server) writes(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		done := s.b.Arriving()
		defer done()
		h(w, r)
	}
}

// timed records how long an operation took to answer.
func (s *Server) timed(op string, h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request, body []byte) error {
		start := time.Now()
		err := h(w, r, body)
		s.latency.Record(r.Context(), time.Since(start).Seconds(),
			s.attrs(attrKey{op: op, topic: chi.URLParam(r, "topic")})...)
		return err
	}
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	_ = writeJSON(w, http.StatusOK, map[string]string{"status": "ok", "region": s.opts.Region})
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.b.Ready(); err != nil {
		s.writeError(w, r, err)
		return
	}
	_ = writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) openapiYAML(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(tidemq.OpenAPI)
}
