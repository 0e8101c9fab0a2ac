// tidemq console: a single page over the HTTP API, in plain ES modules.
//
// Routes live in the URL's hash (#/topics/orders/subscriptions/billing/dlq,
// #/cluster),
// so every view can be bookmarked and the browser's back button works. A
// poll every POLL_MS refreshes the current view; send rates and lag charts
// are computed here from successive polls. docs/console.md describes it.

import {
  h, replace, fmtNum, fmtBytes, fmtRate, timeEl, ago, bodyBytes, bodyText, preview, hexDump,
  toLocalInput, fromLocalInput,
} from './dom.js';
import { api, request, p, query, ProblemError, getToken, setToken, setTokenPrompter, askToken } from './api.js';
import { lagChart } from './chart.js';
import { sampleCode, SAMPLE_LANGUAGES } from './samples.js';

const POLL_MS = 2000;
const LAG_SAMPLES = 300; // per subscription: 10 minutes at POLL_MS
// Names of topics and groups; an HTML pattern (compiled with the v flag, so "-" is escaped).
const NAME_PATTERN = '[A-Za-z0-9][A-Za-z0-9._\\-]{0,126}';
const TAG_PATTERN = '[^|\\s]{1,64}';
const jaegerUI = (document.querySelector('meta[name="tidemq-jaeger-ui"]')?.content || '').trim().replace(/\/+$/, '');

const state = {
  topics: null, // the last GET /v1/topics
  counters: new Map(), // topic → {t, total}: total = Σ maxOffset, the messages ever stored
  rates: new Map(), // topic → messages per second
  lag: new Map(), // "topic/group" → [{t, v}]
  paused: false,
  authSeen: false,
};

// ------------------------------------------------------------------ helpers

function href(...parts) {
  return '#/' + parts.map((x) => encodeURIComponent(x)).join('/');
}

function messagePath(topic, id) {
  return `${p('topics', topic, 'messages', id)}`;
}

function subPath(topic, group) {
  return p('topics', topic, 'subscriptions', group);
}

function jaegerLink(id) {
  const tags = JSON.stringify({ 'messaging.message.id': id });
  return `${jaegerUI}/search?service=tidemq&tags=${encodeURIComponent(tags)}`;
}

function recordLag(topic, sub) {
  const key = `${topic}/${sub.group}`;
  let list = state.lag.get(key);
  if (!list) state.lag.set(key, (list = []));
  const now = Date.now();
  const last = list[list.length - 1];
  if (last && now - last.t < POLL_MS / 4) last.v = sub.lag;
  else list.push({ t: now, v: sub.lag });
  if (list.length > LAG_SAMPLES) list.splice(0, list.length - LAG_SAMPLES);
  return list;
}

/** field wraps a control with its label (and an optional hint). */
function field(label, control, hint) {
  const id = control.id || control.querySelector('input,select,textarea')?.id;
  const hintEl = hint ? h('small.hint', { id: `${id}-hint` }, hint) : null;
  if (hintEl) control.setAttribute('aria-describedby', hintEl.id);
  return h('div.field', h('label', { for: id }, label), control, hintEl);
}

function check(label, control) {
  return h('div.field.check', control, h('label', { for: control.id }, label));
}

/** errorSlot is where a form shows a problem: its title and detail. */
function errorSlot() {
  const el = h('div.problem', { role: 'alert', hidden: true });
  return {
    el,
    show(err) {
      const title = err instanceof ProblemError ? err.title : 'Error';
      const detail = err instanceof ProblemError ? err.detail : err.message;
      replace(el, undefined,
        h('strong.problem-title', title),
        detail ? h('span.problem-detail', detail) : null,
        err.code ? h('code.problem-code', err.code) : null);
      el.hidden = false;
    },
    clear() {
      el.hidden = true;
      el.replaceChildren();
    },
  };
}

function statusSlot() {
  return h('p.form-status', { role: 'status', 'aria-live': 'polite' });
}

/** busy disables a button while an action runs, and reports its problem. */
async function busy(button, errors, fn) {
  errors?.clear();
  button.disabled = true;
  button.setAttribute('aria-busy', 'true');
  try {
    return await fn();
  } catch (err) {
    if (err.name === 'AbortError') return undefined;
    if (errors) errors.show(err);
    else showBanner(err);
    return undefined;
  } finally {
    button.disabled = false;
    button.removeAttribute('aria-busy');
  }
}

function table(caption, headers, rows, empty) {
  if (!rows.length) return h('p.empty', empty);
  return h('div.table-wrap', { tabindex: 0, role: 'region', 'aria-label': caption },
    h('table',
      h('caption.visually-hidden', caption),
      h('thead', h('tr', headers.map((x) => (typeof x === 'string'
        ? h('th', { scope: 'col' }, x)
        : h('th', { scope: 'col', class: x.class }, x.hidden ? h('span.visually-hidden', x.label) : x.label))))),
      h('tbody', rows)));
}

function crumbs(...items) {
  return h('nav.crumbs', { 'aria-label': 'Breadcrumb' }, h('ol', items.map(([label, link], i) => h('li',
    link && i < items.length - 1 ? h('a', { href: link }, label) : h('span', { 'aria-current': 'page' }, label)))));
}

function tabNav(label, tabs, active) {
  return h('nav.tabs', { 'aria-label': label }, tabs.map(([id, text, link]) => h('a', {
    id: `tab-${id}`, href: link, 'aria-current': id === active ? 'page' : undefined,
  }, text)));
}

function stat(label, value, cls) {
  return h('div.stat', { class: ['stat', cls] }, h('dt', label), h('dd', value));
}

function badge(text, kind) {
  return h('span', { class: ['badge', kind && `badge-${kind}`] }, text);
}

// ------------------------------------------------------------------ dialogs

function confirmDialog({ title, body, ok = 'OK', danger = false }) {
  const d = document.getElementById('confirm-dialog');
  document.getElementById('confirm-title').textContent = title;
  replace(document.getElementById('confirm-body'), undefined, body);
  const okButton = document.getElementById('confirm-ok');
  okButton.textContent = ok;
  okButton.classList.toggle('danger', danger);
  d.returnValue = '';
  d.showModal();
  if (!danger) okButton.focus();
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
  });
}

function tokenDialog(problem) {
  const d = document.getElementById('token-dialog');
  const reason = document.getElementById('token-reason');
  const input = document.getElementById('token-input');
  if (problem) {
    replace(reason, undefined, h('strong.problem-title', problem.title || 'Unauthenticated'),
      problem.detail ? h('span.problem-detail', problem.detail) : null);
    reason.hidden = false;
  } else {
    reason.hidden = true;
  }
  document.getElementById('token-forget').hidden = !getToken();
  input.value = '';
  d.returnValue = '';
  if (d.open) d.close();
  d.showModal();
  input.focus();
  state.authSeen = true;
  updateTokenButton();
  return new Promise((resolve) => {
    d.addEventListener('close', () => {
      if (d.returnValue === 'ok' && input.value.trim()) resolve(input.value.trim());
      else {
        if (d.returnValue === 'forget') setToken('');
        resolve(null);
      }
      input.value = '';
      updateTokenButton();
    }, { once: true });
  });
}

function updateTokenButton() {
  const b = document.getElementById('token-button');
  b.hidden = !(getToken() || state.authSeen);
  b.textContent = getToken() ? 'Token ✓' : 'Token';
  b.setAttribute('aria-label', getToken() ? 'Access token (set): change or forget it' : 'Enter an access token');
}

// ------------------------------------------------------------------ banner

function showBanner(err) {
  const b = document.getElementById('banner');
  const title = err instanceof ProblemError ? err.title : 'Error';
  const detail = err instanceof ProblemError ? err.detail : err.message;
  const sig = `${title}|${detail}`;
  if (!b.hidden && b.dataset.sig === sig) return;
  replace(b, sig,
    h('strong.problem-title', title),
    detail ? h('span.problem-detail', detail) : null,
    err.status === 401 ? h('button', { type: 'button', onclick: async () => { if (await askToken(err.problem)) tick(true); } }, 'Enter token') : null,
    h('button.ghost', { type: 'button', 'aria-label': 'Dismiss', onclick: hideBanner }, '×'));
  b.hidden = false;
}

function hideBanner() {
  const b = document.getElementById('banner');
  b.hidden = true;
  delete b.dataset.sig;
}

// ------------------------------------------------------------------ polling

async function pollTopics() {
  const data = await api('GET', 'v1/topics', undefined, { quiet: true });
  const now = Date.now();
  const seen = new Set();
  for (const t of data.topics) {
    seen.add(t.topic);
    const total = (t.queueStats || []).reduce((a, q) => a + (q.maxOffset || 0), 0);
    const prev = state.counters.get(t.topic);
    if (!prev || total < prev.total) {
      state.counters.set(t.topic, { t: now, total });
      if (prev) state.rates.delete(t.topic); // deleted and re-created
    } else if (now - prev.t >= POLL_MS * 0.75) {
      state.rates.set(t.topic, ((total - prev.total) * 1000) / (now - prev.t));
      state.counters.set(t.topic, { t: now, total });
    }
  }
  for (const k of state.counters.keys()) {
    if (!seen.has(k)) {
      state.counters.delete(k);
      state.rates.delete(k);
    }
  }
  state.topics = data.topics;
}

async function pollReady() {
  const el = document.getElementById('server-status');
  let text;
  let cls;
  try {
    const res = await fetch('readyz', { headers: { Accept: 'application/json' } });
    [text, cls] = res.ok ? ['ready', 'ok'] : ['not ready', 'warn'];
  } catch {
    [text, cls] = ['unreachable', 'bad'];
  }
  if (el.dataset.state !== cls) {
    el.dataset.state = cls;
    el.textContent = `Server ${text}`;
  }
}

let current = null;
let running = null;
let again = false;

function tick(force = false) {
  // A poll waits while the page is hidden, paused, or asking something in
  // a dialog (so that what the dialog is about stays put under it).
  if (!force && (state.paused || document.hidden || document.querySelector('dialog[open]'))) return;
  if (running) {
    if (force) again = true;
    return;
  }
  running = (async () => {
    do {
      again = false;
      const view = current;
      try {
        await Promise.all([pollReady(), pollTopics()]);
        if (view && view === current) await view.refresh?.();
        hideBanner();
      } catch (err) {
        if (err.name !== 'AbortError') showBanner(err);
      }
    } while (again);
  })().finally(() => {
    running = null;
  });
}

// ------------------------------------------------------------------ views

/** Topics: the list with rates, create and delete. */
function topicsView() {
  const list = h('div');
  const errors = errorSlot();
  const done = statusSlot();
  const name = h('input#new-topic-name', {
    name: 'topic', required: true, pattern: NAME_PATTERN, maxlength: 127, autocomplete: 'off', spellcheck: 'false', placeholder: 'e.g. orders',
  });
  const queues = h('input#new-topic-queues', { name: 'queues', type: 'number', min: 1, max: 1024, value: 8, required: true });
  const retention = h('input#new-topic-retention', { name: 'retentionHours', type: 'number', min: 1, max: 8760, value: 24, required: true });
  const submit = h('button#create-topic', { type: 'submit' }, 'Create topic');
  const form = h('form.card#create-topic-form', {
    'aria-labelledby': 'create-topic-title',
    onsubmit: (ev) => {
      ev.preventDefault();
      busy(submit, errors, async () => {
        done.textContent = '';
        const topic = name.value.trim();
        const res = await request('PUT', p('topics', topic), { queues: Number(queues.value), retentionHours: Number(retention.value) });
        done.textContent = res.status === 201 ? `Created topic ${topic}.` : `Topic ${topic} already existed: its settings were updated.`;
        name.value = '';
        tick(true);
      });
    },
  },
  h('h2#create-topic-title', 'Create a topic'),
  h('div.form-row',
    field('Name', name, 'Letters, digits, ".", "_" and "-".'),
    field('Queues', queues),
    field('Retention (hours)', retention),
    h('div.field.submit', submit)),
  errors.el, done);

  async function deleteTopic(t) {
    const ok = await confirmDialog({
      title: `Delete topic ${t.topic}?`,
      body: h('p', `Its ${fmtNum(t.messages)} messages, their indexes and its ${fmtNum((t.subscriptions || []).length)} subscriptions are deleted with it. This cannot be undone.`),
      ok: 'Delete topic',
      danger: true,
    });
    if (!ok) return;
    try {
      await api('DELETE', p('topics', t.topic));
      done.textContent = `Deleted topic ${t.topic}.`;
      tick(true);
    } catch (err) {
      errors.show(err);
    }
  }

  function render() {
    const topics = state.topics || [];
    const rows = topics.map((t) => h('tr', { dataset: { topic: t.topic } },
      h('th', { scope: 'row' }, h('a', { href: href('topics', t.topic), dataset: { focusKey: `open-${t.topic}` } }, t.topic)),
      h('td.num', fmtNum(t.queues)),
      h('td.num.messages', fmtNum(t.messages)),
      h('td.num', fmtBytes(t.bytes)),
      h('td.num.rate', fmtRate(state.rates.get(t.topic))),
      h('td.num', h('a', { href: href('topics', t.topic), dataset: { focusKey: `subs-${t.topic}` }, 'aria-label': `${(t.subscriptions || []).length} subscriptions of ${t.topic}` }, fmtNum((t.subscriptions || []).length))),
      h('td.num', `${fmtNum(t.retentionHours)} h`),
      h('td', timeEl(t.createdAt)),
      h('td.row-actions', h('button.danger.small', {
        type: 'button', dataset: { focusKey: `delete-${t.topic}` }, 'aria-label': `Delete topic ${t.topic}`, onclick: () => deleteTopic(t),
      }, 'Delete'))));
    const sig = JSON.stringify([topics, [...state.rates]]);
    replace(list, sig, table(`Topics (${topics.length})`, [
      'Topic', { label: 'Queues', class: 'num' }, { label: 'Messages', class: 'num' }, { label: 'Bytes', class: 'num' },
      { label: 'Send rate', class: 'num' }, { label: 'Subscriptions', class: 'num' }, { label: 'Retention', class: 'num' },
      'Created', { label: 'Actions', hidden: true },
    ], rows, 'No topics yet. Create one above, or send a message to a new topic (topics are created on first send when the server runs with --auto-create).'));
  }

  return {
    title: 'Topics',
    el: h('section.view',
      h('h1', 'Topics'),
      h('section', { 'aria-labelledby': 'topics-list-title' }, h('h2#topics-list-title.visually-hidden', 'All topics'), list),
      form),
    refresh: async () => render(),
  };
}

/** One topic: its numbers, then tabs for subscriptions, messages, send and code. */
function topicView(r) {
  const topic = r.topic;
  const stats = h('dl.stats');
  const missing = h('div');
  const tabs = tabNav(`Topic ${topic}`, [
    ['subscriptions', 'Subscriptions', href('topics', topic)],
    ['messages', 'Find messages', href('topics', topic, 'messages')],
    ['transactions', 'Transactions', href('topics', topic, 'transactions')],
    ['send', 'Send', href('topics', topic, 'send')],
    ['code', 'Code', href('topics', topic, 'code')],
  ], r.tab);
  const tab = { subscriptions: subscriptionsTab, messages: queryTab, transactions: transactionsTab, send: sendTab, code: codeTab }[r.tab](topic, r.q);
  const settings = topicSettings(topic);

  // The header is drawn at once from the last poll, so that nothing below
  // it moves when the first refresh comes back.
  function renderHead() {
    if (!state.topics) return undefined;
    const t = state.topics.find((x) => x.topic === topic);
    if (!t) {
      replace(missing, 'missing', h('div.problem', { role: 'alert' }, h('strong.problem-title', 'Topic not found'),
        h('span.problem-detail', `There is no topic ${topic} (yet). Sending a message to it creates it when the server runs with --auto-create.`)));
      stats.replaceChildren();
      delete stats.dataset.sig;
      return undefined;
    }
    replace(missing, '');
    settings.fill(t);
    const sig = JSON.stringify([t, state.rates.get(topic)]);
    replace(stats, sig,
      stat('Messages', fmtNum(t.messages)), stat('Half messages', fmtNum(t.halfMessages || 0)), stat('Bytes', fmtBytes(t.bytes)),
      stat('Send rate', fmtRate(state.rates.get(topic)), 'rate'), stat('Queues', fmtNum(t.queues)),
      stat('Retention', `${fmtNum(t.retentionHours)} h`), stat('Created', timeEl(t.createdAt)));
    return t;
  }
  renderHead();

  return {
    title: `${topic} · ${r.tab}`,
    el: h('section.view',
      crumbs(['Topics', href()], [topic]),
      h('div.title-row', h('h1', h('span.kind', 'Topic '), topic)),
      missing, stats, settings.el, tabs,
      h('div.tab-panel', tab.el)),
    async refresh() {
      const t = renderHead();
      await tab.refresh?.(t);
    },
  };
}

function topicSettings(topic) {
  const errors = errorSlot();
  const done = statusSlot();
  const queues = h('input#topic-queues', { type: 'number', min: 1, max: 1024, required: true });
  const retention = h('input#topic-retention', { type: 'number', min: 1, max: 8760, required: true });
  const save = h('button', { type: 'submit' }, 'Save');
  const queueTable = h('div');
  let filled = false;
  const el = h('details.card.settings',
    h('summary', 'Settings and queues'),
    h('form', {
      onsubmit: (ev) => {
        ev.preventDefault();
        busy(save, errors, async () => {
          await api('PUT', p('topics', topic), { queues: Number(queues.value), retentionHours: Number(retention.value) });
          done.textContent = 'Saved.';
          tick(true);
        });
      },
    },
    h('div.form-row',
      field('Queues', queues, 'Can grow, never shrink.'),
      field('Retention (hours)', retention),
      h('div.field.submit', save),
      h('div.field.submit', h('button.danger', {
        type: 'button',
        onclick: async () => {
          const t = (state.topics || []).find((x) => x.topic === topic);
          const ok = await confirmDialog({
            title: `Delete topic ${topic}?`,
            body: h('p', `Its ${fmtNum(t?.messages)} messages, their indexes and its subscriptions are deleted with it. This cannot be undone.`),
            ok: 'Delete topic',
            danger: true,
          });
          if (!ok) return;
          try {
            await api('DELETE', p('topics', topic));
            location.hash = href();
          } catch (err) {
            errors.show(err);
          }
        },
      }, 'Delete topic'))),
    errors.el, done),
    queueTable);
  return {
    el,
    fill(t) {
      if (!filled) {
        queues.value = t.queues;
        retention.value = t.retentionHours;
        filled = true;
      }
      replace(queueTable, JSON.stringify(t.queueStats), table('Queues', ['Queue', { label: 'Min offset', class: 'num' }, { label: 'Max offset', class: 'num' }, { label: 'Messages', class: 'num' }],
        (t.queueStats || []).map((q) => h('tr', h('td', String(q.queueId)), h('td.num', fmtNum(q.minOffset)), h('td.num', fmtNum(q.maxOffset)), h('td.num', fmtNum(q.maxOffset - q.minOffset)))),
        'No queues.'));
    },
  };
}

/** The subscription form's fields, for create (with group and startFrom) and edit. */
function subscriptionFields(prefix, { create }) {
  const f = {
    group: create ? h(`input#${prefix}-group`, { required: true, pattern: NAME_PATTERN, maxlength: 127, autocomplete: 'off', spellcheck: 'false', placeholder: 'e.g. billing' }) : null,
    mode: h(`select#${prefix}-mode`, { disabled: !create }, h('option', { value: 'clustering' }, 'clustering'), h('option', { value: 'broadcast' }, 'broadcast')),
    orderly: h(`input#${prefix}-orderly`, { type: 'checkbox', disabled: !create }),
    filter: h(`input#${prefix}-filter`, { value: '*', autocomplete: 'off', spellcheck: 'false', placeholder: 'TagA || TagB' }),
    maxRetries: h(`input#${prefix}-max-retries`, { type: 'number', min: 0, max: 32, value: 5, required: true }),
    startFrom: create ? h(`select#${prefix}-start`, h('option', { value: 'earliest' }, 'earliest'), h('option', { value: 'latest' }, 'latest'), h('option', { value: 'time' }, 'a time…')) : null,
    startTime: create ? h(`input#${prefix}-start-time`, { type: 'datetime-local', hidden: true, 'aria-label': 'Start from this time' }) : null,
    retryDelays: h(`input#${prefix}-retry-delays`, { autocomplete: 'off', spellcheck: 'false', placeholder: '10s 30s 1m 2m 3m' }),
  };
  if (create) {
    f.startFrom.addEventListener('change', () => {
      f.startTime.hidden = f.startFrom.value !== 'time';
      f.startTime.required = f.startFrom.value === 'time';
      if (!f.startTime.value) f.startTime.value = toLocalInput(new Date(Date.now() - 3600e3));
    });
  }
  f.rows = [
    create ? field('Consumer group', f.group) : null,
    field('Mode', f.mode, create ? 'One consumer, or every consumer, gets each message.' : 'Mode and orderly cannot change.'),
    check('Orderly (per sharding key)', f.orderly),
    field('Filter (tag expression)', f.filter, '* for all; TagA || TagB'),
    field('Max retries', f.maxRetries, 'Then the message goes to the DLQ.'),
    field('Retry delays', f.retryDelays, 'Blank: 10s 30s 1m … 2h'),
    create ? h('div.field', h('label', { for: f.startFrom.id }, 'Start from'), f.startFrom, f.startTime,
      h('small.hint', 'Every retained message, only new ones, or from a time.')) : null,
  ];
  f.body = (existing) => {
    const body = {};
    if (existing) {
      // Keep the settings this form does not show (push, alerts).
      for (const k of ['push', 'alerts']) if (existing[k] !== undefined) body[k] = existing[k];
    }
    body.mode = f.mode.value;
    body.orderly = f.orderly.checked;
    body.filter = f.filter.value.trim() || '*';
    body.maxRetries = Number(f.maxRetries.value);
    const delays = f.retryDelays.value.split(/[\s,]+/).filter(Boolean);
    if (delays.length) body.retryDelays = delays;
    if (create) body.startFrom = f.startFrom.value === 'time' ? fromLocalInput(f.startTime.value) : f.startFrom.value;
    return body;
  };
  f.fill = (sub) => {
    f.mode.value = sub.mode;
    f.orderly.checked = sub.orderly;
    f.filter.value = sub.filter;
    f.maxRetries.value = sub.maxRetries;
    f.retryDelays.value = (sub.retryDelays || []).join(' ');
  };
  return f;
}

function consumersCell(consumers) {
  if (!consumers || !consumers.length) return h('span.muted', 'none');
  const now = Date.now();
  const shown = consumers.slice(0, 3).map((c) => h('li', h('span.consumer', c.consumerId), ' ', h('span.muted', { title: c.lastSeen }, ago(c.lastSeen, now))));
  if (consumers.length > 3) shown.push(h('li.muted', `+${consumers.length - 3} more`));
  return h('ul.plain', shown);
}

/** A topic's subscriptions: table with lag sparklines, and the create form. */
function subscriptionsTab(topic) {
  const list = h('div');
  const errors = errorSlot();
  const done = statusSlot();
  const f = subscriptionFields('new-sub', { create: true });
  const submit = h('button#create-sub', { type: 'submit' }, 'Create subscription');
  const form = h('form.card#create-sub-form', {
    'aria-labelledby': 'create-sub-title',
    onsubmit: (ev) => {
      ev.preventDefault();
      busy(submit, errors, async () => {
        done.textContent = '';
        const group = f.group.value.trim();
        const res = await request('PUT', subPath(topic, group), f.body(null));
        done.textContent = res.status === 201 ? `Created subscription ${group}.` : `Subscription ${group} already existed: its settings were updated.`;
        f.group.value = '';
        tick(true);
      });
    },
  }, h('h2#create-sub-title', 'New subscription'), h('div.form-grid', f.rows), h('div.actions', submit), errors.el, done);

  async function remove(group) {
    const ok = await confirmDialog({
      title: `Delete subscription ${group}?`,
      body: h('p', `The group's position, its in-flight and retrying messages and its dead-letter queue are deleted. Messages stay in ${topic} for other groups.`),
      ok: 'Delete subscription',
      danger: true,
    });
    if (!ok) return;
    try {
      await api('DELETE', subPath(topic, group));
      state.lag.delete(`${topic}/${group}`);
      done.textContent = `Deleted subscription ${group}.`;
      tick(true);
    } catch (err) {
      errors.show(err);
    }
  }

  return {
    el: h('div', h('h2.visually-hidden', 'Subscriptions'), list, form),
    async refresh(t) {
      if (!t) return;
      const data = await api('GET', p('topics', topic, 'subscriptions'), undefined, { quiet: true });
      const rows = data.subscriptions.map((sub) => {
        const samples = recordLag(topic, sub);
        const link = href('topics', topic, 'subscriptions', sub.group);
        return h('tr', { dataset: { group: sub.group } },
          h('th', { scope: 'row' }, h('a', { href: link, dataset: { focusKey: `open-${sub.group}` } }, sub.group)),
          h('td', sub.mode, sub.orderly ? h('span', ' ', badge('orderly')) : null, sub.push ? h('span', ' ', badge('push')) : null),
          h('td.filter', h('code', sub.filter || '*')),
          h('td.num.lag', { dataset: { lag: sub.lag } }, fmtNum(sub.lag)),
          h('td.spark', lagChart(samples, { label: `Lag of ${sub.group}` })),
          h('td.num', fmtNum(sub.inflight)),
          h('td.num', fmtNum(sub.retrying)),
          h('td.num.dlq', sub.dlq > 0
            ? h('a', { href: href('topics', topic, 'subscriptions', sub.group, 'dlq'), class: 'dlq-count', dataset: { focusKey: `dlq-${sub.group}` }, 'aria-label': `${sub.dlq} dead messages in ${sub.group}` }, fmtNum(sub.dlq))
            : fmtNum(sub.dlq)),
          h('td', consumersCell(sub.consumers)),
          h('td.row-actions',
            h('a.button.small.ghost', { href: link, dataset: { focusKey: `edit-${sub.group}` }, 'aria-label': `Edit or seek ${sub.group}` }, 'Edit'),
            h('button.danger.small', { type: 'button', dataset: { focusKey: `delete-${sub.group}` }, 'aria-label': `Delete subscription ${sub.group}`, onclick: () => remove(sub.group) }, 'Delete')));
      });
      replace(list, undefined, table(`Subscriptions of ${topic}`, [
        'Group', 'Mode', 'Filter', { label: 'Lag', class: 'num' }, 'Lag trend', { label: 'Inflight', class: 'num' },
        { label: 'Retrying', class: 'num' }, { label: 'DLQ', class: 'num' }, 'Consumers (last seen)', { label: 'Actions', hidden: true },
      ], rows, 'No subscriptions yet. Create one below, or pull from a new group (subscriptions are created on first pull with --auto-create).'));
    },
  };
}

/** A topic's open transactions (half messages waiting for a decision), with commit and rollback. */
function transactionsTab(topic) {
  const list = h('div#transactions');
  const errors = errorSlot();
  const done = statusSlot();

  async function settle(id, verb) {
    const ok = await confirmDialog({
      title: `${verb === 'commit' ? 'Commit' : 'Roll back'} transaction ${id}?`,
      body: h('p', verb === 'commit'
        ? 'Its half messages are delivered like messages sent now. The producer should have committed its side first.'
        : 'Its half messages are dropped: no subscription ever gets them.'),
      ok: verb === 'commit' ? 'Commit' : 'Roll back',
      danger: verb !== 'commit',
    });
    if (!ok) return;
    try {
      await api('POST', `${p('topics', topic, 'transactions')}/${encodeURIComponent(id)}:${verb}`);
      done.textContent = `${verb === 'commit' ? 'Committed' : 'Rolled back'} transaction ${id}.`;
      tick(true);
    } catch (err) {
      errors.show(err);
    }
  }

  return {
    el: h('div', h('h2.visually-hidden', 'Open transactions'),
      h('p.hint', 'Half messages stay here, delivered to nobody, until the producer commits or rolls back, or the broker\'s check-back (the topic\'s transactionCheckUrl) decides.'),
      list, errors.el, done),
    async refresh(t) {
      if (!t) return;
      const data = await api('GET', p('topics', topic, 'transactions'), undefined, { quiet: true });
      const rows = data.transactions.map((tx) => h('tr', { dataset: { transaction: tx.transactionId } },
        h('th.mono', { scope: 'row' }, tx.transactionId),
        h('td', (tx.messageIds || []).map((id, i) => [i ? ', ' : '', h('a.mono', { href: href('topics', topic, 'messages', id) }, id)])),
        h('td', tx.producerGroup || h('span.muted', '—')),
        h('td', timeEl(tx.createdAt)),
        h('td.num', fmtNum(tx.checks)),
        h('td', tx.nextCheckAt ? timeEl(tx.nextCheckAt) : '—'),
        h('td.row-actions',
          h('button.small', { type: 'button', dataset: { focusKey: `commit-${tx.transactionId}` }, 'aria-label': `Commit transaction ${tx.transactionId}`, onclick: () => settle(tx.transactionId, 'commit') }, 'Commit'),
          h('button.danger.small', { type: 'button', dataset: { focusKey: `rollback-${tx.transactionId}` }, 'aria-label': `Roll back transaction ${tx.transactionId}`, onclick: () => settle(tx.transactionId, 'rollback') }, 'Roll back'))));
      replace(list, JSON.stringify(data.transactions), table(`Open transactions of ${topic}`, [
        'Transaction', 'Half messages', 'Producer group', 'Prepared', { label: 'Checks', class: 'num' }, 'Next check', { label: 'Actions', hidden: true },
      ], rows, 'No open transactions.'));
    },
  };
}

/** Message query: by id, key, tag or time range, from the hash's query string. */
function queryTab(topic, q) {
  const errors = errorSlot();
  const results = h('div#query-results');
  const mode = h('select#q-mode', { name: 'by' },
    h('option', { value: 'key' }, 'Key'), h('option', { value: 'tag' }, 'Tag'),
    h('option', { value: 'id' }, 'Message ID'), h('option', { value: 'time' }, 'Time range'));
  const value = h('input#q-value', { name: 'value', autocomplete: 'off', spellcheck: 'false' });
  const from = h('input#q-from', { type: 'datetime-local', name: 'from' });
  const to = h('input#q-to', { type: 'datetime-local', name: 'to' });
  const limit = h('select#q-limit', { name: 'limit' }, ['20', '100', '500', '1000'].map((n) => h('option', { value: n }, n)));
  const submit = h('button#q-submit', { type: 'submit' }, 'Search');
  const valueField = field('Value', value);
  const valueLabel = valueField.querySelector('label');
  const timeFields = h('div.form-row', field('From', from), field('To', to));

  for (const m of ['key', 'tag', 'id']) if (q.get(m)) { mode.value = m; value.value = q.get(m); }
  if (!q.get('key') && !q.get('tag') && !q.get('id') && (q.get('from') || q.get('to'))) mode.value = 'time';
  if (q.get('from')) from.value = toLocalInput(new Date(q.get('from')));
  if (q.get('to')) to.value = toLocalInput(new Date(q.get('to')));
  limit.value = q.get('limit') || '100';

  function sync() {
    const m = mode.value;
    valueField.hidden = m === 'time';
    value.required = m !== 'time';
    valueLabel.textContent = { key: 'Key', tag: 'Tag', id: 'Message ID' }[m] || 'Value';
    value.placeholder = { key: 'order-1001', tag: 'TagA', id: 'messageId' }[m] || '';
    if (m === 'time' && !from.value) from.value = toLocalInput(new Date(Date.now() - 3600e3));
  }
  mode.addEventListener('change', sync);
  sync();

  const form = h('form.card#query-form', {
    'aria-labelledby': 'query-title',
    onsubmit: (ev) => {
      ev.preventDefault();
      const m = mode.value;
      if (m === 'id') {
        location.hash = href('topics', topic, 'messages', value.value.trim());
        return;
      }
      const params = new URLSearchParams();
      if (m === 'key' || m === 'tag') params.set(m, value.value.trim());
      if (m === 'time') {
        if (from.value) params.set('from', fromLocalInput(from.value));
        if (to.value) params.set('to', fromLocalInput(to.value));
      }
      params.set('limit', limit.value);
      const target = `${href('topics', topic, 'messages')}?${params}`;
      if (location.hash === target) run();
      else location.hash = target;
    },
  },
  h('h2#query-title', 'Find messages'),
  h('div.form-row', field('Find by', mode), valueField, field('At most', limit)),
  timeFields, h('div.actions', submit), errors.el);
  const syncTime = () => { timeFields.hidden = mode.value !== 'time'; };
  mode.addEventListener('change', syncTime);
  syncTime();

  let cursor = null;
  let shown = [];
  async function run(more = false) {
    const params = { key: q.get('key'), tag: q.get('tag'), from: q.get('from'), to: q.get('to'), limit: q.get('limit') || '100' };
    if (!params.key && !params.tag && !params.from && !params.to) return;
    if (more) params.cursor = cursor;
    await busy(submit, errors, async () => {
      const data = await api('GET', p('topics', topic, 'messages') + query(params));
      shown = more ? shown.concat(data.messages) : data.messages;
      cursor = data.next;
      const rows = shown.map((m) => h('tr', { dataset: { messageId: m.messageId } },
        h('th', { scope: 'row' }, h('a.mono', { href: href('topics', topic, 'messages', m.messageId) }, m.messageId)),
        h('td', m.tag ? h('code', m.tag) : h('span.muted', '—')),
        h('td', (m.keys || []).join(', ') || h('span.muted', '—')),
        h('td.num', `${m.queueId} / ${m.offset}`),
        h('td', timeEl(m.storedAt)),
        h('td.body-preview', preview(m))));
      const refocus = document.activeElement === document.body || !document.activeElement;
      replace(results, undefined,
        h('p.result-count#query-count', { role: 'status', tabindex: -1 }, `${shown.length} message${shown.length === 1 ? '' : 's'}${cursor ? ' (more available)' : ''}`),
        table('Messages found', ['Message ID', 'Tag', 'Keys', { label: 'Queue / offset', class: 'num' }, 'Stored', 'Body'], rows, 'No messages match.'),
        cursor ? h('button#q-more.ghost', { type: 'button', onclick: () => run(true) }, 'Load more') : null);
      if (refocus && !more) document.getElementById('query-count')?.focus({ preventScroll: true });
    });
  }
  run();
  return { el: h('div', form, results) };
}

/** The send box: publish a test message. */
function sendTab(topic) {
  const errors = errorSlot();
  const result = h('div#send-result', { role: 'status', 'aria-live': 'polite' });
  const tag = h('input#send-tag', { pattern: TAG_PATTERN, autocomplete: 'off', spellcheck: 'false', placeholder: 'TagA' });
  const keys = h('input#send-keys', { autocomplete: 'off', spellcheck: 'false', placeholder: 'order-1001, customer-42' });
  const body = h('textarea#send-body', { rows: 6, required: true, spellcheck: 'false', placeholder: '{"orderId": 1001}' });
  const encoding = h('select#send-encoding', h('option', { value: 'utf8' }, 'text (UTF-8)'), h('option', { value: 'base64' }, 'base64 (binary)'));
  const sharding = h('input#send-sharding', { autocomplete: 'off', spellcheck: 'false' });
  const props = h('textarea#send-props', { rows: 3, spellcheck: 'false', placeholder: 'region=hz\nsource=console' });
  const delay = h('input#send-delay', { type: 'number', min: 0, max: 604800, placeholder: '0' });
  const submit = h('button#send-submit', { type: 'submit' }, 'Send message');
  const form = h('form.card#send-form', {
    'aria-labelledby': 'send-title',
    onsubmit: (ev) => {
      ev.preventDefault();
      busy(submit, errors, async () => {
        const msg = { body: body.value, bodyEncoding: encoding.value };
        if (tag.value.trim()) msg.tag = tag.value.trim();
        const k = keys.value.split(',').map((x) => x.trim()).filter(Boolean);
        if (k.length) msg.keys = k;
        if (sharding.value.trim()) msg.shardingKey = sharding.value.trim();
        const pr = {};
        for (const line of props.value.split('\n')) {
          const i = line.indexOf('=');
          if (i > 0) pr[line.slice(0, i).trim()] = line.slice(i + 1).trim();
        }
        if (Object.keys(pr).length) msg.properties = pr;
        if (delay.value && Number(delay.value) > 0) msg.delaySeconds = Number(delay.value);
        const res = await api('POST', p('topics', topic, 'messages'), msg);
        replace(result, undefined, h('p.ok',
          res.duplicate ? 'Duplicate of an earlier send: ' : 'Sent ',
          h('a#send-result-link.mono', { href: href('topics', topic, 'messages', res.messageId), dataset: { messageId: res.messageId } }, res.messageId),
          res.offset === null || res.offset === undefined ? ` to queue ${res.queueId} (delayed: it gets its offset when it is due)` : ` to queue ${res.queueId} at offset ${res.offset}`,
          '.'));
        tick(true);
      });
    },
  },
  h('h2#send-title', `Send a test message to ${topic}`),
  h('div.form-row', field('Tag', tag, 'At most one; no spaces or "|".'), field('Keys', keys, 'Comma-separated; used by "Find messages".')),
  field('Body', body),
  h('details.more',
    h('summary', 'More options'),
    h('div.form-row', field('Body encoding', encoding), field('Sharding key', sharding, 'Same key, same queue, in order.'), field('Delay (seconds)', delay)),
    field('Properties', props, 'One name=value per line.')),
  h('div.actions', submit), errors.el, result);
  return { el: form };
}

/** Sample code for this topic and a group. */
function codeTab(topic, q) {
  const group = h('input#code-group', { list: 'code-groups', pattern: NAME_PATTERN, autocomplete: 'off', spellcheck: 'false', value: q.get('group') || '' });
  const groups = h('datalist#code-groups');
  let lang = sessionStorage.getItem('tidemq.sampleLang') || 'curl';
  const code = h('code');
  const pre = h('pre.code#code-sample', { tabindex: 0 }, code);
  const copied = h('span.muted', { role: 'status', 'aria-live': 'polite' });
  const tablist = h('div.langs', { role: 'tablist', 'aria-label': 'Language' });
  const buttons = SAMPLE_LANGUAGES.map((l) => h('button', {
    type: 'button', role: 'tab', id: `lang-${l.id}`, 'aria-controls': 'code-panel', dataset: { lang: l.id },
    onclick: () => select(l.id, true),
  }, l.label));
  tablist.append(...buttons);
  tablist.addEventListener('keydown', (ev) => {
    const i = buttons.indexOf(document.activeElement);
    if (i < 0) return;
    let j = null;
    if (ev.key === 'ArrowRight') j = (i + 1) % buttons.length;
    if (ev.key === 'ArrowLeft') j = (i - 1 + buttons.length) % buttons.length;
    if (ev.key === 'Home') j = 0;
    if (ev.key === 'End') j = buttons.length - 1;
    if (j !== null) {
      ev.preventDefault();
      select(buttons[j].dataset.lang, true);
    }
  });
  function render() {
    const base = new URL('.', document.baseURI).href.replace(/\/$/, '');
    code.textContent = sampleCode(lang, { base, topic, group: group.value.trim() || 'my-group', auth: Boolean(getToken()) });
  }
  function select(id, focus) {
    lang = id;
    sessionStorage.setItem('tidemq.sampleLang', id);
    for (const b of buttons) {
      const on = b.dataset.lang === id;
      b.setAttribute('aria-selected', String(on));
      b.tabIndex = on ? 0 : -1;
      if (on && focus) b.focus();
    }
    document.getElementById('code-panel')?.setAttribute('aria-labelledby', `lang-${id}`);
    render();
  }
  group.addEventListener('input', render);
  const copy = h('button.ghost', {
    type: 'button',
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(code.textContent);
        copied.textContent = 'Copied.';
      } catch {
        getSelection().selectAllChildren(code);
        copied.textContent = 'Selected: press Ctrl+C (or ⌘C) to copy.';
      }
      setTimeout(() => { copied.textContent = ''; }, 4000);
    },
  }, 'Copy');
  const el = h('div.card',
    h('h2', 'Sample code'),
    h('p', 'Send to and consume from ', h('code', topic), ' in your language. The base URL is this server; a token, when one is needed, is read from ', h('code', 'TIDEMQ_TOKEN'), '.'),
    h('div.form-row', field('Consumer group', group, 'A subscription of this topic, or a new group.'), groups),
    tablist,
    h('div#code-panel', { role: 'tabpanel' }, h('div.code-tools', copy, copied), pre));
  setTimeout(() => select(lang, false));
  return {
    el,
    refresh(t) {
      const subs = t?.subscriptions || [];
      replace(groups, JSON.stringify(subs), subs.map((g) => h('option', { value: g })));
      if (!group.value && subs.length) {
        group.value = subs[0];
        render();
      }
    },
  };
}

/** One subscription: numbers, lag chart, queues, consumers, edit, seek; or its DLQ. */
function subscriptionView(r) {
  const { topic, group } = r;
  const base = href('topics', topic, 'subscriptions', group);
  const tabs = h('div');
  const panel = r.tab === 'dlq' ? dlqPanel(topic, group) : overviewPanel(topic, group);
  let dlqCount = null;
  function renderTabs() {
    replace(tabs, String(dlqCount), tabNav(`Subscription ${group}`, [
      ['overview', 'Overview', base],
      ['dlq', dlqCount === null ? 'Dead letters' : `Dead letters (${fmtNum(dlqCount)})`, `${base}/dlq`],
      ['code', 'Sample code', `${href('topics', topic, 'code')}?group=${encodeURIComponent(group)}`],
    ], r.tab === 'dlq' ? 'dlq' : 'overview'));
  }
  renderTabs();
  return {
    title: `${group} · ${topic}`,
    el: h('section.view',
      crumbs(['Topics', href()], [topic, href('topics', topic)], [group]),
      h('div.title-row', h('h1', h('span.kind', 'Subscription '), group), h('span.muted', ' of ', h('a', { href: href('topics', topic) }, topic))),
      tabs, h('div.tab-panel', panel.el)),
    async refresh() {
      const sub = await api('GET', subPath(topic, group), undefined, { quiet: true });
      recordLag(topic, sub);
      dlqCount = sub.dlq;
      renderTabs();
      await panel.refresh(sub);
    },
  };
}

function overviewPanel(topic, group) {
  const stats = h('dl.stats');
  const chart = h('div.chart-box');
  const config = h('div');
  const queues = h('div');
  const consumers = h('div');
  const errors = errorSlot();
  const done = statusSlot();
  const f = subscriptionFields('edit-sub', { create: false });
  const save = h('button#save-sub', { type: 'submit' }, 'Save');
  let sub = null;
  let filled = false;
  const edit = h('form.card#edit-sub-form', {
    'aria-labelledby': 'edit-sub-title',
    onsubmit: (ev) => {
      ev.preventDefault();
      busy(save, errors, async () => {
        const res = await api('PUT', subPath(topic, group), f.body(sub));
        f.fill(res);
        done.textContent = 'Saved.';
        tick(true);
      });
    },
  }, h('h2#edit-sub-title', 'Settings'), h('div.form-grid', f.rows), h('div.actions', save), errors.el, done);

  // Seek, with the dry run shown before anything moves.
  const seekErrors = errorSlot();
  const seekDone = statusSlot();
  const seekTo = h('select#seek-to', h('option', { value: 'earliest' }, 'the earliest retained message (replay all)'), h('option', { value: 'latest' }, 'the end (skip everything pending)'), h('option', { value: 'time' }, 'a time…'));
  const seekTime = h('input#seek-time', { type: 'datetime-local', hidden: true, 'aria-label': 'Seek to this time' });
  const seekConsumer = h('input#seek-consumer', { autocomplete: 'off', spellcheck: 'false' });
  const seekConsumerField = field('Consumer (broadcast)', seekConsumer, 'Broadcast: seek this consumer only.');
  seekConsumerField.hidden = true;
  seekTo.addEventListener('change', () => {
    seekTime.hidden = seekTo.value !== 'time';
    seekTime.required = seekTo.value === 'time';
    if (!seekTime.value) seekTime.value = toLocalInput(new Date(Date.now() - 3600e3));
  });
  const preview = h('button#seek-preview', { type: 'submit' }, 'Preview seek…');
  const seek = h('form.card#seek-form', {
    'aria-labelledby': 'seek-title',
    onsubmit: (ev) => {
      ev.preventDefault();
      busy(preview, seekErrors, async () => {
        seekDone.textContent = '';
        const body = { to: seekTo.value === 'time' ? fromLocalInput(seekTime.value) : seekTo.value };
        if (seekConsumer.value.trim()) body.consumerId = seekConsumer.value.trim();
        const dry = await api('POST', `${subPath(topic, group)}/seek`, { ...body, dryRun: true });
        const where = seekTo.value === 'time' ? new Date(body.to).toLocaleString() : body.to;
        const ok = await confirmDialog({
          title: `Seek ${group} to ${where}?`,
          body: h('div',
            h('p#seek-dry-total', `${fmtNum(dry.total)} message${dry.total === 1 ? '' : 's'} will be delivered again.`),
            table('Per queue', ['Queue', { label: 'Delivered again', class: 'num' }],
              (dry.queues || []).filter((x) => x.count !== 0).map((x) => h('tr', h('td', String(x.queueId)), h('td.num', fmtNum(x.count)))),
              'No queue changes.')),
          ok: 'Seek',
        });
        if (!ok) {
          seekDone.textContent = 'Seek cancelled: nothing moved.';
          return;
        }
        const res = await api('POST', `${subPath(topic, group)}/seek`, body);
        seekDone.textContent = `Moved: ${fmtNum(res.total)} message${res.total === 1 ? '' : 's'} will be delivered again.`;
        tick(true);
      });
    },
  },
  h('h2#seek-title', 'Seek (rewind or skip)'),
  h('p.muted', 'Move every queue of this group to the first message stored at or after a point. You see how many messages would be delivered again before anything moves.'),
  h('div.form-row', h('div.field', h('label', { for: 'seek-to' }, 'Seek to'), seekTo, seekTime), seekConsumerField, h('div.field.submit', preview)),
  seekErrors.el, seekDone);

  const removeErrors = errorSlot();
  const remove = h('div.card.danger-zone',
    h('h2', 'Delete'),
    h('p.muted', 'Deleting the subscription drops its position, in-flight and retrying messages and its dead-letter queue.'),
    h('button.danger', {
      type: 'button',
      onclick: async () => {
        const ok = await confirmDialog({ title: `Delete subscription ${group}?`, body: h('p', `Messages stay in ${topic} for other groups.`), ok: 'Delete subscription', danger: true });
        if (!ok) return;
        try {
          await api('DELETE', subPath(topic, group));
          state.lag.delete(`${topic}/${group}`);
          location.hash = href('topics', topic);
        } catch (err) {
          removeErrors.show(err);
        }
      },
    }, 'Delete subscription'), removeErrors.el);

  return {
    el: h('div',
      stats,
      h('section.card', { 'aria-labelledby': 'lag-title' }, h('h2#lag-title', 'Lag over time (up to 5 minutes)'), chart),
      h('div.two-col',
        h('section.card', { 'aria-labelledby': 'consumers-title' }, h('h2#consumers-title', 'Consumers'), consumers),
        h('section.card', { 'aria-labelledby': 'queues-title' }, h('h2#queues-title', 'Queues'), queues)),
      config, edit, seek, remove),
    async refresh(s) {
      sub = s;
      if (!filled) {
        f.fill(s);
        filled = true;
      }
      seekConsumerField.hidden = s.mode !== 'broadcast';
      replace(stats, JSON.stringify([s.lag, s.inflight, s.retrying, s.dlq, s.consumers.length, s.mode, s.orderly, s.filter]),
        stat('Lag', h('span#sub-lag', { dataset: { lag: s.lag } }, fmtNum(s.lag)), 'lag'),
        stat('Inflight', fmtNum(s.inflight)),
        stat('Retrying', fmtNum(s.retrying)),
        stat('Dead letters', s.dlq > 0 ? h('a', { href: `${href('topics', topic, 'subscriptions', group)}/dlq` }, fmtNum(s.dlq)) : fmtNum(s.dlq), s.dlq > 0 ? 'bad' : ''),
        stat('Consumers', fmtNum(s.consumers.length)),
        stat('Mode', `${s.mode}${s.orderly ? ', orderly' : ''}`),
        stat('Filter', h('code', s.filter || '*')));
      const width = Math.max(280, Math.round(chart.clientWidth || 720));
      replace(chart, undefined, lagChart(state.lag.get(`${topic}/${group}`) || [], { width, height: 180, big: true, label: `Lag of ${group}` }));
      const now = Date.now();
      replace(consumers, JSON.stringify([s.consumers, Math.floor(now / 5000)]), table('Consumers', ['Consumer', 'Last seen', 'Queues'],
        s.consumers.map((c) => h('tr', h('th', { scope: 'row' }, h('span.mono', c.consumerId)), h('td', { title: c.lastSeen }, ago(c.lastSeen, now)), h('td', (c.queues || []).join(', ') || '—'))),
        'No consumer has pulled recently.'));
      replace(queues, JSON.stringify(s.queues), table('Queues', ['Queue', { label: 'Acked up to', class: 'num' }, { label: 'Max offset', class: 'num' }, { label: 'Inflight', class: 'num' }, { label: 'Lag', class: 'num' }],
        s.queues.map((q) => h('tr', h('td', String(q.queueId)), h('td.num', fmtNum(q.ackedOffset)), h('td.num', fmtNum(q.maxOffset)), h('td.num', fmtNum(q.inflight)), h('td.num', fmtNum(q.lag)))),
        'No queues.'));
      replace(config, JSON.stringify([s.createdAt, s.startFrom, s.maxRetries, s.retryDelays, s.push, s.alerts]), h('p.muted.config-line',
        'Created ', timeEl(s.createdAt), ` · started from ${s.startFrom || 'earliest'} · max retries ${s.maxRetries} · retry delays ${(s.retryDelays || []).join(' ')}`,
        s.push ? ` · push to ${s.push.endpoint}` : '',
        s.alerts ? ` · alerts: ${Object.entries(s.alerts).filter(([k]) => k !== 'webhookUrl').map(([k, v]) => `${k} ${v}`).join(', ')}` : ''));
    },
  };
}

/** A subscription's dead-letter queue: dead messages with reasons; redrive selected or all. */
function dlqPanel(topic, group) {
  const selected = new Set();
  const list = h('div');
  const errors = errorSlot();
  const done = statusSlot();
  let limit = 100;
  let shown = [];
  const redriveSelected = h('button#redrive-selected', { type: 'button', disabled: true }, 'Redrive selected');
  const redriveAll = h('button#redrive-all.ghost', { type: 'button' }, 'Redrive all…');

  function updateButtons() {
    redriveSelected.disabled = selected.size === 0;
    redriveSelected.textContent = selected.size ? `Redrive selected (${selected.size})…` : 'Redrive selected';
  }

  async function redrive(button, filter, what) {
    await busy(button, errors, async () => {
      done.textContent = '';
      const dry = await api('POST', `${subPath(topic, group)}/dlq:redrive`, { ...filter, dryRun: true });
      if (dry.redriven === 0) {
        done.textContent = 'Nothing to redrive.';
        return;
      }
      const ok = await confirmDialog({
        title: `Redrive ${what}?`,
        body: h('p#redrive-dry-count', `${fmtNum(dry.redriven)} dead message${dry.redriven === 1 ? '' : 's'} will be put back for delivery to ${group}, with fresh retries.`),
        ok: `Redrive ${fmtNum(dry.redriven)}`,
      });
      if (!ok) {
        done.textContent = 'Redrive cancelled: nothing moved.';
        return;
      }
      const res = await api('POST', `${subPath(topic, group)}/dlq:redrive`, filter);
      done.textContent = `Redriven: ${fmtNum(res.redriven)} message${res.redriven === 1 ? '' : 's'}.`;
      selected.clear();
      updateButtons();
      tick(true);
    });
  }
  redriveSelected.addEventListener('click', () => redrive(redriveSelected, { messageIds: [...selected] }, `${selected.size} selected message${selected.size === 1 ? '' : 's'}`));
  redriveAll.addEventListener('click', () => redrive(redriveAll, {}, `every dead message of ${group}`));

  function render(next) {
    const ids = new Set(shown.map((m) => m.messageId));
    for (const id of selected) if (!ids.has(id)) selected.delete(id);
    updateButtons();
    const all = h('input#dlq-select-all', {
      type: 'checkbox', 'aria-label': 'Select all shown', checked: shown.length > 0 && selected.size === shown.length,
      indeterminate: selected.size > 0 && selected.size < shown.length, dataset: { focusKey: 'all' },
      onchange: (ev) => {
        for (const m of shown) (ev.target.checked ? selected.add(m.messageId) : selected.delete(m.messageId));
        render(next);
      },
    });
    const rows = shown.map((m) => h('tr', { dataset: { messageId: m.messageId } },
      h('td.select', h('input.dlq-select', {
        type: 'checkbox', checked: selected.has(m.messageId), 'aria-label': `Select ${m.messageId}`, dataset: { focusKey: `sel-${m.messageId}` },
        onchange: (ev) => {
          if (ev.target.checked) selected.add(m.messageId);
          else selected.delete(m.messageId);
          render(next);
        },
      })),
      h('th', { scope: 'row' }, h('a.mono', { href: href('topics', topic, 'messages', m.messageId) }, m.messageId)),
      h('td.reason', m.reason || h('span.muted', '—')),
      h('td.num', fmtNum(m.deliveryAttempt)),
      h('td', timeEl(m.deadAt)),
      h('td', m.tag ? h('code', m.tag) : h('span.muted', '—')),
      h('td', (m.keys || []).join(', ') || h('span.muted', '—')),
      h('td.body-preview', preview(m, 60))));
    const sig = JSON.stringify([shown.map((m) => [m.messageId, m.reason, m.deliveryAttempt]), [...selected], next]);
    if (!shown.length) {
      replace(list, sig, h('p.empty#dlq-empty', 'No dead messages.'));
      return;
    }
    replace(list, sig,
      h('div.table-wrap', { tabindex: 0, role: 'region', 'aria-label': 'Dead messages' },
        h('table.dlq',
          h('caption.visually-hidden', `Dead messages of ${group}`),
          h('thead', h('tr', h('th.select', { scope: 'col' }, all), ['Message ID', 'Reason', 'Attempts', 'Died', 'Tag', 'Keys', 'Body'].map((x) => h('th', { scope: 'col', class: x === 'Attempts' ? 'num' : undefined }, x)))),
          h('tbody', rows))),
      next ? h('button#dlq-more.ghost', { type: 'button', onclick: () => { limit = Math.min(1000, limit + 100); tick(true); } }, 'Show more') : null);
  }

  return {
    el: h('div.card',
      h('h2', 'Dead letters'),
      h('p.muted', 'Messages that failed every delivery, or that a consumer dead-lettered. Redriving puts them back for delivery to this group with fresh retries.'),
      h('div.toolbar', redriveSelected, redriveAll), errors.el, done, list),
    async refresh() {
      const data = await api('GET', `${subPath(topic, group)}/dlq${query({ limit })}`, undefined, { quiet: true });
      shown = data.messages;
      render(data.next);
    },
  };
}

/** One message: body (text or hex), properties, state and history per group, Jaeger link. */
function messageView(r) {
  const { topic, id } = r;
  const head = h('div');
  const states = h('div');
  const errors = errorSlot();
  let rendered = false;
  let hex = false;
  let message = null;
  const bodyBox = h('div');

  function renderBody() {
    const m = message;
    const text = bodyText(m);
    const bytes = bodyBytes(m);
    const content = hex || text === null ? hexDump(bytes) : text;
    replace(bodyBox, undefined,
      h('fieldset.segmented', h('legend.visually-hidden', 'Show the body as'),
        h('input#body-text', { type: 'radio', name: 'body-view', value: 'text', checked: !hex, disabled: text === null, onchange: () => { hex = false; renderBody(); } }),
        h('label', { for: 'body-text' }, 'Text'),
        h('input#body-hex', { type: 'radio', name: 'body-view', value: 'hex', checked: hex, onchange: () => { hex = true; renderBody(); } }),
        h('label', { for: 'body-hex' }, 'Hex')),
      h('span.muted', ` ${fmtBytes(bytes.length)}${m.bodyEncoding === 'base64' ? ', sent as base64' : ''}${text === null ? ', not UTF-8 text' : ''}`),
      h('pre.code#message-body', { tabindex: 0, 'aria-label': 'Message body', class: hex || text === null ? 'code hex' : 'code' }, content));
  }

  function render(data) {
    const m = data.message;
    message = m;
    if (!rendered) {
      rendered = true;
      const rows = [
        ['Message ID', h('span.mono', m.messageId)],
        ['Topic', h('a', { href: href('topics', topic) }, m.topic || topic)],
        ['Queue / offset', m.state === 'half'
          ? [`${m.queueId} / —`, ' ', h('a', { href: href('topics', topic, 'transactions') }, badge('half message: waiting for its transaction'))]
          : `${m.queueId} / ${m.offset}`],
        ['Tag', m.tag ? h('code', m.tag) : '—'],
        ['Keys', (m.keys || []).length ? (m.keys || []).map((k, i) => [i ? ', ' : '', h('a', { href: `${href('topics', topic, 'messages')}?key=${encodeURIComponent(k)}` }, k)]) : '—'],
        ['Sharding key', m.shardingKey || '—'],
        ['Born', timeEl(m.bornAt)],
        ['Stored', timeEl(m.storedAt)],
        ['Producer group', m.producerGroup || '—'],
        ['Trace parent', m.traceparent ? h('span.mono', m.traceparent) : '—'],
      ];
      const props = Object.entries(m.properties || {});
      replace(head, undefined,
        h('div.title-row',
          h('h1', h('span.kind', 'Message '), h('span.mono', m.messageId)),
          jaegerUI ? h('a#jaeger-link.button.ghost', { href: jaegerLink(m.messageId), target: '_blank', rel: 'noopener noreferrer' }, 'Trace in Jaeger ↗') : null),
        h('section.card', { 'aria-labelledby': 'msg-details-title' }, h('h2#msg-details-title', 'Details'),
          h('dl.details', rows.map(([k, v]) => [h('dt', k), h('dd', v)]))),
        h('section.card', { 'aria-labelledby': 'msg-body-title' }, h('h2#msg-body-title', 'Body'), bodyBox),
        h('section.card', { 'aria-labelledby': 'msg-props-title' }, h('h2#msg-props-title', 'Properties'),
          table('Properties', ['Name', 'Value'], props.map(([k, v]) => h('tr', h('th', { scope: 'row' }, h('code', k)), h('td', v))), 'No properties.')));
      renderBody();
    }
    const subs = data.subscriptions || [];
    replace(states, JSON.stringify(subs),
      h('h2', 'Delivery, per subscription'),
      subs.length ? subs.map((st) => h('section.sub-state', { dataset: { group: st.group } },
        h('h3', h('a', { href: href('topics', topic, 'subscriptions', st.group) }, st.group),
          st.consumerId ? h('span.muted', ' · consumer ', h('span.mono', st.consumerId)) : null, ' ', badge(st.state, st.state),
          h('span.muted', ` · ${fmtNum(st.deliveryAttempt)} deliver${st.deliveryAttempt === 1 ? 'y' : 'ies'}`),
          st.lastReason ? h('span.muted', ` · last reason: ${st.lastReason}`) : null),
        table(`Delivery attempts for ${st.group}`, ['Attempt', 'Consumer', 'Delivered', 'Outcome', 'Reason', 'Settled'],
          (st.history || []).map((a) => h('tr',
            h('td.num', String(a.attempt)), h('td.mono', a.consumerId || '—'), h('td', timeEl(a.deliveredAt)),
            h('td', badge(a.outcome, a.outcome)), h('td', a.reason || '—'), h('td', a.settledAt ? timeEl(a.settledAt) : '—'))),
          'Not delivered yet.')))
        : h('p.empty', 'No subscription tracks this message yet (the topic has no subscriptions, or only broadcast ones with no consumer so far).'));
  }

  return {
    title: `Message ${id}`,
    el: h('section.view',
      crumbs(['Topics', href()], [topic, href('topics', topic)], ['Messages', href('topics', topic, 'messages')], [id]),
      errors.el, head, h('section.card', states)),
    async refresh() {
      try {
        const data = await api('GET', messagePath(topic, id), undefined, { quiet: true });
        errors.clear();
        render(data);
      } catch (err) {
        if (err instanceof ProblemError && err.status === 404) {
          errors.show(err);
          return;
        }
        throw err;
      }
    },
  };
}

/**
 * Cluster: the nodes, and per broker group its leader, term and members
 * with their Raft state and how far each is behind the leader.
 */
function clusterView() {
  const head = h('div');
  const nodes = h('div');
  const groups = h('div');
  const errors = errorSlot();

  // A member's lag is the entries the leader has that it has not applied
  // yet; unknown while the group has no leader.
  function lagOf(g, m) {
    const leader = (g.members || []).find((x) => x.id === g.leader);
    if (!leader) return null;
    return Math.max(0, leader.lastIndex - m.appliedIndex);
  }

  function render(v) {
    const alive = v.nodes.filter((n) => n.alive).length;
    const single = v.groups.length === 1 && v.groups[0].members.length === 1 && !v.groups[0].members[0].clusterAddr;
    replace(head, JSON.stringify([v.node, alive, v.nodes.length, v.groups.length, single]),
      h('dl.stats',
        stat('Answered by', h('span#cluster-node', v.node)),
        stat('Nodes alive', h('span#cluster-alive', `${fmtNum(alive)} of ${fmtNum(v.nodes.length)}`), alive < v.nodes.length ? 'bad' : ''),
        stat('Groups', fmtNum(v.groups.length))),
      single ? h('p.muted#cluster-single', 'This node runs alone: a cluster of one, leader of its only group. Start nodes with --node-id, --cluster-addr and --peers to run a cluster.') : null);
    replace(nodes, JSON.stringify([v.node, v.nodes]), table('Nodes', ['Node', 'HTTP address', 'State'],
      v.nodes.map((n) => h('tr', { dataset: { node: n.id } },
        h('th', { scope: 'row' }, h('span.mono', n.id), n.id === v.node ? h('span.muted', ' (this node)') : null),
        h('td.mono', n.httpAddr || '—'),
        h('td.alive', badge(n.alive ? 'alive' : 'down', n.alive ? 'alive' : 'down')))),
      'No nodes.'));
    replace(groups, JSON.stringify(v.groups), v.groups.length ? v.groups.map((g) => h('section.card.cluster-group', { dataset: { group: g.id }, 'aria-labelledby': `group-${g.id}-title` },
      h('h2', { id: `group-${g.id}-title` }, h('span.kind', 'Group '), g.id),
      h('dl.stats',
        stat('Leader', h('span.leader', g.leader || 'none (electing)'), g.leader ? '' : 'bad'),
        stat('Term', h('span.term', fmtNum(g.term))),
        stat('Members', fmtNum(g.members.length))),
      table(`Members of ${g.id}`, ['Member', 'Cluster address', 'HTTP address', 'Suffrage', 'State',
        { label: 'Last index', class: 'num' }, { label: 'Applied index', class: 'num' }, { label: 'Lag', class: 'num' }],
      g.members.map((m) => {
        const lag = lagOf(g, m);
        return h('tr', { dataset: { member: m.id } },
          h('th', { scope: 'row' }, h('span.mono', m.id)),
          h('td.mono', m.clusterAddr || '—'),
          h('td.mono', m.httpAddr || '—'),
          h('td.suffrage', badge(m.suffrage, m.suffrage)),
          h('td.state', badge(m.state, m.state)),
          h('td.num.last', fmtNum(m.lastIndex)),
          h('td.num.applied', fmtNum(m.appliedIndex)),
          h('td.num.lag', { dataset: { lag: lag === null ? '' : String(lag) } }, lag === null ? '—' : fmtNum(lag)));
      }),
      'No members.'))) : h('p.empty', 'No broker groups.'));
  }

  return {
    title: 'Cluster',
    el: h('section.view',
      h('h1', 'Cluster'),
      errors.el, head,
      h('section', { 'aria-labelledby': 'cluster-nodes-title' }, h('h2#cluster-nodes-title', 'Nodes'), nodes),
      groups),
    async refresh() {
      try {
        const v = await api('GET', 'v1/cluster', undefined, { quiet: true });
        errors.clear();
        render({ node: v.node, groups: (v.groups || []).map((g) => ({ ...g, members: g.members || [] })), nodes: v.nodes || [] });
      } catch (err) {
        // A group without a leader (no_leader) and the like show here,
        // over the last view; a 401 goes to the banner and its token button.
        if (err instanceof ProblemError && err.status !== 401 && err.status !== 0) {
          errors.show(err);
          return;
        }
        throw err;
      }
    },
  };
}

function notFoundView() {
  return {
    title: 'Not found',
    el: h('section.view', h('h1', 'Not found'), h('p', 'This console has no such page. ', h('a', { href: href() }, 'Go to the topics.'))),
  };
}

// ------------------------------------------------------------------ router

function parseRoute() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, qs] = raw.split('?');
  let parts;
  try {
    parts = path.split('/').filter(Boolean).map(decodeURIComponent);
  } catch {
    return { view: 'notfound', q: new URLSearchParams() };
  }
  const q = new URLSearchParams(qs || '');
  if (parts.length === 0 || (parts[0] === 'topics' && parts.length === 1)) return { view: 'topics', q };
  if (parts[0] === 'cluster' && parts.length === 1) return { view: 'cluster', q };
  if (parts[0] !== 'topics') return { view: 'notfound', q };
  const [, topic, section, name, tab] = parts;
  if (!section) return { view: 'topic', topic, tab: 'subscriptions', q };
  if (section === 'subscriptions' && name && (!tab || tab === 'dlq') && parts.length <= 5) return { view: 'subscription', topic, group: name, tab: tab || 'overview', q };
  if (section === 'messages' && name && parts.length === 4) return { view: 'message', topic, id: name, q };
  if (['subscriptions', 'messages', 'transactions', 'send', 'code'].includes(section) && parts.length === 3) return { view: 'topic', topic, tab: section, q };
  return { view: 'notfound', q };
}

const VIEWS = {
  topics: topicsView, topic: topicView, subscription: subscriptionView, message: messageView, cluster: clusterView, notfound: notFoundView,
};
let routeKey = null;

function route() {
  const r = parseRoute();
  const key = JSON.stringify([r.view, r.topic, r.group, r.id, r.tab]);
  const view = VIEWS[r.view](r);
  const main = document.getElementById('main');
  main.replaceChildren(view.el);
  current = view;
  document.title = `${view.title} · tidemq`;
  document.getElementById('nav-topics').setAttribute('aria-current', r.view === 'topics' ? 'page' : 'false');
  document.getElementById('nav-cluster').setAttribute('aria-current', r.view === 'cluster' ? 'page' : 'false');
  if (routeKey !== null && key !== routeKey) {
    const h1 = view.el.querySelector('h1');
    if (h1) {
      h1.tabIndex = -1;
      h1.focus({ preventScroll: true });
    }
    window.scrollTo(0, 0);
  }
  routeKey = key;
  tick(true);
}

// ------------------------------------------------------------------ start

setTokenPrompter(tokenDialog);
updateTokenButton();
document.getElementById('token-button').addEventListener('click', async () => {
  if (await askToken(null)) tick(true);
  updateTokenButton();
});
document.getElementById('refresh-button').addEventListener('click', () => tick(true));
document.getElementById('pause-button').addEventListener('click', (ev) => {
  state.paused = !state.paused;
  ev.currentTarget.setAttribute('aria-pressed', String(state.paused));
  ev.currentTarget.textContent = state.paused ? 'Resume' : 'Pause';
  if (!state.paused) tick(true);
});
document.getElementById('skip-link').addEventListener('click', (ev) => {
  ev.preventDefault();
  document.getElementById('main').focus();
});
document.addEventListener('visibilitychange', () => {
  if (!document.hidden) tick(true);
});
window.addEventListener('hashchange', route);
setInterval(() => tick(false), POLL_MS);
route();
