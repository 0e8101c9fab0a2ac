package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"time"
)

// Transactional messages (SPEC §9): a half message is stored like any send
// but delivered to nobody until its transaction is committed (then it is
// delivered like a message sent at that moment) or rolled back (then it is
// dropped). A transaction the producer leaves open past its
// checkAfterSeconds is settled by the broker's check-back: it POSTs a
// TransactionCheck to the topic's TransactionCheckURL, which answers with a
// TransactionStatus (see TransactionCheckHandler).

// TransactionStatus is a transaction's outcome, or a check's answer.
type TransactionStatus string

// Transaction statuses.
const (
	TransactionCommit   TransactionStatus = "commit"
	TransactionRollback TransactionStatus = "rollback"
	// TransactionUnknown: not decided yet (a check's answer: ask again
	// later), or not known to the producer (its commit or rollback did not
	// reach the broker).
	TransactionUnknown TransactionStatus = "unknown"
)

// TransactionResult is a transaction's half messages as the broker stored
// them.
type TransactionResult struct {
	TransactionID string
	// Results are the half messages' replies, in the order sent. Their
	// Offset is nil: a half message gets its offset when committed.
	Results []SendResult
	// Status is what SendInTransaction settled: TransactionCommit,
	// TransactionRollback, or TransactionUnknown when its commit or
	// rollback failed and the check-back will decide (the zero value while
	// the local transaction runs).
	Status TransactionStatus
}

// MessageIDs are the ids of the transaction's messages, in the order sent.
func (r TransactionResult) MessageIDs() []string {
	ids := make([]string, len(r.Results))
	for i, res := range r.Results {
		ids[i] = res.MessageID
	}
	return ids
}

// PrepareTransaction sends msgs as the half messages of one new transaction,
// once (a Producer's SendInTransaction retries): one message with POST
// …/messages, more with …/messages:batch (up to 1000, stored atomically).
// Each message's own Transaction field is ignored.
func (c *Client) PrepareTransaction(ctx context.Context, topic, producerGroup string, tx Transaction, msgs []SendMessage) (TransactionResult, error) {
	var res TransactionResult
	switch len(msgs) {
	case 0:
		return res, errors.New("tidemq: a transaction needs at least one message")
	case 1:
		m := msgs[0]
		m.Transaction = &tx
		r, err := c.Send(ctx, topic, producerGroup, m)
		if err != nil {
			return res, err
		}
		res.TransactionID, res.Results = r.TransactionID, []SendResult{r}
	default:
		var r BatchResult
		_, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "topics", topic, "messages:batch"},
			header: producerHeader(producerGroup), in: SendBatch{Messages: noTransaction(msgs), Transaction: &tx}}, &r)
		if err != nil {
			return res, err
		}
		if len(r.Results) != len(msgs) {
			return res, fmt.Errorf("tidemq: batch of %d half messages got %d results", len(msgs), len(r.Results))
		}
		res.TransactionID, res.Results = r.TransactionID, r.Results
		if res.TransactionID == "" && len(r.Results) > 0 {
			res.TransactionID = r.Results[0].TransactionID
		}
	}
	if res.TransactionID == "" {
		return res, fmt.Errorf("tidemq: send of half messages to %s: the reply has no transactionId", topic)
	}
	return res, nil
}

func noTransaction(msgs []SendMessage) []SendMessage {
	for _, m := range msgs {
		if m.Transaction != nil {
			msgs = append([]SendMessage(nil), msgs...)
			for i := range msgs {
				msgs[i].Transaction = nil
			}
			return msgs
		}
	}
	return msgs
}

// Transaction states (TransactionInfo.State).
const (
	TransactionOpen       = "open"
	TransactionCommitted  = "committed"
	TransactionRolledBack = "rolled_back"
)

// Who settled a transaction (TransactionInfo.DecidedBy).
const (
	DecidedByRequest    = "request"     // a commit or rollback call
	DecidedByCheck      = "check"       // a check-back's answer
	DecidedByCheckLimit = "check_limit" // rolled back after the last check
)

// TransactionInfo is a transaction as the broker holds it (schema
// TransactionInfo).
type TransactionInfo struct {
	TransactionID string   `json:"transactionId"`
	Topic         string   `json:"topic"`
	State         string   `json:"state"`
	DecidedBy     string   `json:"decidedBy,omitempty"`
	MessageIDs    []string `json:"messageIds"`
	ProducerGroup string   `json:"producerGroup,omitempty"`
	// Checks counts the checks that got no decision so far.
	Checks      int        `json:"checks"`
	CreatedAt   time.Time  `json:"createdAt"`
	NextCheckAt *time.Time `json:"nextCheckAt,omitempty"`
	SettledAt   *time.Time `json:"settledAt,omitempty"`
}

// TransactionList is the reply of GET /v1/topics/{topic}/transactions.
type TransactionList struct {
	Transactions []TransactionInfo `json:"transactions"`
}

// CommitTransaction commits a transaction: its half messages are delivered
// like messages sent now. It is idempotent; after a rollback it is
// ErrTransactionSettled, for an unknown id ErrTransactionNotFound.
func (c *Client) CommitTransaction(ctx context.Context, topic, transactionID string) (TransactionInfo, error) {
	return c.settle(ctx, topic, transactionID, "commit")
}

// RollbackTransaction rolls a transaction back: its half messages are
// dropped. It is idempotent; after a commit it is ErrTransactionSettled,
// for an unknown id ErrTransactionNotFound.
func (c *Client) RollbackTransaction(ctx context.Context, topic, transactionID string) (TransactionInfo, error) {
	return c.settle(ctx, topic, transactionID, "rollback")
}

func (c *Client) settle(ctx context.Context, topic, id, verb string) (TransactionInfo, error) {
	var info TransactionInfo
	_, err := c.do(ctx, request{method: http.MethodPost, path: []string{"v1", "topics", topic, "transactions", id + ":" + verb}}, &info)
	return info, err
}

// ListTransactions returns the topic's open transactions, oldest first.
func (c *Client) ListTransactions(ctx context.Context, topic string) ([]TransactionInfo, error) {
	var l TransactionList
	_, err := c.do(ctx, request{method: http.MethodGet, path: []string{"v1", "topics", topic, "transactions"}}, &l)
	return l.Transactions, err
}

// TransactionOption changes one SendInTransaction call.
type TransactionOption func(*txConfig)

type txConfig struct{ checkAfter time.Duration }

// CheckAfter sets how long the broker waits for this transaction's commit or
// rollback before its check-back asks (rounded up to whole seconds, at
// least 1), instead of ProducerOptions.TransactionCheckAfter.
func CheckAfter(d time.Duration) TransactionOption {
	return func(c *txConfig) { c.checkAfter = d }
}

func checkAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}

type txKey struct{}

// TransactionFromContext returns the transaction a SendInTransaction's local
// transaction runs in: its id and half messages, to record beside the local
// change so that a check-back can find it.
func TransactionFromContext(ctx context.Context) (TransactionResult, bool) {
	r, ok := ctx.Value(txKey{}).(TransactionResult)
	return r, ok
}

// SendInTransaction commits msgs together with a local change (a database
// transaction, say): it sends msgs as the half messages of one transaction
// (one request, atomic; retried like Send, but without dedup keys, which
// half messages may not carry: a retry after a lost reply leaves the first
// attempt's transaction open, for its check to roll back), runs localTx,
// then commits the transaction when localTx returns nil and rolls it back
// when it returns an error. localTx's ctx carries the transaction
// (TransactionFromContext). The broker waits for the commit or rollback for
// ProducerOptions.TransactionCheckAfter (or CheckAfter's) and then asks the
// topic's TransactionCheckURL, so the local change must be findable by the
// transaction id (or the message ids) for a TransactionCheckHandler to
// answer.
//
// The commit or rollback is retried like a send (it is idempotent), with
// ctx's values but not its cancellation: a caller that gave up still
// settles what its local transaction did.
//
// Errors:
//   - the half send failed: the send's error (as Send's), localTx did not
//     run, nothing was stored;
//   - localTx failed: an error wrapping localTx's (errors.Is and errors.As
//     see it); the result's Status is TransactionRollback;
//   - the commit or rollback did not reach the broker: an error matching
//     ErrTransactionUnsettled (and wrapping the cause): the half messages
//     wait for the broker's check-back, which settles them; Status is
//     TransactionUnknown;
//   - the broker had settled the transaction the other way already (a
//     check-back answered before the producer, after localTx outlived the
//     check delay): ErrTransactionSettled.
//
// If localTx panics, the panic goes on up and the check-back settles the
// transaction.
func (p *Producer) SendInTransaction(ctx context.Context, msgs []SendMessage, localTx func(ctx context.Context) error, opts ...TransactionOption) (TransactionResult, error) {
	if p.isClosed() {
		return TransactionResult{}, ErrClosed
	}
	if len(msgs) == 0 {
		return TransactionResult{}, errors.New("tidemq: a transaction needs at least one message")
	}
	cfg := txConfig{checkAfter: p.opts.TransactionCheckAfter}
	for _, o := range opts {
		o(&cfg)
	}
	tx := Transaction{CheckAfterSeconds: checkAfterSeconds(cfg.checkAfter)}
	// No dedup keys: the broker takes none on half messages. A retry
	// after a lost reply opens a second transaction; the first, committed
	// by nobody, is rolled back by its check (a check handler answers by
	// transaction id), so the messages are still delivered once.
	var res TransactionResult
	err := p.call(ctx, p.deadline(time.Now()), "send half messages", func(actx context.Context) error {
		var err error
		res, err = p.c.PrepareTransaction(actx, p.topic, p.opts.Group, tx, msgs)
		return err
	})
	if err != nil {
		return TransactionResult{}, err
	}

	localErr := localTx(context.WithValue(ctx, txKey{}, res))

	verb, settle, want := "commit", p.c.CommitTransaction, TransactionCommit
	if localErr != nil {
		verb, settle, want = "rollback", p.c.RollbackTransaction, TransactionRollback
	}
	sctx := context.WithoutCancel(ctx)
	serr := p.call(sctx, p.deadline(time.Now()), verb+" transaction", func(actx context.Context) error {
		_, err := settle(actx, p.topic, res.TransactionID)
		return err
	})
	var failed error
	if localErr != nil {
		failed = fmt.Errorf("tidemq: transaction %s: local transaction failed: %w", res.TransactionID, localErr)
	}
	switch {
	case serr == nil:
		res.Status = want
		return res, failed
	case errors.Is(serr, ErrTransactionSettled):
		// Only the check-back settles a transaction besides us.
		res.Status = TransactionRollback
		if localErr != nil {
			res.Status = TransactionCommit
		}
		return res, errors.Join(failed, fmt.Errorf("tidemq: transaction %s: the broker's check-back settled it as %s before the %s: %w",
			res.TransactionID, res.Status, verb, serr))
	default:
		res.Status = TransactionUnknown
		return res, errors.Join(failed, &unsettledError{id: res.TransactionID, verb: verb, cause: serr})
	}
}

// unsettledError is a commit or rollback that did not get through.
type unsettledError struct {
	id, verb string
	cause    error
}

func (e *unsettledError) Error() string {
	return fmt.Sprintf("tidemq: transaction %s: %s failed, the broker's check-back will settle it: %v", e.id, e.verb, e.cause)
}

func (e *unsettledError) Unwrap() []error { return []error{ErrTransactionUnsettled, e.cause} }

// ------------------------------------------------------------ check-back

// TransactionCheck is what the broker POSTs to a topic's
// TransactionCheckURL about a transaction left open past its
// checkAfterSeconds.
type TransactionCheck struct {
	Topic         string   `json:"topic"`
	TransactionID string   `json:"transactionId"`
	MessageIDs    []string `json:"messageIds"`
	ProducerGroup string   `json:"producerGroup,omitempty"`
	// Check counts the checks of this transaction: 1 for the first.
	Check int `json:"check"`
}

// TransactionCheckReply is the answer to a TransactionCheck.
type TransactionCheckReply struct {
	Status TransactionStatus `json:"status"`
}

// maxCheckBytes bounds a check's body: a batch's 1000 message ids fit many
// times over.
const maxCheckBytes = 1 << 20

// TransactionCheckHandler serves a topic's TransactionCheckURL: it decodes
// the broker's POSTed TransactionCheck, calls check, and answers
// {"status": …}. check says TransactionCommit when the local change is
// there, TransactionRollback when it is not and never will be, and
// TransactionUnknown while it may still come (its local transaction is
// running): the broker asks again later, at most the topic's
// TransactionMaxChecks times in all, then rolls back.
//
// An error from check (or a status other than those three) is answered
// 500 with a problem+json whose detail says only that the check failed;
// the error is logged with slog.Default(). The broker asks again after a
// 500 as after "unknown", but counts it as the endpoint failing (its
// circuit breaker, its logs), which is what a database that cannot be read
// is. A request that is not a POST is 405; a body that is not a check is
// 400 (code invalid_request).
func TransactionCheckHandler(check func(ctx context.Context, c TransactionCheck) (TransactionStatus, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeCheckProblem(w, http.StatusMethodNotAllowed, "method_not_allowed", "a transaction check is a POST")
			return
		}
		if ct := r.Header.Get("Content-Type"); ct != "" {
			if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
				writeCheckProblem(w, http.StatusUnsupportedMediaType, "unsupported_media_type", "a transaction check is application/json")
				return
			}
		}
		data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxCheckBytes))
		if err != nil {
			writeCheckProblem(w, http.StatusBadRequest, "invalid_request", "reading the check: "+err.Error())
			return
		}
		var c TransactionCheck
		if err := json.Unmarshal(data, &c); err != nil {
			writeCheckProblem(w, http.StatusBadRequest, "invalid_request", "not a transaction check: "+err.Error())
			return
		}
		if c.TransactionID == "" {
			writeCheckProblem(w, http.StatusBadRequest, "invalid_request", "the check has no transactionId")
			return
		}
		status, err := check(r.Context(), c)
		if err == nil && status != TransactionCommit && status != TransactionRollback && status != TransactionUnknown {
			err = fmt.Errorf("check returned status %q", status)
		}
		if err != nil {
			slog.Default().ErrorContext(r.Context(), "tidemq: transaction check failed",
				"topic", c.Topic, "transaction_id", c.TransactionID, "check", c.Check, "error", err)
			writeCheckProblem(w, http.StatusInternalServerError, "internal", "the transaction check failed")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(TransactionCheckReply{Status: status})
	})
}

func writeCheckProblem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(APIError{Title: http.StatusText(status), Status: status, Detail: detail, Code: code})
}
