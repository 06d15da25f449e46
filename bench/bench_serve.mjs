// Load benchmark for m3 serve (a benchmark, not a test: it prints numbers and asserts nothing).
//
//   node bench/bench_serve.mjs --m3 build/m3 --model DIR [--make-tiny] [options]   # starts a server
//   node bench/bench_serve.mjs --url http://127.0.0.1:8000 [options]              # targets a running one
//
// Options: --concurrency 1,4,16,64   clients sending requests back to back at each level
//          --requests N              requests per level (default: max(8, 2 x concurrency))
//          --max-tokens N            tokens generated per request (default 32; ignore_eos, so exact)
//          --prompt-words N          words per prompt (default 24; every request has its own prompt)
//          --server-args "..."       extra `m3 serve` arguments (default "--max-num-seqs 64")
//          --make-tiny               first write a tiny checkpoint into --model DIR (m3 make-tiny
//                                    --tokenizer with the qwen3 tokenizer from node_modules)
//
// Every request is a streaming /v1/completions call (temperature 0). Measured on the client:
// TTFT = request sent -> first token; ITL = gaps between the following tokens (one SSE event
// per token); throughput = generated tokens (from the usage chunk) / wall time of the level.
// The server's own view (its /metrics histograms, measured as tokens reach the HTTP thread) is
// printed beside it as means over the level.
import os from 'node:os';
import { makeCheckpoint, startServer, metrics } from '../tests/server/lib.mjs';

const args = process.argv.slice(2);
const opt = (k, d) => { const i = args.indexOf('--' + k); return i >= 0 ? args[i + 1] : d; };
const flag = k => args.includes('--' + k);
const levels = opt('concurrency', '1,4,16,64').split(',').map(Number);
const maxTokens = Number(opt('max-tokens', 32)), promptWords = Number(opt('prompt-words', 24));
let base = opt('url'), srv = null;
if (!base) {
  const m3 = opt('m3'), model = opt('model');
  if (!m3 || !model) { console.error('usage: node bench/bench_serve.mjs --m3 BIN --model DIR [--make-tiny] | --url URL  [--concurrency 1,4,16,64] [--requests N] [--max-tokens N]'); process.exit(2); }
  if (flag('make-tiny')) makeCheckpoint(m3, model);
  srv = await startServer(m3, model, opt('server-args', '--max-num-seqs 64').split(' ').filter(Boolean).concat(['--disable-log-requests']));
  base = srv.base;
}

// a deterministic pseudo-random word list, so runs are comparable
let seed = 12345;
const rnd = () => (seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648;
const vocab = 'alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu river stone cloud maple winter summer'.split(' ');
const prompt = () => Array.from({ length: promptWords }, () => vocab[Math.floor(rnd() * vocab.length)]).join(' ');

async function one() {
  const t0 = performance.now();
  const r = await fetch(base + '/v1/completions', {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: prompt(), max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
  });
  if (r.status !== 200) throw new Error('HTTP ' + r.status + ': ' + await r.text());
  const dec = new TextDecoder();
  let buf = '', ttft = -1, last = 0, tokens = 0;
  const itl = [];
  for await (const piece of r.body) {
    const now = performance.now();
    buf += dec.decode(piece, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const line = buf.slice(0, i); buf = buf.slice(i + 2);
      if (line.startsWith(':')) continue; // an SSE comment (keep-alive)
      const ev = line.slice(6);
      if (ev === '[DONE]') continue;
      const j = JSON.parse(ev);
      if (j.usage) { tokens = j.usage.completion_tokens; continue; }
      if (!j.choices[0].text) continue;
      if (ttft < 0) ttft = now - t0; else itl.push(now - last);
      last = now;
    }
  }
  return { ttft, itl, e2e: performance.now() - t0, tokens };
}

const pct = (a, p) => { if (!a.length) return NaN; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; };
const f = x => Number.isFinite(x) ? x.toFixed(1) : '-';

await one(); // warm-up (page-in, first allocations)
console.log(`# m3 serve load: ${base}, max_tokens ${maxTokens}, prompt ${promptWords} words, node ${process.version}, ${os.cpus().length} CPUs (${os.cpus()[0].model})`);
console.log('| concurrency | requests | seconds | requests/s | output tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | e2e p50 ms | server TTFT mean ms | server ITL mean ms |');
console.log('|---|---|---|---|---|---|---|---|---|---|---|---|');
const mean = (a, b, k) => (b[k + '_sum'] - a[k + '_sum']) / (b[k + '_count'] - a[k + '_count']) * 1000;
for (const c of levels) {
  const n = Number(opt('requests', Math.max(8, 2 * c)));
  let next = 0;
  const res = [], m0 = await metrics(base);
  const t0 = performance.now();
  await Promise.all(Array.from({ length: c }, async () => { while (next < n) { next++; res.push(await one()); } }));
  const secs = (performance.now() - t0) / 1000;
  const m1 = await metrics(base);
  const toks = res.reduce((a, r) => a + r.tokens, 0);
  const ttft = res.map(r => r.ttft), itl = res.flatMap(r => r.itl), e2e = res.map(r => r.e2e);
  console.log(`| ${c} | ${n} | ${secs.toFixed(2)} | ${(n / secs).toFixed(2)} | ${(toks / secs).toFixed(1)} | ${f(pct(ttft, 50))} | ${f(pct(ttft, 99))} | ${f(pct(itl, 50))} | ${f(pct(itl, 99))} | ${f(pct(e2e, 50))} | ${f(mean(m0, m1, 'm3_time_to_first_token_seconds'))} | ${f(mean(m0, m1, 'm3_inter_token_latency_seconds'))} |`);
}
if (srv) {
  const e = await srv.stop('SIGTERM');
  if (e.code !== 0) { console.error(srv.log); process.exit(1); }
}
