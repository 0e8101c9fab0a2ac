// Lag over time, drawn as an inline SVG polyline from the values the console
// polls: no chart library. Samples are {t: ms since epoch, v: lag}.

import { s, fmtNum } from './dom.js';

export const WINDOW_MS = 5 * 60 * 1000; // the most a chart shows
const MIN_WINDOW_MS = 30 * 1000; // the least, so that a fresh page shows a line at once

// niceCeil rounds a scale up to 1, 2, 4, 6 or 8 times a power of ten, so
// that the middle grid line falls on a whole number.
function niceCeil(v) {
  if (v <= 1) return 1;
  const exp = 10 ** Math.floor(Math.log10(v));
  for (const m of [1, 2, 4, 6, 8, 10]) if (m * exp >= v) return m * exp;
  return 10 * exp;
}

function span(ms) {
  return ms >= 60000 ? `${+(ms / 60000).toFixed(1)} min` : `${Math.round(ms / 1000)} s`;
}

/**
 * lagChart draws the samples of the last WINDOW_MS (or since the first
 * sample, at least MIN_WINDOW_MS). Small charts (in table rows) are a bare
 * sparkline; big ones get a scale and a time axis.
 */
export function lagChart(samples, { width = 120, height = 28, big = false, label = 'lag' } = {}) {
  const now = Date.now();
  const pts = samples.filter((x) => x.t >= now - WINDOW_MS);
  const windowMs = Math.min(WINDOW_MS, Math.max(MIN_WINDOW_MS, pts.length ? now - pts[0].t : 0));
  const last = pts.length ? pts[pts.length - 1].v : undefined;
  const max = niceCeil(Math.max(1, ...pts.map((x) => x.v)));
  const padL = big ? 44 : 1;
  const padR = big ? 8 : 1;
  const padT = big ? 10 : 2;
  const padB = big ? 20 : 2;
  const w = width - padL - padR;
  const hgt = height - padT - padB;
  const x = (t) => padL + w * (1 - (now - t) / windowMs);
  const y = (v) => padT + hgt * (1 - v / max);
  const desc = pts.length
    ? `${label}: now ${fmtNum(last)}, highest ${fmtNum(Math.max(...pts.map((p) => p.v)))} over the last ${span(windowMs)} (${pts.length} samples)`
    : `${label}: no samples yet`;
  const svg = s('svg', {
    class: big ? 'chart chart-big' : 'chart',
    viewBox: `0 0 ${width} ${height}`,
    width,
    height,
    preserveAspectRatio: big ? undefined : 'none',
    role: 'img',
    'aria-label': desc,
  }, s('title', {}, desc));
  if (big) {
    for (const frac of max > 1 ? [0, 0.5, 1] : [0, 1]) {
      const yy = padT + hgt * (1 - frac);
      svg.append(
        s('line', { class: 'grid', x1: padL, x2: width - padR, y1: yy, y2: yy }),
        s('text', { class: 'axis', x: padL - 6, y: yy + 4, 'text-anchor': 'end' }, fmtNum(Math.round(max * frac))),
      );
    }
    for (const [frac, text] of [[0, `−${span(windowMs)}`], [0.5, `−${span(windowMs / 2)}`], [1, 'now']]) {
      svg.append(s('text', {
        class: 'axis', x: padL + w * frac, y: height - 5,
        'text-anchor': frac === 0 ? 'start' : frac === 1 ? 'end' : 'middle',
      }, text));
    }
  } else {
    svg.append(s('line', { class: 'baseline', x1: padL, x2: width - padR, y1: padT + hgt, y2: padT + hgt }));
  }
  if (pts.length === 1) {
    svg.append(s('circle', { class: 'dot', cx: x(pts[0].t), cy: y(pts[0].v), r: big ? 3 : 2 }));
  } else if (pts.length > 1) {
    const line = pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ');
    const area = `${x(pts[0].t).toFixed(1)},${padT + hgt} ${line} ${x(pts[pts.length - 1].t).toFixed(1)},${padT + hgt}`;
    svg.append(
      s('polygon', { class: 'area', points: area }),
      s('polyline', { class: 'line', points: line, 'vector-effect': 'non-scaling-stroke' }),
      s('circle', { class: 'dot', cx: x(pts[pts.length - 1].t), cy: y(last), r: big ? 3 : 2 }),
    );
  }
  return svg;
}
