package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
)

func writeJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeBody(w, status, body)
}

// writeBody writes a JSON document.
func writeBody(w http.ResponseWriter, status int, body []byte) error {
	body = append(body, '\n') // curl users read it on a line of its own
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, err := w.Write(body)
	return err
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
