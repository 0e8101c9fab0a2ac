#!/usr/bin/env node
// tidemq quickstart in JavaScript, with Node's built-in fetch (Node 18+).
//
// Creates a topic and a consumer group, sends one message and a batch of
// three, long-poll pulls them, acks all but one, nacks that one, pulls it
// again (delivery attempt 2) and acks it.
//
//   TIDEMQ_URL=http://127.0.0.1:8080 node quickstart.mjs [topic]
//
// The topic comes from the first argument, else TIDEMQ_TOPIC, else
// "quickstart". Exits non-zero on any failure.

import { randomUUID } from "node:crypto";

const URL_BASE = (process.env.TIDEMQ_URL ?? "http://127.0.0.1:8080").replace(/\/+$/, "");
const TOPIC = process.argv[2] ?? process.env.TIDEMQ_TOPIC ?? "quickstart";
const RUN = randomUUID().slice(0, 12);
// A group of our own, starting at "latest": it sees only this run's messages.
const GROUP = `quickstart-${RUN}`;

class TidemqError extends Error {}

// call sends a JSON request and returns the decoded reply (null for 204);
// anything but 2xx throws with the problem.
async function call(method, path, body) {
  let res;
  try {
    res = await fetch(URL_BASE + path, {
      method,
      headers: body === undefined ? {} : { "Content-Type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(40_000),
    });
  } catch (e) {
    throw new TidemqError(`${method} ${path}: ${e.cause?.message ?? e.message}`);
  }
  const text = await res.text();
  if (!res.ok) throw new TidemqError(`${method} ${path}: HTTP ${res.status}: ${text}`);
  return text ? JSON.parse(text) : null;
}

function check(ok, what) {
  if (!ok) throw new TidemqError(what);
}

async function main() {
  const topicPath = `/v1/topics/${encodeURIComponent(TOPIC)}`;
  const sub = `${topicPath}/subscriptions/${encodeURIComponent(GROUP)}`;
  console.log(`tidemq at ${URL_BASE}, topic ${TOPIC}, group ${GROUP}`);

  await call("PUT", topicPath, { queues: 4 });
  console.log(`created topic ${TOPIC} (or it existed)`);
  await call("PUT", sub, { startFrom: "latest", maxRetries: 3 });
  console.log(`created subscription ${GROUP}`);

  let r = await call("POST", `${topicPath}/messages`, {
    body: "hello from javascript", tag: "TagA", keys: ["order-1001"],
    properties: { lang: "javascript" }, dedupKey: `${RUN}-1`,
  });
  console.log(`sent 1 message: id ${r.messageId}, queue ${r.queueId}, offset ${r.offset}`);

  r = await call("POST", `${topicPath}/messages:batch`, {
    messages: [
      { body: "batch 1", shardingKey: "order-1002" },
      { body: "batch 2", shardingKey: "order-1002" },
      { body: "batch 3", tag: "TagB" },
    ],
  });
  check(r.results.length === 3, `batch send returned ${r.results.length} results, want 3`);
  console.log(`sent a batch of 3: ids ${r.results.map((x) => x.messageId).join(" ")}`);

  const want = 4;
  let pulled = [];
  for (let i = 0; i < 5 && pulled.length < want; i++) {
    r = await call("POST", `${sub}/pull`, {
      maxMessages: 10, waitSeconds: 5, invisibleSeconds: 30, consumerId: "js-quickstart",
    });
    pulled = pulled.concat(r.messages);
  }
  check(pulled.length === want, `pulled ${pulled.length} messages, want ${want}`);
  console.log(`pulled ${want} messages (long poll): ${pulled.map((m) => JSON.stringify(m.body)).join(", ")}`);

  const [nacked, ...rest] = pulled;
  r = await call("POST", `${sub}/ack`, { receiptHandles: rest.map((m) => m.receiptHandle) });
  check(r.acked === rest.length, `ack: ${JSON.stringify(r)}`);
  console.log(`acked ${r.acked}`);

  r = await call("POST", `${sub}/nack`, {
    receiptHandles: [nacked.receiptHandle], delaySeconds: 1, reason: "quickstart: try again",
  });
  check(r.nacked === 1, `nack: ${JSON.stringify(r)}`);
  console.log(`nacked ${JSON.stringify(nacked.body)} (redeliver in 1 s)`);

  let again = [];
  for (let i = 0; i < 3 && again.length === 0; i++) {
    again = (await call("POST", `${sub}/pull`, { maxMessages: 10, waitSeconds: 5, consumerId: "js-quickstart" })).messages;
  }
  check(
    again.length === 1 && again[0].messageId === nacked.messageId && again[0].deliveryAttempt === 2,
    `expected the nacked message again with deliveryAttempt 2, got ${JSON.stringify(again)}`,
  );
  console.log(`pulled it again: deliveryAttempt ${again[0].deliveryAttempt}`);
  r = await call("POST", `${sub}/ack`, { receiptHandles: [again[0].receiptHandle] });
  check(r.acked === 1, `ack: ${JSON.stringify(r)}`);
  console.log("acked it");

  const s = await call("GET", sub);
  console.log(`subscription lag now ${s.lag}`);
  await call("DELETE", sub);
  console.log(`deleted subscription ${GROUP}`);
  console.log("OK");
}

try {
  await main();
} catch (e) {
  console.error(`FAILED: ${e instanceof TidemqError ? e.message : e.stack}`);
  process.exit(1);
}
