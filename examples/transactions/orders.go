package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/tidemq/tidemq/sdk"
	_ "modernc.org/sqlite" // the pure-Go SQLite driver, "sqlite"
)

// The order service: placing an order writes a row to the orders table and
// sends the message "order created", both or neither. The message goes as
// a half message first; the row is written in a SQL transaction that also
// records the transaction id; then the half message is committed (or
// rolled back when the SQL transaction failed). If the service dies in
// between, the broker asks /tx-check, which answers from the database.

const schema = `
CREATE TABLE IF NOT EXISTS orders (
	id         TEXT PRIMARY KEY,
	item       TEXT NOT NULL,
	tx_id      TEXT NOT NULL UNIQUE,
	created_at TEXT NOT NULL
);
-- Transactions a check answered "rollback" for. A local transaction that
-- finds its id here gives up, so a slow order can never be written after
-- the broker dropped its message.
CREATE TABLE IF NOT EXISTS rolled_back (
	tx_id      TEXT PRIMARY KEY,
	decided_at TEXT NOT NULL
);`

// Errors of placing an order, each a reply status.
var (
	errOrderExists   = errors.New("order exists")                               // 409
	errRolledBack    = errors.New("the broker's check rolled this order back")  // 409
	errLocalFailure  = errors.New("local transaction failed (simulated)")       // 422
	errInvalidOrder  = errors.New("an order needs an id and an item")           // 400
	errMessageFailed = errors.New("the order message could not be sent")        // 503
	errInconsistent  = errors.New("order and message were settled differently") // 500
)

type service struct {
	db       *sql.DB
	producer *sdk.Producer
	log      *slog.Logger
	// settleDelay is a wait between the local commit and the message's
	// commit, standing for a slow link to the broker: it widens the window
	// a crash can fall into, for demonstrations and the test.
	settleDelay time.Duration

	// running holds the transactions whose local transaction is under way
	// in this process: a check about one of them answers "unknown" (ask
	// again later) rather than "rollback" while its row is not there yet.
	// After a crash it is empty, rightly: SQLite rolled back whatever was
	// not committed.
	mu      sync.Mutex
	running map[string]bool
}

// openDB opens (creating) the SQLite database. WAL with synchronous=NORMAL
// keeps every committed transaction across a crash of the process (not of
// the machine's power); one connection serialises the writers, which
// SQLite does anyway.
func openDB(ctx context.Context, path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		return nil, errors.Join(fmt.Errorf("creating the schema in %s: %w", path, err), db.Close())
	}
	return db, nil
}

type order struct {
	ID   string `json:"orderId"`
	Item string `json:"item"`
	// SimulateFailure makes the local transaction fail after its insert
	// (standing for a constraint, a payment refused…): the order is not
	// placed and its message is rolled back.
	SimulateFailure bool `json:"simulateFailure,omitempty"`
	// LocalWorkMs makes the local transaction do that much slow work (a
	// payment service's call, say) before its insert: longer than the
	// check delay, a check comes while it runs and is answered "unknown".
	LocalWorkMs int `json:"localWorkMs,omitempty"`
}

type placed struct {
	OrderID       string `json:"orderId"`
	TransactionID string `json:"transactionId"`
	// Message is "committed", or "pending" when the commit did not reach
	// the broker (its check-back commits it).
	Message string `json:"message"`
}

// place places o: the half message, then the row, then the commit.
func (s *service) place(ctx context.Context, o order) (placed, error) {
	if o.ID == "" || o.Item == "" {
		return placed{}, errInvalidOrder
	}
	body, _ := json.Marshal(map[string]string{"event": "order created", "orderId": o.ID, "item": o.Item})
	msg := sdk.SendMessage{Body: string(body), Tag: "created", Keys: []string{o.ID}, ShardingKey: o.ID}
	var localErr error
	res, err := s.producer.SendInTransaction(ctx, []sdk.SendMessage{msg}, func(ctx context.Context) error {
		tx, _ := sdk.TransactionFromContext(ctx)
		localErr = s.insert(ctx, tx.TransactionID, o)
		if localErr == nil && s.settleDelay > 0 {
			time.Sleep(s.settleDelay)
		}
		return localErr
	})
	out := placed{OrderID: o.ID, TransactionID: res.TransactionID, Message: "committed"}
	switch {
	case res.TransactionID == "":
		return out, fmt.Errorf("%w: %w", errMessageFailed, err)
	case localErr != nil:
		// Not placed. Had the rollback failed too, a check would find no
		// row and roll it back.
		return out, err
	case err == nil:
		return out, nil
	case errors.Is(err, sdk.ErrTransactionUnsettled):
		// The row is there; the check-back will commit the message.
		s.log.Warn("order placed, its message waits for the broker's check", "order", o.ID, "transaction_id", res.TransactionID, "error", err)
		out.Message = "pending"
		return out, nil
	case errors.Is(err, sdk.ErrTransactionSettled):
		return out, fmt.Errorf("%w: %w", errInconsistent, err)
	}
	return out, err
}

// insert is the local transaction: the order's row, with its transaction
// id, unless a check already rolled the transaction back.
func (s *service) insert(ctx context.Context, txID string, o order) (err error) {
	s.mu.Lock()
	s.running[txID] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.running, txID)
		s.mu.Unlock()
	}()
	if o.LocalWorkMs > 0 {
		select {
		case <-time.After(time.Duration(o.LocalWorkMs) * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, ignoreDone(tx.Rollback()))
		}
	}()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM rolled_back WHERE tx_id = ?`, txID).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return errRolledBack
	}
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE id = ?`, o.ID).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return errOrderExists
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item, tx_id, created_at) VALUES (?, ?, ?, ?)`,
		o.ID, o.Item, txID, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		return err
	}
	if o.SimulateFailure {
		return errLocalFailure
	}
	return tx.Commit()
}

func ignoreDone(err error) error {
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	return err
}

// check answers the broker's check-back from the database: the order's row
// is there → commit; its local transaction is still running here →
// unknown; else rollback, recorded so that the order can no longer be
// written.
func (s *service) check(ctx context.Context, c sdk.TransactionCheck) (sdk.TransactionStatus, error) {
	s.mu.Lock()
	running := s.running[c.TransactionID]
	s.mu.Unlock()
	if running {
		s.log.Info("check answered", "transaction_id", c.TransactionID, "check", c.Check, "status", sdk.TransactionUnknown)
		return sdk.TransactionUnknown, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", err
	}
	defer func() { _ = ignoreDone(tx.Rollback()) }()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE tx_id = ?`, c.TransactionID).Scan(&n); err != nil {
		return "", err
	}
	if n > 0 {
		s.log.Info("check answered", "transaction_id", c.TransactionID, "check", c.Check, "status", sdk.TransactionCommit)
		return sdk.TransactionCommit, nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO rolled_back (tx_id, decided_at) VALUES (?, ?)`,
		c.TransactionID, time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
		return "", err
	}
	if err := tx.Commit(); err != nil {
		return "", err
	}
	s.log.Info("check answered", "transaction_id", c.TransactionID, "check", c.Check, "status", sdk.TransactionRollback)
	return sdk.TransactionRollback, nil
}

// handler serves POST /orders, POST /tx-check and GET /healthz.
func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /tx-check", sdk.TransactionCheckHandler(s.check))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var o order
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&o); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		p, err := s.place(r.Context(), o)
		status := http.StatusCreated
		switch {
		case err == nil && p.Message == "pending":
			status = http.StatusAccepted
		case err == nil:
		case errors.Is(err, errInvalidOrder):
			status = http.StatusBadRequest
		case errors.Is(err, errOrderExists), errors.Is(err, errRolledBack):
			status = http.StatusConflict
		case errors.Is(err, errLocalFailure):
			status = http.StatusUnprocessableEntity
		case errors.Is(err, errMessageFailed):
			status = http.StatusServiceUnavailable
		default:
			status = http.StatusInternalServerError
			s.log.Error("placing an order", "order", o.ID, "error", err)
		}
		if err != nil {
			writeJSON(w, status, map[string]string{"orderId": o.ID, "transactionId": p.TransactionID, "error": err.Error()})
			return
		}
		writeJSON(w, status, p)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
