package gateway

import (
	"net/http"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/tidemq/tidemq/core"
)

// transactionJSON is a TransactionInfo of openapi.yaml.
type transactionJSON struct {
	TransactionID string   `json:"transactionId"`
	Topic         string   `json:"topic"`
	State         string   `json:"state"`
	DecidedBy     string   `json:"decidedBy,omitempty"`
	MessageIDs    []string `json:"messageIds"`
	ProducerGroup string   `json:"producerGroup,omitempty"`
	Checks        int      `json:"checks"`
	CreatedAt     Time     `json:"createdAt"`
	NextCheckAt   *Time    `json:"nextCheckAt,omitempty"`
	SettledAt     *Time    `json:"settledAt,omitempty"`
}

func transactionOut(t core.TransactionInfo) transactionJSON {
	out := transactionJSON{TransactionID: t.TransactionID, Topic: t.Topic, State: t.State, DecidedBy: t.DecidedBy,
		MessageIDs: t.MessageIDs, ProducerGroup: t.ProducerGroup, Checks: t.Checks, CreatedAt: Time(t.CreatedAt)}
	if !t.NextCheckAt.IsZero() {
		at := Time(t.NextCheckAt)
		out.NextCheckAt = &at
	}
	if !t.SettledAt.IsZero() {
		at := Time(t.SettledAt)
		out.SettledAt = &at
	}
	if out.MessageIDs == nil {
		out.MessageIDs = []string{}
	}
	return out
}

// settleTransaction serves POST …/transactions/{transactionId}:commit and
// …:rollback. The verb shares the path segment with the id, which neither
// chi nor kin-openapi's router splits, so it is one route and one
// operation (its parameter's pattern allows the two verbs only).
func (s *Server) settleTransaction(w http.ResponseWriter, r *http.Request, _ []byte) error {
	id, verb, _ := strings.Cut(chi.URLParam(r, "transactionAction"), ":")
	settle := s.b.RollbackTransaction
	if verb == "commit" {
		settle = s.b.CommitTransaction
	}
	info, err := settle(r.Context(), chi.URLParam(r, "topic"), id)
	if err != nil {
		return err
	}
	return writeJSON(w, http.StatusOK, transactionOut(info))
}

func (s *Server) listTransactions(w http.ResponseWriter, r *http.Request, _ []byte) error {
	txs, err := s.b.ListTransactions(chi.URLParam(r, "topic"))
	if err != nil {
		return err
	}
	out := struct {
		Transactions []transactionJSON `json:"transactions"`
	}{Transactions: make([]transactionJSON, len(txs))}
	for i, t := range txs {
		out.Transactions[i] = transactionOut(t)
	}
	return writeJSON(w, http.StatusOK, out)
}
