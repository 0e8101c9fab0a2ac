#!/usr/bin/env python3
"""tidemq quickstart in Python, standard library only (urllib).

Creates a topic and a consumer group, sends one message and a batch of
three, long-poll pulls them, acks all but one, nacks that one, pulls it
again (delivery attempt 2) and acks it.

    TIDEMQ_URL=http://127.0.0.1:8080 python3 quickstart.py [topic]

The topic comes from the first argument, else TIDEMQ_TOPIC, else
"quickstart". Exits non-zero on any failure.
"""

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid

URL = os.environ.get("TIDEMQ_URL", "http://127.0.0.1:8080").rstrip("/")
TOPIC = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("TIDEMQ_TOPIC", "quickstart")
RUN = uuid.uuid4().hex[:12]
# A group of our own, starting at "latest": it sees only this run's messages.
GROUP = "quickstart-" + RUN


class TidemqError(Exception):
    pass


def call(method, path, body=None, timeout=40):
    """Sends a JSON request; returns the decoded JSON reply (None for 204).
    Raises TidemqError with the problem for anything but 2xx."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(URL + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        problem = e.read().decode(errors="replace")
        raise TidemqError(f"{method} {path}: HTTP {e.code}: {problem}") from None
    except (urllib.error.URLError, OSError) as e:
        raise TidemqError(f"{method} {path}: {e}") from None


def q(name):
    return urllib.parse.quote(name, safe="")


def main():
    topic_path = f"/v1/topics/{q(TOPIC)}"
    sub = f"{topic_path}/subscriptions/{q(GROUP)}"
    print(f"tidemq at {URL}, topic {TOPIC}, group {GROUP}")

    call("PUT", topic_path, {"queues": 4})
    print(f"created topic {TOPIC} (or it existed)")
    call("PUT", sub, {"startFrom": "latest", "maxRetries": 3})
    print(f"created subscription {GROUP}")

    r = call("POST", f"{topic_path}/messages", {
        "body": "hello from python", "tag": "TagA", "keys": ["order-1001"],
        "properties": {"lang": "python"}, "dedupKey": RUN + "-1",
    })
    print(f"sent 1 message: id {r['messageId']}, queue {r['queueId']}, offset {r['offset']}")

    r = call("POST", f"{topic_path}/messages:batch", {"messages": [
        {"body": "batch 1", "shardingKey": "order-1002"},
        {"body": "batch 2", "shardingKey": "order-1002"},
        {"body": "batch 3", "tag": "TagB"},
    ]})
    if len(r["results"]) != 3:
        raise TidemqError(f"batch send returned {len(r['results'])} results, want 3")
    print("sent a batch of 3: ids " + " ".join(x["messageId"] for x in r["results"]))

    want = 4
    pulled = []
    for _ in range(5):
        r = call("POST", f"{sub}/pull", {"maxMessages": 10, "waitSeconds": 5,
                                          "invisibleSeconds": 30, "consumerId": "python-quickstart"})
        pulled += r["messages"]
        if len(pulled) >= want:
            break
    if len(pulled) != want:
        raise TidemqError(f"pulled {len(pulled)} messages, want {want}")
    print(f"pulled {want} messages (long poll): " + ", ".join(repr(m["body"]) for m in pulled))

    nacked, rest = pulled[0], pulled[1:]
    r = call("POST", f"{sub}/ack", {"receiptHandles": [m["receiptHandle"] for m in rest]})
    if r["acked"] != len(rest):
        raise TidemqError(f"ack: {r}")
    print(f"acked {r['acked']}")

    r = call("POST", f"{sub}/nack", {"receiptHandles": [nacked["receiptHandle"]],
                                      "delaySeconds": 1, "reason": "quickstart: try again"})
    if r["nacked"] != 1:
        raise TidemqError(f"nack: {r}")
    print(f"nacked {nacked['body']!r} (redeliver in 1 s)")

    again = []
    for _ in range(3):
        again = call("POST", f"{sub}/pull", {"maxMessages": 10, "waitSeconds": 5,
                                              "consumerId": "python-quickstart"})["messages"]
        if again:
            break
    if len(again) != 1 or again[0]["messageId"] != nacked["messageId"] or again[0]["deliveryAttempt"] != 2:
        raise TidemqError(f"expected the nacked message again with deliveryAttempt 2, got {again}")
    print(f"pulled it again: deliveryAttempt {again[0]['deliveryAttempt']}")
    r = call("POST", f"{sub}/ack", {"receiptHandles": [again[0]["receiptHandle"]]})
    if r["acked"] != 1:
        raise TidemqError(f"ack: {r}")
    print("acked it")

    s = call("GET", sub)
    print(f"subscription lag now {s['lag']}")
    call("DELETE", sub)
    print(f"deleted subscription {GROUP}")
    print("OK")


if __name__ == "__main__":
    try:
        main()
    except TidemqError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
