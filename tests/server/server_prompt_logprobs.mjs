// Prompt logprobs through m3 serve: completions' echo + logprobs (what lm-evaluation-harness's
// loglikelihood tasks send) and vLLM's prompt_logprobs, on tests/data/m3-tiny (whose Hugging Face
// reference logits are in tests/data/m3-tiny.oracle.safetensors) with the qwen3 tokenizer:
//  - lm-eval's request ({prompt: [[ids]...], echo, logprobs: 1, max_tokens: 1, temperature: 0}):
//    per choice one entry per prompt token and one for the generated token, the first null; every
//    prompt logprob the log-softmax of the reference's logits at the position before (all oracle
//    cases, a batch of them in one request); the reference's greedy continuation appended to a
//    prompt is greedy there (lm-eval's is_greedy) and its logprobs are those the server gives
//    those tokens when it generates them, to the last digit;
//  - the entries: tokens add up to the text, text_offset counts code points, a top_logprobs dict
//    holds the prompt's token and the most likely ones (texts that collide keep the likelier's
//    value); a stop token generated keeps its entry; vLLM's prompt_logprobs list beside
//    them ({"<id>": {logprob, rank, decoded_token}}, ranks 1..k for the most likely);
//  - a stream: the first chunk is the echo with the prompt's entries, the chunks fold into the
//    non-stream answer; max_tokens 0 with echo: the prompt alone (stream too), 0 completion tokens;
//  - chat: a top-level prompt_logprobs over the rendered prompt (n > 1: one list);
//  - 24 such requests at once beside generating ones: every answer equal to the same request alone;
//  - the official openai client parses all of it; bad values are 400s naming the field;
//  - the prompt rows reduced where the logits are (the default on one device) and as logits rows on
//    the host (M3_PROMPT_LOGPROBS=host, a TP group's path) answer the same.
// Usage: node tests/server/server_prompt_logprobs.mjs <m3-binary> <work-dir>
import fs from 'node:fs';
import OpenAI from 'openai';
import { root, TOKENIZER, makeCheckpoint, startServer, post, stream, reporter } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_prompt_logprobs.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;

// the reference: tests/data/m3-tiny with the tokenizer beside it
const ck = work + '/tiny';
fs.rmSync(ck, { recursive: true, force: true });
fs.cpSync(root + '/tests/data/m3-tiny', ck, { recursive: true });
fs.copyFileSync(TOKENIZER, ck + '/tokenizer.json');
const cfg = JSON.parse(fs.readFileSync(ck + '/config.json')), V = (cfg.text_config || cfg).vocab_size;

function readSafetensors(file) {
  const b = fs.readFileSync(file), hl = Number(b.readBigUInt64LE(0)), hdr = JSON.parse(b.subarray(8, 8 + hl).toString());
  const get = name => {
    const t = hdr[name];
    if (!t) return null;
    const d = b.subarray(8 + hl + t.data_offsets[0], 8 + hl + t.data_offsets[1]);
    const ab = d.buffer.slice(d.byteOffset, d.byteOffset + d.length);
    return t.dtype === 'F32' ? new Float32Array(ab) : new Int32Array(ab);
  };
  return get;
}
const orc = readSafetensors(root + '/tests/data/m3-tiny.oracle.safetensors');
const cases = [];
for (let k = 0; k < 8; k++) {
  const ids = orc(`case${k}.input_ids`), lg = orc(`case${k}.logits`), gt = orc(`case${k}.greedy_tokens`), gl = orc(`case${k}.greedy_logits`);
  if (ids && lg && gt && gl) cases.push({ k, ids: [...ids], lg, gt: [...gt], gl });
}
ok(cases.length >= 4, `oracle cases with prompt logits: ${cases.length}`);
// log_softmax(row)[tok] and the row's rank of tok, in double
function refLp(rows, r, tok) {
  const x = rows.subarray(r * V, (r + 1) * V);
  let m = -Infinity, s = 0, gt = 0, near = 0;
  for (const v of x) m = Math.max(m, v);
  for (const v of x) s += Math.exp(v - m);
  for (let i = 0; i < V; i++) { gt += x[i] > x[tok]; near += i !== tok && Math.abs(x[i] - x[tok]) < 1e-3; }
  return { lp: x[tok] - m - Math.log(s), rank: gt + 1, near };
}

// f32 caches: the reference's exact arithmetic (the bf16 default rounds K / V as the reference did not)
const srv = await startServer(m3, ck, ['--served-model-name', 'tiny', '--kv-cache-dtype', 'f32', '--kv-cache-memory', '268435456']);
const base = srv.base;
const csrv = await startServer(m3, makeCheckpoint(m3, work + '/ck'), ['--served-model-name', 'tiny']);
const cbase = csrv.base;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });
const t0 = Date.now();
try {
  // ---- lm-eval's loglikelihood request: every oracle case in one batch ----
  const lmBody = { model: 'tiny', prompt: cases.map(c => c.ids), temperature: 0, max_tokens: 1, logprobs: 1, seed: 1234, echo: true };
  const lm = await post(base, '/v1/completions', lmBody);
  ok(lm.status === 200 && lm.json.choices.length === cases.length, `lm-eval batch of ${cases.length} prompts: ${lm.status}`);
  let worst = 0, n = 0, rankOk = 0, rankN = 0, shape = true;
  const choices = [...lm.json.choices].sort((a, b) => a.index - b.index);
  for (const [i, c] of cases.entries()) {
    const L = choices[i].logprobs, np = c.ids.length;
    shape &&= L.tokens.length === np + 1 && L.token_logprobs.length === np + 1 && L.top_logprobs.length === np + 1 &&
      L.text_offset.length === np + 1 && L.token_logprobs[0] === null && L.top_logprobs[0] === null;
    shape &&= choices[i].prompt_logprobs.length === np && choices[i].prompt_logprobs[0] === null;
    for (let p = 1; p < np; p++) {
      const ref = refLp(c.lg, p - 1, c.ids[p]), got = L.token_logprobs[p];
      worst = Math.max(worst, Math.abs(got - ref.lp));
      n++;
      const d = choices[i].prompt_logprobs[p], e = d[String(c.ids[p])];
      shape &&= !!e && e.logprob === got; // (JavaScript orders integer keys: the server's order is not seen here)
      if (!ref.near) { rankN++; rankOk += e && e.rank === ref.rank; }
      // the dict: the prompt's token, and the most likely (rank 1)
      // its text holds its value, or a likelier token's of the same text
      const top = L.top_logprobs[p], vals = Object.values(top);
      shape &&= !!e && top[e.decoded_token] >= got && vals.length <= 2 && Object.values(d).some(x => x.rank === 1);
    }
    shape &&= L.tokens.join('') === choices[i].text && L.text_offset[np] === [...L.tokens.slice(0, np).join('')].length;
  }
  ok(shape, 'lm-eval: one entry per prompt token + the generated one, the first null, tokens add up to the text, ' +
     'text_offset in code points, prompt_logprobs beside (the prompt token first, with the top-1)');
  ok(worst < 2e-4 && n > 700, `prompt logprobs against the reference over ${n} positions: max |d| ${worst.toExponential(2)}`);
  ok(rankOk === rankN && rankN > 300, `ranks equal to the reference's at ${rankOk} / ${rankN} positions without near ties`);

  // the reference's greedy continuation: greedy there (lm-eval's is_greedy), and the logprobs the
  // server gives those tokens as it generates them
  const c2 = cases.find(c => c.ids.length === 40) || cases[1];
  const ctx = c2.ids, cont = c2.gt.slice(0, 12);
  const ll = await post(base, '/v1/completions', { ...lmBody, prompt: [ctx.concat(cont)] });
  const gen = await post(base, '/v1/completions', { model: 'tiny', prompt: [ctx], temperature: 0, max_tokens: 12, logprobs: 1, ignore_eos: true });
  const L = ll.json.choices[0].logprobs, G = gen.json.choices[0].logprobs;
  const part = L.token_logprobs.slice(ctx.length, -1), tops = L.top_logprobs.slice(ctx.length, -1);
  let greedy = true;
  for (const [j, lp] of part.entries()) if (lp !== Math.max(...Object.values(tops[j]))) greedy = false;
  let refWorst = 0;
  for (let j = 0; j < cont.length; j++) refWorst = Math.max(refWorst, Math.abs(part[j] - refLp(c2.gl, j, cont[j]).lp));
  ok(greedy && part.length === 12, 'the reference\'s greedy continuation is greedy in the prompt logprobs (lm-eval is_greedy)');
  ok(refWorst < 2e-4, `... its logprobs against the reference's greedy logits: max |d| ${refWorst.toExponential(2)}`);
  ok(JSON.stringify(part) === JSON.stringify(G.token_logprobs) && JSON.stringify(L.tokens.slice(ctx.length, -1)) === JSON.stringify(G.tokens),
     '... and equal, to the last digit, to the logprobs the server gives those tokens generating them');

  // a stop token generated (here a stop id made certain by logit_bias) keeps its entry: lm-eval's
  // [ctxlen:-1] still drops the generated token, not the last prompt token
  const st1 = await post(base, '/v1/completions', { ...lmBody, prompt: [ctx], stop_token_ids: [77], logit_bias: { 77: 100 } });
  const S1 = st1.json.choices[0];
  ok(S1.finish_reason === 'stop' && S1.logprobs.token_logprobs.length === ctx.length + 1 &&
     JSON.stringify(S1.logprobs.token_logprobs.slice(0, -1)) === JSON.stringify(ll.json.choices[0].logprobs.token_logprobs.slice(0, ctx.length)) &&
     S1.logprobs.tokens.at(-1) === '' && S1.logprobs.tokens.join('') === S1.text,
     `a stop token as the generated one: ${S1.logprobs.token_logprobs.length} entries for ${ctx.length} prompt tokens + 1, its text empty`);

  // texts that collide (byte tokens each decode to U+FFFD): the likelier token keeps the text, so a
  // position whose token is not the most likely is not greedy for lm-eval
  const S = [];
  for (let i = 0; i < V; i++) if ((await post(base, '/detokenize', { tokens: [i] })).json.prompt === '\ufffd') S.push(i);
  let x = 12345;
  const bytesPrompt = Array.from({ length: 300 }, () => S[(x = (x * 1103515245 + 12345) % 2147483648) % S.length]);
  const co = await post(base, '/v1/completions', { model: 'tiny', prompt: [bytesPrompt], max_tokens: 1, temperature: 0, echo: true, logprobs: 1, prompt_logprobs: 1 });
  const CL = co.json.choices[0].logprobs, CP = co.json.choices[0].prompt_logprobs;
  let coll = 0, collOk = 0;
  for (let p = 1; p < bytesPrompt.length; p++) {
    const ent = Object.entries(CP[p]), best = ent.find(([, e]) => e.rank === 1);
    if (!best || best[0] === String(bytesPrompt[p]) || best[1].decoded_token !== '\ufffd') continue;
    coll++; // the prompt's token and the most likely share the text
    collOk += CL.top_logprobs[p]['\ufffd'] === best[1].logprob && CL.token_logprobs[p] !== Math.max(...Object.values(CL.top_logprobs[p]));
  }
  ok(S.length > 50 && coll > 5 && collOk === coll, `colliding texts (${S.length} ids decode to U+FFFD): at ${collOk} / ${coll} positions the dict holds the most likely's value, not greedy`);

  // ---- a stream folds into the non-stream answer; the echo leads with the prompt's entries ----
  // (a text of ids below m3-tiny's 1,024)
  const sBody = { model: 'tiny', prompt: 'a b c d e f g h', temperature: 0, max_tokens: 6, logprobs: 3, echo: true };
  const ns = await post(base, '/v1/completions', sBody);
  const st = await stream(base, '/v1/completions', sBody);
  const fold = { text: '', tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const ev of st.events) {
    const ch = ev.choices[0];
    fold.text += ch.text;
    if (ch.logprobs) for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) fold[k].push(...ch.logprobs[k]);
  }
  const N = ns.json.choices[0], first = st.events[0].choices[0];
  ok(st.done && fold.text === N.text && JSON.stringify({ ...fold, text: undefined }) === JSON.stringify({ ...N.logprobs, text: undefined }),
     'stream: the chunks fold into the non-stream text and logprobs');
  ok(first.text === sBody.prompt && first.logprobs.tokens.length === ns.json.usage.prompt_tokens,
     `stream: the first chunk is the echo with its ${first.logprobs.tokens.length} prompt entries`);
  ok(Object.keys(N.logprobs.top_logprobs[3]).length >= 3 && Object.keys(N.logprobs.top_logprobs[3]).length <= 4,
     'logprobs 3: a prompt position lists its token and the 3 most likely');

  // ---- max_tokens 0 with echo: the prompt alone ----
  const z = await post(base, '/v1/completions', { ...sBody, max_tokens: 0 });
  const zs = await stream(base, '/v1/completions', { ...sBody, max_tokens: 0 });
  const zc = z.json.choices[0];
  ok(z.status === 200 && zc.text === sBody.prompt && zc.finish_reason === 'length' && z.json.usage.completion_tokens === 0 &&
     zc.logprobs.tokens.length === z.json.usage.prompt_tokens &&
     JSON.stringify(zc.logprobs.token_logprobs) === JSON.stringify(N.logprobs.token_logprobs.slice(0, z.json.usage.prompt_tokens)),
     'max_tokens 0 + echo: the prompt alone, its entries those of the answer with tokens, 0 completion tokens');
  const zt = zs.events.map(e => e.choices[0]);
  ok(zs.done && zt.map(c => c.text).join('') === sBody.prompt && zt.at(-1).finish_reason === 'length', 'max_tokens 0 + echo, streamed');
  const ze = await post(base, '/v1/completions', { model: 'tiny', prompt: 'a b c', max_tokens: 0, echo: true });
  ok(ze.status === 200 && ze.json.choices[0].text === 'a b c' && ze.json.choices[0].logprobs === null, 'max_tokens 0 + echo without logprobs');

  // ---- chat (a checkpoint whose vocabulary holds the chat template's tokens): a top-level list over the rendered prompt ----
  const msgs = [{ role: 'user', content: 'Name three colors.' }];
  const ch = await post(cbase, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 3, temperature: 0, prompt_logprobs: 2, n: 2 });
  const tk = await post(cbase, '/tokenize', { model: 'tiny', messages: msgs });
  const pl = ch.json.prompt_logprobs, ids = tk.json.tokens;
  let chOk = ch.status === 200 && Array.isArray(pl) && pl.length === ch.json.usage.prompt_tokens && pl[0] === null && ids.length === pl.length;
  for (let p = 1; chOk && p < pl.length; p++) chOk = String(ids[p]) in pl[p] && Object.keys(pl[p]).length <= 3;
  const viaCompl = await post(cbase, '/v1/completions', { model: 'tiny', prompt: [ids], max_tokens: 1, prompt_logprobs: 2 });
  ok(chOk && ch.json.choices.every(c => !('prompt_logprobs' in c)) &&
     JSON.stringify(viaCompl.json.choices[0].prompt_logprobs) === JSON.stringify(pl),
     `chat: prompt_logprobs over the ${pl?.length} rendered tokens, once for n = 2, equal to completions' for the same ids`);

  // ---- many at once beside generating requests: each equal to itself alone ----
  const bodies = [];
  for (let i = 0; i < 24; i++) {
    const c = cases[i % cases.length], cut = c.ids.slice(0, Math.max(2, Math.floor(c.ids.length * (0.4 + 0.05 * (i % 12)))));
    bodies.push(i % 3 === 2 ? { model: 'tiny', prompt: [cut], max_tokens: 10, temperature: 0.8, seed: i, logprobs: 2, ignore_eos: true }
                            : { model: 'tiny', prompt: [cut], max_tokens: 1 + (i % 4), temperature: 0, logprobs: 1 + (i % 5), echo: true, prompt_logprobs: i % 4 });
  }
  const alone = [];
  for (const b of bodies) alone.push((await post(base, '/v1/completions', b)).json);
  const together = await Promise.all(bodies.map(b => post(base, '/v1/completions', b)));
  const strip = j => JSON.stringify(j.choices);
  const same = together.filter((r, i) => r.status === 200 && strip(r.json) === strip(alone[i])).length;
  ok(same === bodies.length, `24 requests at once (16 with prompt logprobs): ${same} equal to alone`);

  // ---- the official client ----
  const sdk = await client.completions.create({ model: 'tiny', prompt: 'a b c d', max_tokens: 2, temperature: 0, echo: true, logprobs: 2, prompt_logprobs: 1 });
  ok(sdk.choices[0].logprobs.token_logprobs[0] === null && sdk.choices[0].logprobs.tokens.length === sdk.usage.prompt_tokens + 2 &&
     sdk.choices[0].prompt_logprobs.length === sdk.usage.prompt_tokens, 'the openai client: echo + logprobs, prompt_logprobs via an extra field');

  // ---- errors ----
  const bad = [
    [{ prompt: 'x', prompt_logprobs: -1 }, 'prompt_logprobs', /greater than max allowed: 20/],
    [{ prompt: 'x', prompt_logprobs: 21 }, 'prompt_logprobs', /21, which is greater than max allowed: 20/],
    [{ prompt: 'x', prompt_logprobs: -3 }, 'prompt_logprobs', /non-negative/],
    [{ prompt: 'x', prompt_logprobs: '2' }, 'prompt_logprobs', /integer/],
    [{ prompt: 'x', prompt_logprobs: 1, stream: true }, 'prompt_logprobs', /stream/],
    [{ prompt: 'x', max_tokens: 0 }, 'max_tokens', /at least 1/],
    [{ prompt: 'x', echo: true, logprobs: 21 }, 'logprobs', /\[0, 20\]/],
  ];
  for (const [b, param, re] of bad) {
    const r = await post(base, '/v1/completions', { model: 'tiny', ...b });
    ok(r.status === 400 && r.json?.error?.param === param && re.test(r.json.error.message), `400 for ${JSON.stringify(b)}: ${r.json?.error?.message}`);
  }
  const cz = await post(cbase, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 0 });
  ok(cz.status === 400 && cz.json.error.param === 'max_tokens', 'chat max_tokens 0: 400');
  const alive = await post(base, '/v1/completions', lmBody);
  ok(alive.status === 200 && strip(alive.json) === strip(lm.json), 'after all of it: the first request again, the same answer');

  // the prompt rows as whole logits rows on the host (a TP group's path; -tp 2 runs it everywhere)
  // in chunks of --max-logits-rows 200 rows: the same answers
  const wide = await startServer(m3, ck, ['--served-model-name', 'tiny', '--kv-cache-dtype', 'f32', '--kv-cache-memory', '268435456', '--max-logits-rows', '200'],
    { env: { M3_PROMPT_LOGPROBS: 'host' } });
  const w = await post(wide.base, '/v1/completions', lmBody);
  const wm = await (await fetch(wide.base + '/metrics')).text();
  const steps = t => Number((/^m3_engine_steps_total (\d+)/m.exec(t) || [])[1]);
  ok(w.status === 200 && strip(w.json) === strip(lm.json), `host rows, --max-logits-rows 200: the lm-eval batch's answer equal (${steps(wm)} engine steps)`);
  const ws = await wide.stop();
  ok(ws.code === 0, `the --max-logits-rows server stopped cleanly in ${ws.ms} ms`);
} catch (e) {
  ok(false, 'exception: ' + (e.stack || e));
}
for (const x of [srv, csrv]) {
  const stop = await x.stop();
  ok(stop.code === 0, `server stopped cleanly (${stop.code ?? stop.signal})`);
}
console.log(`server_prompt_logprobs: ${R.failed ? R.failed + ' FAILED' : 'all passed'} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(R.failed ? 1 : 0);
