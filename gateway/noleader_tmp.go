package gateway

import "net/http"

// WriteNoLeader writes the 503 no_leader problem (temporary; replaced at merge).
func WriteNoLeader(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Retry-After", "1")
	writeProblem(w, problemOf(problemKind{503, "no_leader", "No leader"}, "the broker group has no leader; retry"))
}
