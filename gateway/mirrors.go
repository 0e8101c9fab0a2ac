package gateway

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

// Mirrors (SPEC §8): definitions and state; the copying is the mirror
// package's runner.

type mirrorSourceJSON struct {
	URL   string `json:"url"`
	Topic string `json:"topic"`
	Token string `json:"token,omitempty"`
}

type mirrorAlertsJSON struct {
	MaxLag     *int64  `json:"maxLag"`
	WebhookURL *string `json:"webhookUrl"`
}

type mirrorRequest struct {
	Source    mirrorSourceJSON  `json:"source"`
	Topic     string            `json:"topic"`
	Filter    string            `json:"filter"`
	StartFrom string            `json:"startFrom"`
	State     string            `json:"state"`
	Alerts    *mirrorAlertsJSON `json:"alerts"`
}

type mirrorJSON struct {
	Name         string            `json:"name"`
	Source       mirrorSourceJSON  `json:"source"`
	Topic        string            `json:"topic"`
	Filter       string            `json:"filter"`
	StartFrom    string            `json:"startFrom"`
	Alerts       *mirrorAlertsJSON `json:"alerts,omitempty"`
	CreatedAt    Time              `json:"createdAt"`
	State        string            `json:"state"`
	Lag          int64             `json:"lag"`
	Copied       uint64            `json:"copied"`
	LastCopiedAt *Time             `json:"lastCopiedAt"`
	LastError    *string           `json:"lastError"`
}

func mirrorOut(m core.MirrorInfo) mirrorJSON {
	out := mirrorJSON{Name: m.Name, Source: mirrorSourceJSON{URL: m.Source.URL, Topic: m.Source.Topic},
		Topic: m.Topic, Filter: m.Filter, StartFrom: m.StartFrom, CreatedAt: Time(m.CreatedAt),
		State: m.State, Lag: m.Lag, Copied: m.Copied}
	if a := m.Alerts; a != nil {
		out.Alerts = &mirrorAlertsJSON{MaxLag: a.MaxLag}
		if a.WebhookURL != "" {
			out.Alerts.WebhookURL = &a.WebhookURL
		}
	}
	if !m.LastCopiedAt.IsZero() {
		t := Time(m.LastCopiedAt)
		out.LastCopiedAt = &t
	}
	if m.LastError != "" {
		out.LastError = &m.LastError
	}
	return out
}

func (s *Server) putMirror(w http.ResponseWriter, r *http.Request, body []byte) error {
	var req mirrorRequest
	if err := decodeJSON(body, &req); err != nil {
		return err
	}
	cfg := core.MirrorConfig{
		Source: core.MirrorSource{URL: req.Source.URL, Topic: req.Source.Topic, Token: req.Source.Token},
		Topic:  req.Topic, Filter: req.Filter, StartFrom: req.StartFrom, Paused: req.State == core.MirrorPaused,
	}
	if a := req.Alerts; a != nil {
		cfg.Alerts = &core.AlertConfig{MaxLag: a.MaxLag}
		if a.WebhookURL != nil {
			cfg.Alerts.WebhookURL = *a.WebhookURL
		}
	}
	info, created, err := s.b.PutMirror(r.Context(), chi.URLParam(r, "name"), cfg)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return writeJSON(w, status, mirrorOut(info))
}

func (s *Server) getMirror(w http.ResponseWriter, r *http.Request, _ []byte) error {
	info, err := s.b.GetMirror(chi.URLParam(r, "name"))
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, mirrorOut(info))
}

func (s *Server) listMirrors(w http.ResponseWriter, r *http.Request, _ []byte) error {
	ms := s.b.ListMirrors()
	out := struct {
		Mirrors []mirrorJSON `json:"mirrors"`
	}{Mirrors: make([]mirrorJSON, len(ms))}
	for i, m := range ms {
		out.Mirrors[i] = mirrorOut(m)
	}
	return writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteMirror(w http.ResponseWriter, r *http.Request, _ []byte) error {
	if err := s.b.DeleteMirror(r.Context(), chi.URLParam(r, "name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
