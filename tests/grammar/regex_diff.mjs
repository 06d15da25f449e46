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
//    (backreferences, lookaround, \b, \p{...}, misplaced anchors), each with its message.
// Usage: node tests/grammar/regex_diff.mjs <regex_check binary> [random patterns, default 300]
import { execFileSync } from 'node:child_process';

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
  const input = reqs.map((c, i) => JSON.stringify({ re: c.re, mode: c.mode || 'full', probes: c.probes || [], samples: c.samples ?? 12, seed: i + 1 })).join('\n') + '\n';
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

console.log(`${cases.length / 2} patterns x 2 modes (${empties} matching nothing), ${checked} probes, ${sampled} samples, ${BAD.length + REFUSED.length} refusals: ` +
  `${fails} failed (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(fails ? 1 : 0);
