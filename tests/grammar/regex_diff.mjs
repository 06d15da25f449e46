// The regex grammars (src/grammar/regex.c) against JavaScript's RegExp with the u flag, the
// definition they follow:
//  - hand-written patterns and random ones (a small generator of alternations, groups, classes,
//    escapes, quantifiers and anchors over ASCII, two-, three- and four-byte characters, quotes,
//    backslashes and control characters), each in two modes:
//      full    (guided_regex): text t is accepted  <=>  /^(?:re)$/u.test(t)
//      pattern (JSON Schema "pattern"): the JSON document JSON.stringify(v) is accepted  <=>
//              /re/u.test(v)   (unanchored, as JSON Schema means it)
//    on probes (texts the generator derives from the pattern, random texts over the pattern's
//    characters and a few others, and the grammar's own samples with one character changed);
//  - every sample the grammar writes (random walks of its matcher) matches (pattern mode: parses
//    to a string that matches and is spelled as JSON.stringify spells it);
//  - patterns JavaScript rejects are refused, and so are the constructs m3 does not serve
//    (backreferences, lookaround, \b, \p{...}, misplaced anchors), each with its message;
//  - JSON Schema "format" (src/grammar/format.c): samples and accepted probes valid by independent
//    checks, the standards' examples accepted and near misses refused;
//  - GBNF grammars (src/grammar/ebnf.c): random grammars whose groups are rules of their own, judged
//    by the RegExp that means the same; a recursive one by hand; refusals with their places.
// Usage: node tests/grammar/regex_diff.mjs <regex_check binary> [random patterns, default 300]
import { execFileSync } from 'node:child_process';
import net from 'node:net';

const [bin, nrand = '300'] = process.argv.slice(2);
if (!bin) { console.error('usage: node regex_diff.mjs <regex_check> [n]'); process.exit(2); }

let seed = 12345;
const rand = n => { seed = (seed * 1103515245 + 12345) % 2147483648; return Math.floor(seed / 2147483648 * n); };
const pick = a => a[rand(a.length)];

const HAND = [
  'abc', 'a|b|c', 'a*', 'a+b?', '(ab)*c', '[a-c]{2,3}', '[^a]', '.', '.*', '\\d+', '\\D', '\\w{3}', '\\W', '\\s', '\\S+',
  '[\\d\\s]', '[^\\w\\s]', 'a{0}', 'a{0,0}b', 'x{2,}', '(?:a|bc){1,3}', '(?<name>ab)c', '^ab', 'ab$', '^ab$', '^a|b$', '^$', '',
  '[^]', 'a[]b|c', '\\u00e9', '\\u{1F600}', '\\uD83D\\uDE00', '\\x41\\x62', '\\cJ', '\\0', '\\t\\n\\v\\f\\r',
  '[\\b]', '[\\-a]', '[a-]', '[-a]', '[--a]', '\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\/\\^\\$\\\\', '/', 'é+', '€{2}', '😀|€',
  '[é-ü]', '[\\u0100-\\uFFFF]', '[\\u{10000}-\\u{10FFFF}]', '[^\\u0000-\\u007F]', '"', '\\\\', '[\\\\"]+', '[\\x00-\\x1F]',
  '\\u2028', '[^\\n]', 'a*?', 'a+?b', 'a??', 'a{1,2}?', '(a|)*', '((a|b)c)+', '(?:(?:(?:a)))', 'a|', '|a', '(|)',
  '[0-9]{4}-[0-9]{2}-[0-9]{2}', '[A-Za-z_][A-Za-z0-9_]*', '(\\+|-)?\\d+(\\.\\d+)?', '[a-z]+@[a-z]+\\.(com|org)',
  '(yes|no|maybe)', 'https?://[^\\s/]+(/[^\\s]*)?', '\\s*[{}]\\s*', '[\\u0080-\\u07FF]', '[\\u0800-\\uFFFF]{2}',
  '^a|b|c$|^d$|e', '^ab|^c|d$|e$|f|', 'x||y', '^(?:a|b)$|c',
];

const BAD = [ // JavaScript rejects these with the u flag
  '(', ')', 'a)', '[a', 'a{', '{', '}', ']', 'a{2,1}', '*', '+a', 'a**', 'a{1}{2}', '[z-a]', '\\', '\\q', '\\xZ1', '\\u12',
  '\\u{110000}', '[\\d-z]', '(?<>a)', '(?x)', '\\00', 'a{,3}', '\\c1',
];

const REFUSED = [ // valid JavaScript, not served
  ['(a)\\1', 'backreference'], ['(?<n>a)\\k<n>', 'named backreference'], ['a(?=b)', 'lookahead'], ['a(?!b)', 'lookahead'],
  ['(?<=a)b', 'lookbehind'], ['(?<!a)b', 'lookbehind'], ['\\bfoo', '\\b'], ['a\\B', '\\B'], ['\\p{L}', 'property'],
  ['a^b', "'^'"], ['a$b', "'$'"], ['(^a)', "'^'"], ['(a$)', "'$'"], ['a{1001}', 'over 1000'],
];

// ---- random patterns: a small AST, its source and texts it matches ----
const CHARS = ['a', 'b', 'c', 'é', '€', '😀', ' ', '"', '-', '0', '7', '_', '\n', '\t', '\u0001', '\u2028'];
const SYNTAX = new Set('^$\\.*+?()[]{}|/'.split(''));
const esc = c => SYNTAX.has(c) ? '\\' + c : c === '\n' ? '\\n' : c === '\t' ? '\\t' : c === '\u0001' ? '\\x01' : c === '\u2028' ? '\\u2028' : c;
const cesc = c => (c === ']' || c === '\\' || c === '-' || c === '^') ? '\\' + c : esc(c);
// the pool also holds the edges of the UTF-8 lengths and the rarer members of \s
const POOL = [...CHARS, 'Z', 'x', '5', '.', '\\', '\r', '\u00a0', '🙂', 'ü', '\u0000', '}', '\u2029', '\u3000', '\ufeff', '\u1680',
  '\u000b', '\u001f', '\u007f', '\u0080', '\u07ff', '\u0800', '\uffff', '\u{10000}', '\u{10ffff}', '\u200a', '\u202f'];

function gen(d) {
  const k = rand(12);
  if (d > 3 || k < 5) return atom(d);
  if (k < 8) return { t: 'seq', xs: Array.from({ length: 2 + rand(3) }, () => gen(d + 1)) };
  if (k < 10) return { t: 'alt', xs: Array.from({ length: 2 + rand(2) }, () => gen(d + 1)) };
  const lo = rand(3), hi = pick([lo, lo + 1, lo + 2, -1]);
  return { t: 'rep', x: gen(d + 1), lo, hi, lazy: rand(4) === 0 };
}
function atom(d) {
  const k = rand(10);
  if (k < 4) return { t: 'lit', c: pick(CHARS) };
  if (k < 6) {
    const items = [];
    for (let i = 0, n = 1 + rand(3); i < n; i++) {
      const a = pick(CHARS), b = pick(CHARS);
      if (rand(3) === 0 && a.codePointAt(0) <= b.codePointAt(0)) items.push(cesc(a) + '-' + cesc(b));
      else if (rand(4) === 0) items.push(pick(['\\d', '\\w', '\\s', '\\D', '\\W', '\\S']));
      else items.push(cesc(a));
    }
    return { t: 'cls', src: '[' + (rand(3) === 0 ? '^' : '') + items.join('') + ']' };
  }
  if (k < 7) return { t: 'cls', src: pick(['\\d', '\\w', '\\s', '\\D', '\\W', '\\S', '.']) };
  if (d > 3) return { t: 'lit', c: pick(CHARS) };
  return { t: 'grp', x: gen(d + 1), cap: rand(2) === 0 };
}
function src(n) {
  switch (n.t) {
    case 'lit': return esc(n.c);
    case 'cls': return n.src;
    case 'grp': return (n.cap ? '(' : '(?:') + src(n.x) + ')';
    case 'seq': return n.xs.map(x => x.t === 'alt' ? '(?:' + src(x) + ')' : src(x)).join('');
    case 'alt': return n.xs.map(src).join('|');
    case 'rep': {
      const inner = ['lit', 'cls', 'grp'].includes(n.x.t) ? src(n.x) : '(?:' + src(n.x) + ')';
      const q = n.lo === 0 && n.hi === -1 ? '*' : n.lo === 1 && n.hi === -1 ? '+' : n.lo === 0 && n.hi === 1 ? '?' :
        n.hi === -1 ? `{${n.lo},}` : n.hi === n.lo ? `{${n.lo}}` : `{${n.lo},${n.hi}}`;
      return inner + q + (n.lazy ? '?' : '');
    }
  }
}
// a text n matches (or null when the generator finds none: an empty class)
function text(n) {
  switch (n.t) {
    case 'lit': return n.c;
    case 'cls': {
      const re = new RegExp('^' + n.src + '$', 'u');
      const ok = POOL.filter(c => re.test(c));
      return ok.length ? pick(ok) : null;
    }
    case 'grp': return text(n.x);
    case 'seq': { let s = ''; for (const x of n.xs) { const t = text(x); if (t === null) return null; s += t; } return s; }
    case 'alt': return text(pick(n.xs));
    case 'rep': {
      const k = n.lo + rand((n.hi < 0 ? n.lo + 3 : n.hi) - n.lo + 1);
      let s = '';
      for (let i = 0; i < k; i++) { const t = text(n.x); if (t === null) return null; s += t; }
      return s;
    }
  }
}

// ---- requests ----
const cases = []; // {re, mode, probes, gen}
const chars = s => [...s];
function randomText(alpha) {
  let s = '';
  for (let i = 0, n = rand(7); i < n; i++) s += pick(alpha);
  return s;
}
function addCase(re, gentexts) {
  let alpha = [...new Set([...chars(re).filter(c => !SYNTAX.has(c)), 'a', 'b', '0', ' ', '\n', 'é', '😀', '"', '\\', '\u0001', pick(POOL), pick(POOL), pick(POOL)])];
  const values = new Set([...gentexts, ...POOL]); // every pool character alone: class membership
  for (let i = 0; i < 40; i++) values.add(randomText(alpha));
  for (const mode of ['full', 'pattern']) {
    const vs = [...values];
    cases.push({ re, mode, values: vs, probes: mode === 'full' ? vs : vs.map(v => JSON.stringify(v)) });
  }
}
for (const re of HAND) addCase(re, []);
for (let i = 0; i < Number(nrand); i++) {
  let node = gen(0), re = src(node);
  const as = rand(5) === 0, ae = rand(5) === 0;
  if (node.t === 'alt' && (as || ae)) re = '(?:' + re + ')';
  re = (as ? '^' : '') + re + (ae ? '$' : '');
  const texts = [];
  for (let j = 0; j < 8; j++) { const t = text(node); if (t !== null) texts.push(t); }
  addCase(re, texts);
}

function run(reqs) {
  const input = reqs.map((c, i) => JSON.stringify({ re: c.re, schema: c.schema, gbnf: c.gbnf, mode: c.mode || 'full', probes: c.probes || [], samples: c.samples ?? 12, seed: i + 1 })).join('\n') + '\n';
  const out = execFileSync(bin, { input, maxBuffer: 1 << 30 }).toString().trim().split('\n');
  if (out.length !== reqs.length) throw new Error(`regex_check answered ${out.length} lines for ${reqs.length}`);
  return out.map(l => JSON.parse(l));
}

let fails = 0, checked = 0, sampled = 0, empties = 0;
const fail = (...a) => { fails++; if (fails <= 40) console.log('FAIL', ...a); };
const t0 = Date.now();

// (1) probes and samples
const answers = run(cases);
for (let i = 0; i < cases.length; i++) {
  const c = cases[i], a = answers[i];
  let js;
  try { js = new RegExp(c.mode === 'full' ? '^(?:' + c.re + ')$' : c.re, 'u'); } catch (e) { fail(`${JSON.stringify(c.re)}: JavaScript rejects it: ${e.message}`); continue; }
  if (a.error && /no output can match it|no string matches the pattern/.test(a.error)) { // an empty language ([^\S\D] ...)
    empties++;
    if (c.values.some(v => js.test(v))) fail(`${JSON.stringify(c.re)} (${c.mode}): refused as matching nothing, but RegExp matches a probe`);
    continue;
  }
  if (a.error) { fail(`${JSON.stringify(c.re)} (${c.mode}): refused: ${a.error}`); continue; }
  for (let j = 0; j < c.values.length; j++) {
    checked++;
    const want = js.test(c.values[j]);
    if (a.accept[j] !== want) fail(`${JSON.stringify(c.re)} (${c.mode}): ${JSON.stringify(c.probes[j])} accepted ${a.accept[j]}, RegExp says ${want}`);
  }
  for (const s of a.samples) {
    sampled++;
    if (s === null) { fail(`${JSON.stringify(c.re)} (${c.mode}): a walk did not end or wrote invalid UTF-8`); continue; }
    if (c.mode === 'full') { if (!js.test(s)) fail(`${JSON.stringify(c.re)}: sample ${JSON.stringify(s)} does not match`); continue; }
    let v;
    try { v = JSON.parse(s); } catch (e) { fail(`${JSON.stringify(c.re)} (pattern): sample ${s} is not JSON`); continue; }
    if (typeof v !== 'string' || !js.test(v) || JSON.stringify(v) !== s) fail(`${JSON.stringify(c.re)} (pattern): sample ${s} (a string that matches, as JSON.stringify spells it)`);
  }
}

// (2) mutated samples as probes: near misses the grammar must judge as RegExp does
const mut = [];
for (let i = 0; i < cases.length; i++) {
  const c = cases[i], a = answers[i];
  if (a.error || c.mode !== 'full') continue;
  const vals = [];
  const s0 = a.samples.find(s => s), c0 = s0 ? chars(s0) : [];
  if (c0.length) for (const p of POOL) { const cs = [...c0]; cs[rand(cs.length)] = p; vals.push(cs.join('')); } // each pool character in context
  for (const s of a.samples) {
    if (s === null) continue;
    const cs = chars(s), k = rand(cs.length + 1), op = rand(3);
    if (op === 0) cs.splice(k, 0, pick(POOL));
    else if (op === 1 && cs.length) cs.splice(k % cs.length, 1);
    else if (cs.length) cs[k % cs.length] = pick(POOL);
    vals.push(cs.join(''));
  }
  for (const mode of ['full', 'pattern'])
    mut.push({ re: c.re, mode, values: vals, probes: mode === 'full' ? vals : vals.map(v => JSON.stringify(v)), samples: 0 });
}
const mans = run(mut);
for (let i = 0; i < mut.length; i++) {
  const c = mut[i], a = mans[i], js = new RegExp(c.mode === 'full' ? '^(?:' + c.re + ')$' : c.re, 'u');
  for (let j = 0; j < c.values.length; j++) {
    checked++;
    const want = js.test(c.values[j]);
    if (a.accept[j] !== want) fail(`${JSON.stringify(c.re)} (${c.mode}, mutated): ${JSON.stringify(c.probes[j])} accepted ${a.accept[j]}, RegExp says ${want}`);
  }
}

// (3) refusals
const bad = run(BAD.map(re => ({ re, samples: 0 })));
BAD.forEach((re, i) => {
  let jsOk = true;
  try { new RegExp(re, 'u'); } catch { jsOk = false; }
  if (jsOk) fail(`${JSON.stringify(re)}: JavaScript accepts it (the list is wrong)`);
  if (!bad[i].error || !/^regex: .* \(offset \d+\)$/.test(bad[i].error)) fail(`${JSON.stringify(re)}: not refused with a message and an offset (${bad[i].error})`);
});
const ref = run(REFUSED.map(([re]) => ({ re, samples: 0 })));
REFUSED.forEach(([re, word], i) => {
  try { new RegExp(re, 'u'); } catch (e) { fail(`${JSON.stringify(re)}: JavaScript rejects it (the list is wrong): ${e.message}`); }
  if (!ref[i].error || !ref[i].error.includes(word)) fail(`${JSON.stringify(re)}: refused with ${JSON.stringify(ref[i].error)}, expected a message naming ${word}`);
});
const pref = run([{ re: '(?=x)', mode: 'pattern', samples: 0 }, { re: '[]', samples: 0 }, { re: 'a[]|[^\\s\\S]', mode: 'pattern', samples: 0 }]);
if (!/^json schema: "pattern": lookahead \(\?=\.\.\.\) is not supported \(offset 0\) at \/pattern$/.test(pref[0].error || '')) fail(`pattern refusal message: ${pref[0].error}`);
if (pref[1].error !== 'regex: no output can match it') fail(`an empty language: ${pref[1].error}`);
if (pref[2].error !== 'json schema: no string matches the pattern at /pattern') fail(`an empty pattern: ${pref[2].error}`);

// (4) "format" (src/grammar/format.c): every sample valid by an independent check (node's net for IP
// addresses, Date for calendar days, RFC 3339's ABNF for durations, RFC 1123 / 5322 rules for host
// names and addresses); accepted probes valid; the standard's examples accepted, bad ones refused.
// Each format writes a subset of its standard, so a valid probe may be refused: only the listed
// examples must be accepted.
const isDate = v => {
  const m = /^(\d{4})-(\d{2})-(\d{2})$/.exec(v);
  if (!m) return false;
  const [y, mo, d] = [+m[1], +m[2], +m[3]], t = new Date(0);
  t.setUTCFullYear(y, mo - 1, d);
  return t.getUTCFullYear() === y && t.getUTCMonth() === mo - 1 && t.getUTCDate() === d;
};
const isTime = v => {
  const m = /^(\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|([+-])(\d{2}):(\d{2}))$/.exec(v);
  return !!m && +m[1] < 24 && +m[2] < 60 && +m[3] <= 60 && (!m[6] || (+m[7] < 24 && +m[8] < 60));
};
const isDuration = v => { // RFC 3339 appendix A, by hand
  let i = 0;
  const num = () => { const j = i; while (/[0-9]/.test(v[i] || '')) i++; return i > j; };
  const unit = u => { const j = i; if (num() && v[i] === u) { i++; return true; } i = j; return false; };
  const durTime = () => {
    if (v[i] !== 'T') return false;
    i++;
    if (unit('H')) { if (unit('M')) unit('S'); return true; }
    if (unit('M')) { unit('S'); return true; }
    return unit('S');
  };
  if (v[i++] !== 'P') return false;
  if (unit('W')) return i === v.length;
  if (v[i] === 'T') return durTime() && i === v.length;
  if (unit('Y')) { if (unit('M')) unit('D'); } else if (unit('M')) unit('D'); else if (!unit('D')) return false;
  if (v[i] === 'T' && !durTime()) return false;
  return i === v.length;
};
const isHost = v => v.length <= 253 && v.split('.').every(l => /^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$/.test(l));
const isEmail = v => {
  const at = v.lastIndexOf('@'), local = v.slice(0, at), dom = v.slice(at + 1);
  return at > 0 && local.length <= 64 && local.split('.').every(a => /^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+$/.test(a)) && isHost(dom) && dom.includes('.');
};
const FMT = {
  'date': [isDate, ['2024-02-29', '2000-02-29', '1999-12-31', '0000-01-01', '2023-04-30'], ['2023-02-29', '1900-02-29', '2024-13-01', '2024-04-31', '2024-1-01', '2024-02-30']],
  'time': [isTime, ['23:59:59Z', '00:00:00.123+05:30', '12:30:00-08:00'], ['24:00:00Z', '12:60:00Z', '12:00:00', '12:00Z']],
  'date-time': [v => { const k = v.indexOf('T'); return k > 0 && isDate(v.slice(0, k)) && isTime(v.slice(k + 1)); },
                ['2024-02-29T23:59:59.5Z', '1970-01-01T00:00:00+00:00'], ['2024-02-29 23:59:59Z', '2023-02-29T00:00:00Z']],
  'duration': [isDuration, ['P1Y2M3DT4H5M6S', 'PT0S', 'P3W', 'P1M', 'PT1H30M', 'P2D'], ['P', 'PT', 'P1Y2D', 'P1D2M', 'P1H', 'PT1D']],
  'email': [isEmail, ['a.b+c@example.com', 'x_1@mail.example.org'], ['a..b@x.com', '@x.com', 'a@b', 'a@b.c']],
  'hostname': [isHost, ['example.com', 'a-b.c9', 'localhost'], ['-a.com', 'a_b.com', 'a-.com']],
  'ipv4': [v => net.isIPv4(v), ['255.255.255.255', '0.0.0.0', '10.1.20.200'], ['256.1.1.1', '01.2.3.4', '1.2.3']],
  'ipv6': [v => net.isIPv6(v), ['::1', '::', 'fe80::1:2', '2001:db8:0:0:0:0:2:1', '1:2:3:4:5:6:7::'], ['1:2:3:4:5:6:7:8:9', ':::', '1::2::3', '12345::']],
  'uuid': [v => /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(v), ['123e4567-e89b-12d3-a456-426614174000'], ['123e4567e89b12d3a456426614174000', '123e4567-e89b-12d3-a456-42661417400g']],
};
const freq = [];
for (const [f, [, good, badv]] of Object.entries(FMT)) {
  const values = [...good, ...badv];
  for (let k = 0; k < 30; k++) values.push(randomText([...'0123456789:-.T+Z@abcPYMDWHS', pick(POOL)]));
  freq.push({ f, good, badv, values, schema: { type: 'string', format: f }, samples: 40 });
}
// format beside pattern and lengths
freq.push({ f: 'date', good: ['2024-02-29'], badv: ['2023-01-01'], values: [], schema: { type: 'string', format: 'date', pattern: '^2024-' }, samples: 30, re: /^2024-/ });
freq.push({ f: 'email', good: ['ab@cd.io'], badv: ['abcdef@ghij.com'], values: [], schema: { type: 'string', format: 'email', maxLength: 12 }, samples: 30, max: 12 });
const fans = run(freq.map(c => ({ schema: c.schema, probes: [...c.good, ...c.badv, ...c.values].map(v => JSON.stringify(v)), samples: c.samples })));
let fsamples = 0;
freq.forEach((c, i) => {
  const a = fans[i], ok = FMT[c.f][0], what = JSON.stringify(c.schema);
  if (a.error) { fail(`${what}: ${a.error}`); return; }
  const vals = [...c.good, ...c.badv, ...c.values];
  vals.forEach((v, j) => {
    checked++;
    const want = j < c.good.length ? true : j < c.good.length + c.badv.length ? false : null;
    if (want !== null && a.accept[j] !== want) fail(`${what}: ${JSON.stringify(v)} accepted ${a.accept[j]}, expected ${want}`);
    if (a.accept[j] && !ok(v)) fail(`${what}: accepted ${JSON.stringify(v)}, which the independent check refuses`);
  });
  for (const s of a.samples) {
    fsamples++;
    let v = null;
    try { v = JSON.parse(s); } catch {}
    if (typeof v !== 'string' || !ok(v) || (c.re && !c.re.test(v)) || (c.max && [...v].length > c.max))
      fail(`${what}: sample ${s} is not valid`);
  }
});
const fref = run([{ schema: { type: 'string', format: 'uri' } }, { schema: { type: 'integer', format: 'int32' } }, { schema: { type: ['string', 'null'], format: 'uuid' } },
                  { schema: { type: 'string', format: 'ipv4', pattern: '^1\\.2\\.3\\.4$', maxLength: 6 } }, { schema: { type: 'string', format: 'date', pattern: 'x' } }]
  .map(r => ({ ...r, samples: 0 })));
if (!/^json schema: unsupported "format": "uri" \(served, for strings: date-time, .*\) at \/format$/.test(fref[0].error || '')) fail(`format uri: ${fref[0].error}`);
if (!/unsupported "format": "int32"/.test(fref[1].error || '')) fail(`format int32 on an integer: ${fref[1].error}`);
if (fref[2].error) fail(`format uuid on ["string", "null"]: ${fref[2].error}`);
if (!/no string of 0 to 6 characters matches the format and the pattern/.test(fref[3].error || '')) fail(`format + pattern + maxLength, none: ${fref[3].error}`);
if (!/no string matches both "format" and "pattern" at \/pattern/.test(fref[4].error || '')) fail(`format + pattern, none: ${fref[4].error}`);

console.log(`formats: ${freq.length} schemas, ${fsamples} samples valid`);

// (5) GBNF (src/grammar/ebnf.c): random grammars, each printed both as GBNF (groups as rules of their
// own, referenced by name) and as the regular expression that means the same, judged by RegExp;
// a recursive grammar (balanced brackets) against a hand check; errors with their places
const gchars = ['a', 'b', 'é', '€', '😀', ' ', '"', '\\', '\n', '\t', '-', ']', '0', '\u0001'];
const gq = c => c === '"' ? '\\"' : c === '\\' ? '\\\\' : c === '\n' ? '\\n' : c === '\t' ? '\\t' : c === '\u0001' ? '\\x01' : c;
const gcq = c => c === ']' ? '\\]' : c === '-' ? '\\-' : c === '^' ? '\\^' : gq(c);
function genG(d, rules) {
  const k = rand(12);
  if (d > 3 || k < 5) {
    const a = rand(10);
    if (a < 5) { const c = pick(gchars); return { re: esc(c), g: '"' + gq(c) + '"', t: () => c }; }
    if (a < 8) {
      const items = [];
      for (let i = 0, n = 1 + rand(3); i < n; i++) {
        let x = pick(gchars), y = pick(gchars);
        if (x.codePointAt(0) > y.codePointAt(0)) [x, y] = [y, x];
        items.push(rand(2) ? [x, x] : [x, y]);
      }
      const neg = rand(4) === 0;
      const re = '[' + (neg ? '^' : '') + items.map(([x, y]) => cesc(x) + (x !== y ? '-' + cesc(y) : '')).join('') + ']';
      const g = '[' + (neg ? '^' : '') + items.map(([x, y]) => gcq(x) + (x !== y ? '-' + gcq(y) : '')).join('') + ']';
      const jr = new RegExp('^' + re + '$', 'u'), ok = POOL.filter(c => jr.test(c));
      return { re, g, t: () => ok.length ? pick(ok) : null };
    }
    return { re: '[^]', g: '.', t: () => pick(POOL) };
  }
  if (k < 8) {
    const xs = Array.from({ length: 2 + rand(3) }, () => genG(d + 1, rules));
    return { re: xs.map(x => '(?:' + x.re + ')').join(''), g: xs.map(x => '(' + x.g + ')').join(' '),
             t: () => { let s = ''; for (const x of xs) { const v = x.t(); if (v === null) return null; s += v; } return s; } };
  }
  if (k < 10) {
    const xs = Array.from({ length: 2 + rand(2) }, () => genG(d + 1, rules));
    const name = 'r' + rules.length;
    rules.push(name + ' ::= ' + xs.map(x => x.g).join(' | '));
    return { re: '(?:' + xs.map(x => x.re).join('|') + ')', g: name, t: () => pick(xs).t() };
  }
  const x = genG(d + 1, rules), lo = rand(3), hi = pick([lo, lo + 1, lo + 2, -1]);
  const q = lo === 0 && hi === -1 ? '*' : lo === 1 && hi === -1 ? '+' : lo === 0 && hi === 1 ? '?' : hi === -1 ? `{${lo},}` : hi === lo ? `{${lo}}` : `{${lo},${hi}}`;
  return { re: '(?:' + x.re + ')' + q, g: '(' + x.g + ')' + q,
           t: () => { const n = lo + rand((hi < 0 ? lo + 3 : hi) - lo + 1); let s = ''; for (let i = 0; i < n; i++) { const v = x.t(); if (v === null) return null; s += v; } return s; } };
}
const gcases = [];
for (let i = 0; i < 200; i++) {
  const rules = [], top = genG(0, rules);
  const gbnf = ['root ::= ' + top.g + (rand(2) ? '  # the output' : ''), ...rules].join(rand(2) ? '\n' : '\n\n');
  const vals = new Set();
  for (let j = 0; j < 8; j++) { const v = top.t(); if (v !== null) vals.add(v); }
  for (let j = 0; j < 30; j++) vals.add(randomText([...gchars, pick(POOL)]));
  gcases.push({ gbnf, re: top.re, values: [...vals], samples: 10 });
}
const bal = v => { let d = 0; for (const c of v) { if (c === '(' || c === '[') d++; else if (c === ')' || c === ']') d--; if (d < 0) return false; } return d === 0; };
const BAL = 'root ::= item*\nitem ::= "(" root ")" | "[" root "]"   # nested up to max_depth';
// two calls a level (root, item): max_depth 32 holds 15 levels, not 17
const balVals = ['', '()', '[()]', '([)]', '(()', '())', '[[[]]]()', '('.repeat(15) + ')'.repeat(15), '('.repeat(17) + ')'.repeat(17)];
gcases.push({ gbnf: BAL, check: v => bal(v) && !/\(\]|\[\)/.test(v.replace(/\(\)|\[\]/g, '')), values: balVals, samples: 20 });
const gans = run(gcases.map(c => ({ gbnf: c.gbnf, probes: c.values, samples: c.samples })));
let gsamples = 0, gempty = 0;
gcases.forEach((c, i) => {
  const a = gans[i];
  if (a.error && /no output can match it/.test(a.error)) { gempty++; return; }
  if (a.error) { fail(`gbnf ${JSON.stringify(c.gbnf)}: ${a.error}`); return; }
  const js = c.re !== undefined ? new RegExp('^(?:' + c.re + ')$', 'u') : null;
  const okv = v => js ? js.test(v) : c.check(v);
  c.values.forEach((v, j) => {
    checked++;
    if (js && a.accept[j] !== okv(v)) fail(`gbnf ${JSON.stringify(c.gbnf)}: ${JSON.stringify(v)} accepted ${a.accept[j]}, RegExp ${c.re} says ${okv(v)}`);
    if (!js && a.accept[j] && !okv(v)) fail(`gbnf balanced: accepted ${JSON.stringify(v)}`);
  });
  for (const smp of a.samples) { gsamples++; if (smp === null || !okv(smp)) fail(`gbnf ${JSON.stringify(c.gbnf)}: sample ${JSON.stringify(smp)} does not match`); }
});
const last = gans[gans.length - 1];
if (!(last.accept[0] && last.accept[1] && last.accept[2] && !last.accept[3] && !last.accept[4] && !last.accept[5] && last.accept[6] && last.accept[7] && !last.accept[8]))
  fail(`gbnf balanced: probes ${JSON.stringify(last.accept)} (15 levels within max_depth 32, 17 beyond)`);
const GBAD = [['root ::= x', 'the rule "x" is used but not defined (line 1, column 10)'], ['root ::= root "a" | "b"', 'left-recursive rule'],
  ['root ::= "a"\nroot ::= "b"', 'the rule "root" is defined twice (line 2, column 1)'], ['root ::= [z-a]', 'a range out of order in a class (line 1, column 10)'],
  ['foo ::= "a"', 'no rule named root'], ['root ::= ("a" | "b"', 'a ( without its ) (line 1, column 10)'], ['root ::= "a', 'a literal without its closing "'],
  ['root ::= "a"{2,1}', 'a repetition {2,1} out of order'], ['root ::= "\\q"', 'unknown escape \\q'], ['', 'an empty grammar'], ['root = "a"', 'a rule (name ::= ...) expected (line 1, column 1)'],
  ['root ::= "a" )', 'a ) without its ('], ['root ::= "a"{1001}', 'a repetition count over 1000']];
const gbad = run(GBAD.map(([g]) => ({ gbnf: g, samples: 0 })));
GBAD.forEach(([g, want], i) => { if (!gbad[i].error || !gbad[i].error.startsWith('grammar: ') || !gbad[i].error.includes(want)) fail(`gbnf ${JSON.stringify(g)}: ${gbad[i].error}, want ${want}`); });
console.log(`gbnf: ${gcases.length} grammars (${gempty} matching nothing), ${gsamples} samples, ${GBAD.length} refusals`);
console.log(`${cases.length / 2} patterns x 2 modes (${empties} matching nothing), ${checked} probes, ${sampled} samples, ${BAD.length + REFUSED.length} refusals: ` +
  `${fails} failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(fails ? 1 : 0);
