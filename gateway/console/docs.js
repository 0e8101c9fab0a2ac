// The API reference page (/docs): Redoc, bundled under vendor/redoc/, renders
// openapi.yaml from this server. Nothing is fetched from anywhere else, and
// Redoc's telemetry is off (the page's Content-Security-Policy would block
// it anyway).
import { init } from './vendor/redoc/redoc.standalone.js';

const TOKEN_KEY = 'tidemq.token'; // the console's key: a token entered there works here
const status = document.getElementById('docs-status');
const container = document.getElementById('redoc-container');

async function fetchSpec() {
  const headers = { Accept: 'application/yaml' };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch('openapi.yaml', { headers });
  if (res.status === 401) return { unauthenticated: true, problem: await res.json().catch(() => ({})) };
  if (!res.ok) throw new Error(`GET openapi.yaml: HTTP ${res.status}`);
  return { text: await res.text() };
}

function askToken(problem) {
  return new Promise((resolve) => {
    status.replaceChildren();
    const form = document.createElement('form');
    form.className = 'token-form';
    const msg = document.createElement('p');
    msg.textContent = `${problem.title || 'Unauthenticated'}${problem.detail ? ': ' + problem.detail : ''}. Enter a bearer token to read the reference.`;
    const label = document.createElement('label');
    label.htmlFor = 'docs-token';
    label.textContent = 'Token';
    const input = document.createElement('input');
    input.id = 'docs-token';
    input.type = 'password';
    input.autocomplete = 'off';
    input.required = true;
    const button = document.createElement('button');
    button.type = 'submit';
    button.textContent = 'Use token';
    form.append(msg, label, input, button);
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, input.value.trim());
      status.textContent = 'Loading the API reference…';
      resolve();
    });
    status.append(form);
    input.focus();
  });
}

async function main() {
  try {
    let spec = await fetchSpec();
    while (spec.unauthenticated) {
      await askToken(spec.problem);
      spec = await fetchSpec();
    }
    const done = new MutationObserver(() => {
      if (container.querySelector('h1, h2')) {
        status.hidden = true;
        done.disconnect();
      }
    });
    done.observe(container, { childList: true, subtree: true });
    init(spec.text, {
      disableTelemetry: true,
      downloadUrls: [{ title: 'openapi.yaml', url: new URL('openapi.yaml', document.baseURI).href }],
    }, container);
  } catch (err) {
    status.textContent = `Could not load the API reference: ${err.message}`;
    status.classList.add('problem');
  }
}

main();
