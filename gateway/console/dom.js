// Small DOM and formatting helpers. Everything is built with createElement
// and text nodes: data from the server is never parsed as HTML.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2).toLowerCase(), v);
    } else if (k === 'class') {
      el.setAttribute('class', Array.isArray(v) ? v.filter(Boolean).join(' ') : v);
    } else if (k === 'dataset') {
      Object.assign(el.dataset, v);
    } else if (k === 'value' && 'value' in el) {
      el.value = v;
    } else if (k === 'checked' || k === 'selected' || k === 'indeterminate') {
      el[k] = Boolean(v);
    } else {
      el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** h('tag#id.class.class', {attrs}, ...children) makes an HTML element. */
export function h(tag, attrs, ...children) {
  const m = /^([a-z][a-z0-9-]*)?((?:[#.][A-Za-z0-9_-]+)*)$/.exec(tag);
  if (!m) throw new Error(`h: bad tag ${tag}`);
  const el = document.createElement(m[1] || 'div');
  const classes = [];
  for (const part of m[2].match(/[#.][A-Za-z0-9_-]+/g) || []) {
    if (part[0] === '#') el.id = part.slice(1);
    else classes.push(part.slice(1));
  }
  if (classes.length) el.className = classes.join(' ');
  if (attrs && (typeof attrs !== 'object' || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = {};
  }
  return build(el, attrs, children);
}

/** s('tag', {attrs}, ...children) makes an SVG element. */
export function s(tag, attrs, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/**
 * replace swaps the children of a container, keeping keyboard focus on the
 * element with the same data-focus-key (rows are re-rendered on every poll)
 * and skipping the work when nothing changed (sig).
 */
export function replace(container, sig, ...children) {
  if (sig !== undefined && container.dataset.sig === sig) return false;
  const active = document.activeElement;
  const key = active && container.contains(active) ? active.dataset.focusKey : undefined;
  container.replaceChildren();
  append(container, children);
  if (sig !== undefined) container.dataset.sig = sig;
  if (key) {
    const again = container.querySelector(`[data-focus-key="${CSS.escape(key)}"]`);
    if (again) again.focus();
  }
  return true;
}

const numberFormat = new Intl.NumberFormat();
export function fmtNum(n) {
  return n === undefined || n === null ? '—' : numberFormat.format(n);
}

export function fmtBytes(n) {
  if (n === undefined || n === null) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

export function fmtRate(r) {
  if (r === undefined || r === null || Number.isNaN(r)) return '—';
  if (r === 0) return '0/s';
  return `${r < 10 ? r.toFixed(1) : numberFormat.format(Math.round(r))}/s`;
}

/** timeEl shows a server time (RFC 3339, UTC) as local YYYY-MM-DD HH:MM:SS; the title keeps the original. */
export function timeEl(iso) {
  if (!iso) return h('span', '—');
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return h('span', iso);
  const pad = (x) => String(x).padStart(2, '0');
  const text = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return h('time', { datetime: iso, title: `${iso} (UTC)` }, text);
}

export function ago(iso, now = Date.now()) {
  if (!iso) return '—';
  const s = Math.max(0, Math.round((now - new Date(iso).getTime()) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** bodyBytes returns a message body as bytes, whatever its encoding. */
export function bodyBytes(m) {
  if (m.bodyEncoding === 'base64') {
    const bin = atob(m.body || '');
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  return new TextEncoder().encode(m.body || '');
}

/** bodyText returns the body as text, or null when it is not UTF-8. */
export function bodyText(m) {
  if (m.bodyEncoding !== 'base64') return m.body || '';
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(bodyBytes(m));
  } catch {
    return null;
  }
}

export function preview(m, n = 80) {
  const t = bodyText(m);
  if (t === null) return `(binary, ${fmtBytes(bodyBytes(m).length)})`;
  const one = t.replace(/\s+/g, ' ');
  return one.length > n ? one.slice(0, n - 1) + '…' : one;
}

/** hexDump renders bytes as offset, 16 hex bytes and their ASCII. */
export function hexDump(bytes, max = 65536) {
  const lines = [];
  const n = Math.min(bytes.length, max);
  for (let off = 0; off < n; off += 16) {
    const row = bytes.subarray(off, Math.min(off + 16, n));
    const hex = Array.from(row, (b) => b.toString(16).padStart(2, '0'));
    const ascii = Array.from(row, (b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : '.')).join('');
    const left = hex.slice(0, 8).join(' ');
    const right = hex.slice(8).join(' ');
    lines.push(`${off.toString(16).padStart(8, '0')}  ${left.padEnd(23)}  ${right.padEnd(23)}  |${ascii}|`);
  }
  if (bytes.length > max) lines.push(`… ${fmtNum(bytes.length - max)} more bytes not shown`);
  return lines.join('\n');
}

/** localInput turns an RFC 3339 time into a datetime-local value, and back. */
export function toLocalInput(d) {
  const pad = (x) => String(x).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

export function fromLocalInput(v) {
  if (!v) return '';
  const d = new Date(v);
  return Number.isNaN(d.getTime()) ? '' : d.toISOString();
}
