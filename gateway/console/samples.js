// ============================================================================
// SAMPLE CODE shown in the console's "Code" tab, for the selected topic and
// consumer group, in curl, Python, JavaScript and Go.
//
// Everything the samples say is in this one function, sampleCode(), so it is
// easy to keep in step with the API and with the Go SDK
// (github.com/tidemq/tidemq/sdk: NewClient, NewProducer, NewConsumer,
// Consumer.Run): when the SDK's names change, change the 'go' case below.
// ============================================================================

export const SAMPLE_LANGUAGES = [
  { id: 'curl', label: 'curl' },
  { id: 'python', label: 'Python' },
  { id: 'javascript', label: 'JavaScript' },
  { id: 'go', label: 'Go' },
];

/**
 * sampleCode returns the code for one language.
 * ctx: {base: server URL, topic, group, auth: true when the server wants a token}.
 * Topic and group names match ^[A-Za-z0-9][A-Za-z0-9._-]*$, so they need no
 * quoting in URLs or string literals.
 */
export function sampleCode(lang, { base, topic, group, auth }) {
  const sub = `/v1/topics/${topic}/subscriptions/${group}`;
  switch (lang) {
    case 'curl': {
      const a = auth ? ` \\\n  -H "Authorization: Bearer $TIDEMQ_TOKEN"` : '';
      return `# Send a message (tag, keys and body; add "shardingKey" to keep per-key order)
curl -sS -X POST '${base}/v1/topics/${topic}/messages'${a} \\
  -H 'Content-Type: application/json' \\
  -d '{"body":"hello","tag":"TagA","keys":["order-1001"]}'

# Send a file as the raw body
curl -sS -X POST '${base}/v1/topics/${topic}/messages'${a} \\
  -H 'Content-Type: application/octet-stream' -H 'X-Tidemq-Tag: TagA' \\
  --data-binary @payload.bin

# Create the subscription (once; "filter" is a tag expression such as "TagA || TagB")
curl -sS -X PUT '${base}${sub}'${a} \\
  -H 'Content-Type: application/json' -d '{"filter":"*"}'

# Pull: waits up to 20 s for messages, each leased for 30 s
curl -sS -X POST '${base}${sub}/pull'${a} \\
  -H 'Content-Type: application/json' \\
  -d '{"maxMessages":32,"waitSeconds":20,"consumerId":"worker-1"}'

# Ack what you handled, with the receiptHandle of each pulled message
curl -sS -X POST '${base}${sub}/ack'${a} \\
  -H 'Content-Type: application/json' \\
  -d '{"receiptHandles":["<receiptHandle>"]}'
`;
    }
    case 'python': {
      const a = auth ? `session.headers["Authorization"] = "Bearer " + os.environ["TIDEMQ_TOKEN"]\n` : '';
      return `# pip install requests
${auth ? 'import os\n' : ''}import requests

BASE = "${base}"
TOPIC, GROUP = "${topic}", "${group}"
SUB = f"{BASE}/v1/topics/{TOPIC}/subscriptions/{GROUP}"

session = requests.Session()
${a}
# Send a message.
r = session.post(f"{BASE}/v1/topics/{TOPIC}/messages",
                 json={"body": "hello", "tag": "TagA", "keys": ["order-1001"]})
r.raise_for_status()
print("sent", r.json()["messageId"])

# Consume: long-poll, handle, ack. A message that is not acked in time
# (30 s by default) is delivered again: handling must be idempotent.
while True:
    r = session.post(f"{SUB}/pull", timeout=30,
                     json={"maxMessages": 32, "waitSeconds": 20, "consumerId": "worker-1"})
    r.raise_for_status()
    handles = []
    for m in r.json()["messages"]:
        print(m["messageId"], m.get("tag"), m["body"])
        handles.append(m["receiptHandle"])
    if handles:
        session.post(f"{SUB}/ack", json={"receiptHandles": handles}).raise_for_status()
`;
    }
    case 'javascript': {
      const a = auth ? `headers.Authorization = \`Bearer \${process.env.TIDEMQ_TOKEN}\`;\n` : '';
      return `// Node 18+ (or a browser): fetch is built in. Save as consume.mjs.
const BASE = "${base}";
const SUB = \`\${BASE}/v1/topics/${topic}/subscriptions/${group}\`;
const headers = { "Content-Type": "application/json" };
${a}
async function post(url, body) {
  const res = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) });
  const data = await res.json();
  if (!res.ok) throw new Error(\`\${data.title}: \${data.detail}\`); // a problem (RFC 9457)
  return data;
}

// Send a message.
const sent = await post(\`\${BASE}/v1/topics/${topic}/messages\`,
  { body: "hello", tag: "TagA", keys: ["order-1001"] });
console.log("sent", sent.messageId);

// Consume: long-poll, handle, ack (unacked messages come back after 30 s).
for (;;) {
  const { messages } = await post(\`\${SUB}/pull\`,
    { maxMessages: 32, waitSeconds: 20, consumerId: "worker-1" });
  for (const m of messages) console.log(m.messageId, m.tag, m.body);
  if (messages.length > 0) {
    await post(\`\${SUB}/ack\`, { receiptHandles: messages.map((m) => m.receiptHandle) });
  }
}
`;
    }
    case 'go': {
      const opts = auth ? 'sdk.ClientOptions{Token: os.Getenv("TIDEMQ_TOKEN")}' : 'sdk.ClientOptions{}';
      return `package main

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/tidemq/tidemq/sdk"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	client, err := sdk.NewClient("${base}", ${opts})
	if err != nil {
		log.Fatal(err)
	}

	// Send a message: retried on temporary failures, stored once.
	producer, err := sdk.NewProducer(client, "${topic}", sdk.ProducerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	res, err := producer.Send(ctx, sdk.SendMessage{
		Body: "hello",
		Tag:  "TagA",
		Keys: []string{"order-1001"},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("sent %s", res.MessageID)

	// Consume until Ctrl+C: returning nil acks the message, an error nacks
	// it (delivered again later; to the DLQ after maxRetries).
	consumer, err := sdk.NewConsumer(client, "${topic}", "${group}", sdk.ConsumerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	err = consumer.Run(ctx, func(ctx context.Context, m *sdk.PulledMessage) error {
		log.Printf("%s %s %s", m.MessageID, m.Tag, m.Body)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
`;
    }
  }
  return '';
}
