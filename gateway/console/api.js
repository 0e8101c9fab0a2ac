// The HTTP client of the console: JSON in and out, problems (RFC 9457) as
// ProblemError, and the bearer token (kept in sessionStorage) on every call.
// On a 401 the console asks for a token and tries again.

const TOKEN_KEY = 'tidemq.token';

export class ProblemError extends Error {
  constructor(problem, status) {
    const p = problem && typeof problem === 'object' ? problem : {};
    super(p.detail || p.title || `HTTP ${status}`);
    this.status = status;
    this.title = p.title || (status ? `HTTP ${status}` : 'Error');
    this.detail = p.detail || '';
    this.code = p.code || '';
    this.pointer = p.pointer || '';
    this.problem = p;
  }
}

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

// The prompt is the console's token dialog; one prompt at a time is shared
// by every call that got a 401 meanwhile.
let prompter = async () => null;
let pending = null;
let declined = false;

export function setTokenPrompter(fn) {
  prompter = fn;
}

/** askToken opens the token dialog (also from the Token button). */
export function askToken(problem) {
  if (!pending) {
    pending = Promise.resolve(prompter(problem)).then((token) => {
      pending = null;
      if (token === null || token === undefined) {
        declined = true;
        return false;
      }
      declined = false;
      setToken(token);
      return true;
    });
  }
  return pending;
}

async function readProblem(res) {
  const text = await res.text();
  try {
    const v = JSON.parse(text);
    if (v && typeof v === 'object') return v;
  } catch {
    // not JSON
  }
  return { title: res.statusText || `HTTP ${res.status}`, detail: text.slice(0, 300) };
}

/**
 * request calls the API and returns {status, data}; errors throw
 * ProblemError. path is relative to the page ("v1/topics"), so a console
 * served under a path prefix calls the API under the same prefix.
 * opts.quiet: on a 401 after the user declined to give a token, fail
 * without asking again (background refreshes).
 */
export async function request(method, path, body, opts = {}) {
  for (let attempt = 0; ; attempt++) {
    const token = getToken();
    const headers = { Accept: 'application/json, application/problem+json' };
    if (token) headers.Authorization = `Bearer ${token}`;
    const init = { method, headers, signal: opts.signal };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (err) {
      if (err.name === 'AbortError') throw err;
      throw new ProblemError({ title: 'Server unreachable', detail: `${method} ${path}: ${err.message}` }, 0);
    }
    if (res.status === 401 && attempt < 4) {
      const problem = await readProblem(res);
      if (getToken() !== token) continue; // a token was entered meanwhile
      if (opts.quiet && declined) throw new ProblemError(problem, 401);
      if (await askToken(problem)) continue;
      throw new ProblemError(problem, 401);
    }
    if (!res.ok) throw new ProblemError(await readProblem(res), res.status);
    if (res.status === 204) return { status: 204, data: null };
    const text = await res.text();
    return { status: res.status, data: text ? JSON.parse(text) : null };
  }
}

export async function api(method, path, body, opts) {
  return (await request(method, path, body, opts)).data;
}

/** p builds an API path from segments, escaping each one. */
export function p(...segments) {
  return 'v1/' + segments.map((x) => encodeURIComponent(x)).join('/');
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : '';
}
