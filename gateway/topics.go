package gateway

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

func (s *Server) listTopics(w http.ResponseWriter, r *http.Request, _ []byte) error {
	topics := s.b.ListTopics()
	out := struct {
		Topics []topicJSON `json:"topics"`
	}{Topics: make([]topicJSON, len(topics))}
	for i, t := range topics {
		out.Topics[i] = topicOut(t)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) putTopic(w http.ResponseWriter, r *http.Request, body []byte) error {
	var req topicRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	info, created, err := s.b.PutTopic(r.Context(), chi.URLParam(r, "topic"), core.TopicConfig{
		Queues: req.Queues, RetentionHours: req.RetentionHours, TransactionCheckURL: req.TransactionCheckURL,
		TransactionMaxChecks: req.TransactionMaxChecks, TransactionAlertURL: req.TransactionAlertURL,
	})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, topicOut(info))
}

func (s *Server) getTopic(w http.ResponseWriter, r *http.Request, _ []byte) error {
	info, err := s.b.GetTopic(chi.URLParam(r, "topic"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, topicOut(info))
}

func (s *Server) deleteTopic(w http.ResponseWriter, r *http.Request, _ []byte) error {
	if err := s.b.DeleteTopic(r.Context(), chi.URLParam(r, "topic")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
