// Soak benchmark for m3 serve (issue 9), loopback only: N clients send, back to back for a fixed
// time, a random mix of good requests (completions and chat, stream and not), bad requests (bad
// JSON, types, ranges, unknown model, invalid UTF-8, oversized bodies), cancellations (a stream
// aborted after a few events, a socket closed mid-request) and long prompts. It reports requests
// served, outcomes by kind, latency percentiles and the server's resident memory over time, and
// fails (exit 1) on a crash, a lost request (no answer, a malformed answer, an unexpected status),
// KV blocks or requests left behind, or memory that keeps growing.
//
// usage: node bench/soak.mjs <m3-binary> <work-dir> [--seconds 600] [--clients 32] [--seed 1] [--kv-mib 32]
//                            [--rss-check 1] [--checkpoint DIR] [--json OUT.json] [-- extra m3 serve args]
// --rss-check 0 reports memory without judging it (sanitizer builds: ASan's quarantine of freed
// memory grows the resident size by design; LeakSanitizer checks leaks there).
// The KV pool is small (--kv-mib) so that the warm-up (the first fifth of the run) touches all of
// it: the pool is reserved up front and only shows in the resident size as its pages are first
// used, which would otherwise read as growth. A pool this size also preempts under long prompts.
import fs from 'node:fs';
import net from 'node:net';
import { makeCheckpoint, startServer, post, stream, metrics, sleep } from '../tests/server/lib.mjs';

const argv = process.argv.slice(2);
const [m3, work] = argv;
if (!m3 || !work) { console.error('usage: node bench/soak.mjs <m3-binary> <work-dir> [--seconds S] [--clients N] [--seed K] [--checkpoint DIR] [--json OUT]'); process.exit(2); }
const opt = (name, d) => { const i = argv.indexOf('--' + name); return i > 0 ? argv[i + 1] : d; };
const SECONDS = Number(opt('seconds', 600)), CLIENTS = Number(opt('clients', 32)), SEED = Number(opt('seed', 1));
const KV_MIB = Number(opt('kv-mib', 32)), RSS_CHECK = opt('rss-check', '1') !== '0';
const dd = argv.indexOf('--');
const extra = dd > 0 ? argv.slice(dd + 1) : [];
const MAX_BODY = 200000, CONTEXT = 1024;

let rs = (SEED * 2654435761) >>> 0 || 1;
const rnd = () => { rs ^= rs << 13; rs >>>= 0; rs ^= rs >>> 17; rs ^= rs << 5; rs >>>= 0; return rs / 4294967296; };
const pick = a => a[Math.floor(rnd() * a.length)];
const words = 'the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches near a frozen lake'.split(' ');
const text = n => Array.from({ length: n }, () => pick(words)).join(' ');

const ck = opt('checkpoint') || makeCheckpoint(m3, work + '/ck');
const srv = await startServer(m3, ck, ['--max-model-len', String(CONTEXT), '--max-body', String(MAX_BODY), '--max-num-seqs', '32',
  '--disable-log-requests', '--timeout', '30', '--kv-cache-memory', String(KV_MIB << 20), ...extra]);
const rssKB = () => { try { return Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8'))[1]); } catch { return -1; } };
const errShape = (j, code) => !!(j && j.error && typeof j.error.message === 'string' && j.error.code === code);

// ---- the mix: [kind, weight, run() -> {outcome: 'ok' | 'expected_error' | problem string, ms}]
const good = (route, body) => async () => {
  const r = await post(srv.base, route, body);
  if (r.status !== 200) return `status ${r.status}: ${r.text.slice(0, 120)}`;
  const j = r.json;
  if (!j || !Array.isArray(j.choices) || j.choices.length !== (body.n || 1) || !j.usage) return 'malformed body';
  return 'ok';
};
const goodStream = (route, body) => async () => {
  const r = await stream(srv.base, route, { ...body, stream_options: { include_usage: true } });
  if (r.status !== 200) return `status ${r.status}: ${r.raw.slice(0, 120)}`;
  if (!r.done || r.bad.length) return `stream: done ${r.done}, ${r.bad.length} malformed events`;
  const fins = r.events.filter(e => e.choices && e.choices[0] && e.choices[0].finish_reason).length;
  if (fins !== (body.n || 1) || !r.events[r.events.length - 1].usage) return `stream: ${fins} finish events, usage ${!!r.events[r.events.length - 1].usage}`;
  return 'ok';
};
const bad = (route, body, code) => async () => {
  const r = await post(srv.base, route, body);
  if (r.status === code && errShape(r.json, code)) return 'expected_error';
  return `wanted ${code}, got ${r.status}: ${r.text.slice(0, 120)}`;
};
const abortStream = (route, body) => async () => {
  const ac = new AbortController();
  const k = 1 + Math.floor(rnd() * 6);
  let seen = 0;
  try {
    const r = await stream(srv.base, route, body, { signal: ac.signal, onEvent: () => { if (++seen === k) ac.abort(); } });
    if (r.status !== 200) return `status ${r.status}`;
    return r.done ? 'ok' : 'stream ended without [DONE] before the abort';
  } catch (e) { return e.name === 'AbortError' ? 'cancelled' : `error ${e.message}`; }
};
const closeMidRequest = () => new Promise(res => {
  const b = Buffer.from(JSON.stringify({ prompt: text(20), max_tokens: 50, stream: rnd() < 0.5 }));
  const s = net.connect(srv.port, '127.0.0.1', () => {
    const cut = rnd() < 0.5 ? Math.floor(b.length / 2) : b.length;
    s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${b.length}\r\n\r\n`);
    s.write(b.subarray(0, cut));
    setTimeout(() => { s.destroy(); res('cancelled'); }, 20 + Math.floor(rnd() * 200));
  });
  s.on('error', () => res('cancelled'));
});
const sometimes = () => rnd() < 0.3 ? { temperature: 0.8, top_p: 0.95, seed: Math.floor(rnd() * 1e6) } : { temperature: 0 };
const msgs = () => [{ role: 'user', content: text(3 + Math.floor(rnd() * 30)) }];
const mix = [
  ['completion', 20, () => good('/v1/completions', { prompt: text(2 + Math.floor(rnd() * 40)), max_tokens: 4 + Math.floor(rnd() * 28), ...sometimes() })()],
  ['chat', 15, () => good('/v1/chat/completions', { messages: msgs(), max_tokens: 4 + Math.floor(rnd() * 28), chat_template_kwargs: { thinking_mode: pick(['enabled', 'disabled']) }, ...sometimes() })()],
  ['completion_n_logprobs', 5, () => good('/v1/completions', { prompt: text(10), max_tokens: 8, n: 2 + Math.floor(rnd() * 3), logprobs: 3, ...sometimes() })()],
  ['stream_completion', 12, () => goodStream('/v1/completions', { prompt: text(2 + Math.floor(rnd() * 40)), max_tokens: 4 + Math.floor(rnd() * 40), ...sometimes() })()],
  ['stream_chat', 12, () => goodStream('/v1/chat/completions', { messages: msgs(), max_tokens: 4 + Math.floor(rnd() * 40), logprobs: rnd() < 0.3, ...sometimes() })()],
  ['long_prompt', 8, () => (rnd() < 0.5 ? good : goodStream)('/v1/completions', { prompt: text(500 + Math.floor(rnd() * 300)), max_tokens: 4 + Math.floor(rnd() * 12) })()],
  ['cancel_stream', 8, () => abortStream(pick(['/v1/completions', '/v1/chat/completions']), { prompt: text(10), messages: msgs(), max_tokens: 200, ignore_eos: true })()],
  ['cancel_socket', 4, closeMidRequest],
  ['bad_json', 3, () => bad('/v1/completions', '{"prompt": "x", ', 400)()],
  ['bad_type', 3, () => bad('/v1/completions', { prompt: 'x', max_tokens: pick(['ten', -1, 1.5, true]) }, 400)()],
  ['bad_range', 3, () => bad('/v1/chat/completions', { messages: msgs(), temperature: 5 }, 400)()],
  ['unknown_model', 2, () => bad('/v1/completions', { model: 'nope', prompt: 'x' }, 404)()],
  ['invalid_utf8', 2, () => bad('/v1/completions', Buffer.concat([Buffer.from('{"prompt": "a'), Buffer.from([0xff, 0xc3]), Buffer.from('"}')]), 400)()],
  ['too_long', 2, () => bad('/v1/completions', { prompt: text(700), max_tokens: CONTEXT }, 400)()],
  ['oversized_body', 1, () => bad('/v1/completions', { prompt: 'x'.repeat(MAX_BODY + 1000) }, 413)()],
  ['small_endpoints', 3, async () => {
    const r = await post(srv.base, '/tokenize', { prompt: text(8) });
    const d = r.status === 200 ? await post(srv.base, '/detokenize', { tokens: r.json.tokens }) : r;
    const h = await fetch(srv.base + '/health');
    return r.status === 200 && d.status === 200 && h.status === 200 ? 'ok' : `tokenize ${r.status} detokenize ${d.status} health ${h.status}`;
  }],
];
const totalW = mix.reduce((a, m) => a + m[1], 0);
const choose = () => { let x = rnd() * totalW; for (const m of mix) if ((x -= m[1]) < 0) return m; return mix[0]; };

const stats = {}; // kind -> {n, ok, expected_error, cancelled, problems, lat: []}
const problems = [];
const rss = [];
const t0 = Date.now(), tEnd = t0 + SECONDS * 1000;
const rss0 = rssKB();
let sampler = setInterval(() => rss.push([Math.round((Date.now() - t0) / 1000), rssKB()]), 5000);

async function client() {
  while (Date.now() < tEnd) {
    const [kind, , run] = choose();
    const st = stats[kind] || (stats[kind] = { n: 0, ok: 0, expected_error: 0, cancelled: 0, problems: 0, lat: [] });
    const t = Date.now();
    let out;
    try { out = await run(); } catch (e) { out = `exception ${e.message}`; }
    const ms = Date.now() - t;
    st.n++;
    if (out === 'ok') { st.ok++; st.lat.push(ms); }
    else if (out === 'expected_error') { st.expected_error++; st.lat.push(ms); }
    else if (out === 'cancelled') st.cancelled++;
    else { st.problems++; if (problems.length < 20) problems.push(`${kind}: ${out}`); }
    if (srv.proc.exitCode !== null || srv.proc.signalCode !== null) return;
  }
}
await Promise.all(Array.from({ length: CLIENTS }, client));
clearInterval(sampler);
const crashed = srv.proc.exitCode !== null || srv.proc.signalCode !== null;

// settle: KV blocks, sequences and requests in flight back to 0
let m = {}, settled = false;
for (let i = 0; !crashed && i < 300; i++) {
  m = await metrics(srv.base);
  if (m.m3_kv_blocks_used === 0 && m.m3_num_requests_running === 0 && m.m3_num_requests_waiting === 0 && m.m3_http_requests_in_flight === 0) { settled = true; break; }
  await sleep(100);
}
const rssEnd = rssKB();
const ex = await srv.stop('SIGTERM');

const pct = (a, p) => { if (!a.length) return 0; const s = [...a].sort((x, y) => x - y); return s[Math.min(s.length - 1, Math.floor(p / 100 * s.length))]; };
const all = Object.values(stats);
const sum = k => all.reduce((a, s) => a + s[k], 0);
const goodLat = Object.entries(stats).filter(([k]) => !/^bad|unknown|invalid|too_long|oversized|cancel/.test(k)).flatMap(([, s]) => s.lat);
// memory: after the first fifth of the run (allocator arenas and caches warm) against the end
const warm = rss.find(([t]) => t >= SECONDS / 5) || rss[0] || [0, rss0];
const rssMax = Math.max(...rss.map(x => x[1]), rssEnd);
const grew = rssEnd - warm[1];
const flat = !RSS_CHECK || grew <= Math.max(16 * 1024, warm[1] * 0.1);
const summary = {
  seconds: SECONDS, clients: CLIENTS, seed: SEED, kv_mib: KV_MIB, requests: sum('n'), ok: sum('ok'), expected_errors: sum('expected_error'),
  cancelled: sum('cancelled'), problems: sum('problems'), crashed, exit: ex.code, settled,
  latency_ms_good: { p50: pct(goodLat, 50), p99: pct(goodLat, 99), max: pct(goodLat, 100) },
  rss_kb: { start: rss0, after_warmup: warm[1], end: rssEnd, max: rssMax, growth_after_warmup: grew },
  server: { generation_tokens: m.m3_generation_tokens_total, prompt_tokens: m.m3_prompt_tokens_total, preemptions: m.m3_preemptions_total,
    http: Object.fromEntries(Object.entries(m).filter(([k]) => k.startsWith('m3_http_responses_total')).map(([k, v]) => [k.replace(/.*code="(\d+)".*/, '$1'), v])),
    finished: Object.fromEntries(Object.entries(m).filter(([k]) => k.startsWith('m3_requests_finished_total')).map(([k, v]) => [k.replace(/.*reason="(\w+)".*/, '$1'), v])) },
  by_kind: Object.fromEntries(Object.entries(stats).map(([k, s]) => [k, { n: s.n, ok: s.ok, expected_error: s.expected_error, cancelled: s.cancelled, problems: s.problems, p50_ms: pct(s.lat, 50), p99_ms: pct(s.lat, 99) }])),
  rss_series: rss,
};
console.log(`soak: ${SECONDS} s, ${CLIENTS} clients: ${summary.requests} requests (${(summary.requests / SECONDS).toFixed(1)}/s): ${summary.ok} ok, ${summary.expected_errors} expected errors, ${summary.cancelled} cancelled by the client, ${summary.problems} problems`);
console.log('kind                      n      ok  4xx ok  cancel  problems  p50 ms  p99 ms');
for (const [k, s] of Object.entries(summary.by_kind).sort()) console.log(`${k.padEnd(22)} ${String(s.n).padStart(6)} ${String(s.ok).padStart(7)} ${String(s.expected_error).padStart(7)} ${String(s.cancelled).padStart(7)} ${String(s.problems).padStart(9)} ${String(s.p50_ms).padStart(7)} ${String(s.p99_ms).padStart(7)}`);
console.log(`latency of good requests: p50 ${summary.latency_ms_good.p50} ms, p99 ${summary.latency_ms_good.p99} ms, max ${summary.latency_ms_good.max} ms`);
console.log(`server RSS: start ${(rss0 / 1024).toFixed(1)} MiB, after warm-up (${warm[0]} s) ${(warm[1] / 1024).toFixed(1)} MiB, end ${(rssEnd / 1024).toFixed(1)} MiB, max ${(rssMax / 1024).toFixed(1)} MiB: ${!RSS_CHECK ? 'not judged' : flat ? 'flat' : 'GROWING'}`);
console.log(`server: ${summary.server.generation_tokens} tokens generated, ${summary.server.preemptions} preemptions, HTTP ${JSON.stringify(summary.server.http)}, finished ${JSON.stringify(summary.server.finished)}`);
console.log(`crashed: ${crashed}; exit code ${ex.code}; KV blocks, sequences and requests in flight back to 0: ${settled}`);
for (const p of problems) console.log('problem: ' + p);
if (opt('json')) fs.writeFileSync(opt('json'), JSON.stringify(summary, null, 1));
const fail = crashed || ex.code !== 0 || !settled || summary.problems > 0 || !flat;
if (fail) console.log(srv.log.split('\n').slice(-30).join('\n'));
console.log(fail ? 'soak FAILED' : 'soak passed');
process.exit(fail ? 1 : 0);
