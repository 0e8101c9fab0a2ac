// The README's quickstart (a topic, a consumer group, one message, a batch,
// a raw body, a long-poll pull, an ack, the group's standing) through a
// client generated from openapi.yaml by @hey-api/openapi-ts. No casts, no
// `any`, no non-null assertions: under `strict` it type-checks only if the
// spec gives every field the flow reads the type the server sends.
// generated_client_test.go writes config.ts (the broker's URL and a token)
// and the client/ directory.
import { client } from './client/client.gen';
import { ack, getSubscription, pull, putSubscription, putTopic, sendBatch, sendMessage, sendRawMessage } from './client/sdk.gen';
import type { PulledMessage } from './client/types.gen';
import { baseUrl, token } from './config';

function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(what);
}

async function main(): Promise<void> {
  client.setConfig({ baseUrl, auth: token });
  const topic = 'orders';
  const group = 'billing';

  const created = (await putTopic({ path: { topic }, body: { queues: 4 }, throwOnError: true })).data;
  check(created.queues === 4 && created.queueStats.length === 4 && created.messages === 0, `topic: ${JSON.stringify(created)}`);
  console.log(`created topic ${created.topic} with ${created.queues} queues`);

  const sub = (await putSubscription({ path: { topic, group }, body: { filter: '*', maxRetries: 5 }, throwOnError: true })).data;
  check(sub.mode === 'clustering' && sub.lag === 0 && sub.queues.length === 4, `subscription: ${JSON.stringify(sub)}`);
  console.log(`created subscription ${sub.group} (${sub.mode})`);

  const one = (await sendMessage({
    path: { topic },
    body: { body: 'order 1001 created', tag: 'created', keys: ['order-1001'], shardingKey: 'order-1001' },
    throwOnError: true,
  })).data;
  check(one.offset !== null && !one.duplicate, `send: ${JSON.stringify(one)}`);
  console.log(`sent ${one.messageId} to queue ${one.queueId} at offset ${one.offset}, stored ${one.storedAt}`);

  const batch = (await sendBatch({
    path: { topic },
    body: { messages: [{ body: 'order 1002 created', tag: 'created' }, { body: 'order 1001 paid', tag: 'paid', shardingKey: 'order-1001' }] },
    throwOnError: true,
  })).data;
  check(batch.results.length === 2, `batch: ${JSON.stringify(batch)}`);
  console.log(`sent a batch of ${batch.results.length}`);

  const bytes = new Uint8Array([0xff, 0x00, 0x01, 0x02]);
  const raw = (await sendRawMessage({ path: { topic }, body: new Blob([bytes]), headers: { 'X-Tidemq-Tag': 'file' }, throwOnError: true })).data;
  console.log(`sent a raw body as ${raw.messageId}`);

  const pulled: PulledMessage[] = [];
  for (let i = 0; i < 5 && pulled.length < 4; i++) {
    const got = (await pull({
      path: { topic, group },
      body: { maxMessages: 10, waitSeconds: 5, invisibleSeconds: 30, consumerId: 'worker-1' },
      throwOnError: true,
    })).data;
    pulled.push(...got.messages);
  }
  check(pulled.length === 4, `pulled ${pulled.length} messages, want 4`);
  const first = pulled.find((m) => m.messageId === one.messageId);
  check(first !== undefined && first.body === 'order 1001 created' && first.deliveryAttempt === 1 && first.bornAt <= first.storedAt,
    `first message: ${JSON.stringify(first)}`);
  const file = pulled.find((m) => m.messageId === raw.messageId);
  check(file !== undefined && file.bodyEncoding === 'base64' && file.body === '/wABAg==' && file.tag === 'file', `raw message: ${JSON.stringify(file)}`);
  console.log(`pulled ${pulled.length}: ${pulled.map((m) => m.messageId).join(' ')}`);

  const acked = (await ack({ path: { topic, group }, body: { receiptHandles: pulled.map((m) => m.receiptHandle) }, throwOnError: true })).data;
  check(acked.acked === 4 && acked.failed.length === 0, `ack: ${JSON.stringify(acked)}`);
  console.log(`acked ${acked.acked}`);

  const now = (await getSubscription({ path: { topic, group }, throwOnError: true })).data;
  const outstanding: number = now.lag + now.inflight + now.retrying + now.dlq;
  check(outstanding === 0, `after the ack: lag ${now.lag}, inflight ${now.inflight}, retrying ${now.retrying}, dlq ${now.dlq}`);
  check(now.consumers.some((c) => c.consumerId === 'worker-1' && c.lastSeen.length > 0), `consumers: ${JSON.stringify(now.consumers)}`);
  console.log(`lag ${now.lag}, consumers ${now.consumers.map((c) => c.consumerId).join(' ')}`);
  console.log('OK');
}

// A rejection ends node with a non-zero status and the error printed.
void main();
