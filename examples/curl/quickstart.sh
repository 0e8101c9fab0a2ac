#!/usr/bin/env bash
# tidemq quickstart with curl: create a topic and a consumer group, send one
# message (JSON), one raw file, a batch of three, long-poll pull them, ack
# all but one, nack that one, pull it again (delivery attempt 2) and ack it.
#
#   TIDEMQ_URL=http://127.0.0.1:8080 ./quickstart.sh [topic]
#
# The topic comes from the first argument, else TIDEMQ_TOPIC, else
# "quickstart". Needs bash and curl only; exits non-zero on any failure.
set -euo pipefail

URL="${TIDEMQ_URL:-http://127.0.0.1:8080}"
URL="${URL%/}"
TOPIC="${1:-${TIDEMQ_TOPIC:-quickstart}}"
RUN="$(date +%s)-$$-$RANDOM"
GROUP="quickstart-$RUN" # a group of our own, starting at "latest": it sees only this run's messages
SUB="$URL/v1/topics/$TOPIC/subscriptions/$GROUP"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

fail() { echo "FAILED: $*" >&2; exit 1; }

# call METHOD URL [JSON]: prints the reply body; fails on anything but 2xx.
call() {
  local method=$1 url=$2 body=${3:-} status
  if [[ -n $body ]]; then
    status=$(curl -sS -o "$TMP/reply" -w '%{http_code}' -X "$method" "$url" \
      -H 'Content-Type: application/json' --data-binary "$body") || fail "$method $url: no reply"
  else
    status=$(curl -sS -o "$TMP/reply" -w '%{http_code}' -X "$method" "$url") || fail "$method $url: no reply"
  fi
  [[ $status == 2* ]] || fail "$method $url: HTTP $status: $(cat "$TMP/reply")"
  cat "$TMP/reply"
}

# field NAME < json: every value of a string or number field, one a line.
field() { { grep -o "\"$1\":\(\"[^\"]*\"\|[0-9]*\)" || true; } | sed -e "s/^\"$1\"://" -e 's/^"//' -e 's/"$//'; }

echo "tidemq at $URL, topic $TOPIC, group $GROUP"

call PUT "$URL/v1/topics/$TOPIC" '{"queues":4}' >/dev/null
echo "created topic $TOPIC (or it existed)"

call PUT "$SUB" '{"startFrom":"latest","maxRetries":3}' >/dev/null
echo "created subscription $GROUP"

reply=$(call POST "$URL/v1/topics/$TOPIC/messages" \
  "{\"body\":\"hello from curl\",\"tag\":\"TagA\",\"keys\":[\"order-1001\"],\"properties\":{\"lang\":\"curl\"},\"dedupKey\":\"$RUN-1\"}")
echo "sent 1 message: id $(field messageId <<<"$reply"), queue $(field queueId <<<"$reply"), offset $(field offset <<<"$reply")"

printf 'raw bytes from a file\n' >"$TMP/file.bin"
status=$(curl -sS -o "$TMP/reply" -w '%{http_code}' -X POST "$URL/v1/topics/$TOPIC/messages" \
  -H 'Content-Type: application/octet-stream' -H 'X-Tidemq-Tag: file' -H "Idempotency-Key: $RUN-2" \
  --data-binary @"$TMP/file.bin") || fail "raw send: no reply"
[[ $status == 2* ]] || fail "raw send: HTTP $status: $(cat "$TMP/reply")"
echo "sent 1 raw file: id $(field messageId <"$TMP/reply")"

reply=$(call POST "$URL/v1/topics/$TOPIC/messages:batch" \
  '{"messages":[{"body":"batch 1","shardingKey":"order-1002"},{"body":"batch 2","shardingKey":"order-1002"},{"body":"batch 3","tag":"TagB"}]}')
n=$(field messageId <<<"$reply" | wc -l)
[[ $n -eq 3 ]] || fail "batch send returned $n results, want 3"
echo "sent a batch of 3: ids $(field messageId <<<"$reply" | tr '\n' ' ')"

want=5
handles=()
for _ in 1 2 3 4 5; do
  reply=$(call POST "$SUB/pull" '{"maxMessages":10,"waitSeconds":5,"invisibleSeconds":30,"consumerId":"curl-quickstart"}')
  while IFS= read -r h; do [[ -n $h ]] && handles+=("$h"); done < <(field receiptHandle <<<"$reply")
  [[ ${#handles[@]} -ge $want ]] && break
done
[[ ${#handles[@]} -eq $want ]] || fail "pulled ${#handles[@]} messages, want $want"
echo "pulled $want messages (long poll)"

nacked=${handles[0]}
rest=$(printf '"%s",' "${handles[@]:1}")
reply=$(call POST "$SUB/ack" "{\"receiptHandles\":[${rest%,}]}")
[[ $(field acked <<<"$reply") -eq $((want - 1)) ]] || fail "ack: $reply"
echo "acked $((want - 1))"

reply=$(call POST "$SUB/nack" "{\"receiptHandles\":[\"$nacked\"],\"delaySeconds\":1,\"reason\":\"quickstart: try again\"}")
[[ $(field nacked <<<"$reply") -eq 1 ]] || fail "nack: $reply"
echo "nacked 1 (redeliver in 1 s)"

again=""
for _ in 1 2 3; do
  reply=$(call POST "$SUB/pull" '{"maxMessages":10,"waitSeconds":5,"consumerId":"curl-quickstart"}')
  again=$(field receiptHandle <<<"$reply" | sed -n 1p)
  [[ -n $again ]] && break
done
[[ -n $again ]] || fail "the nacked message did not come back"
attempt=$(field deliveryAttempt <<<"$reply" | sed -n 1p)
[[ $attempt -eq 2 ]] || fail "redelivered with deliveryAttempt $attempt, want 2"
echo "pulled it again: deliveryAttempt $attempt"
reply=$(call POST "$SUB/ack" "{\"receiptHandles\":[\"$again\"]}")
[[ $(field acked <<<"$reply") -eq 1 ]] || fail "ack: $reply"
echo "acked it"

lag=$(call GET "$SUB" | field lag | tail -n1)
echo "subscription lag now ${lag:-?}"
call DELETE "$SUB" >/dev/null
echo "deleted subscription $GROUP"
echo "OK"
