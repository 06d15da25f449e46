// m3 serve under load: 64 concurrent streaming clients, several requests each, mixed prompts
// (completions and chat, greedy and seeded sampling, different lengths). Every response must
// be complete and well-formed, and each request's output equal to what it gives alone (the
// engine's batch invariance, seen through the server).
// Usage: node tests/server/server_load.mjs <m3-binary> <work-dir> [clients] [requests-per-client]
import { makeCheckpoint, startServer, stream, metrics, reporter } from './lib.mjs';

const [m3, work, nClientsArg, perClientArg] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_load.mjs <m3-binary> <work-dir> [clients] [requests-per-client]'); process.exit(2); }
const CLIENTS = Number(nClientsArg || 64), PER = Number(perClientArg || 3);
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
const srv = await startServer(m3, ck, ['--max-num-seqs', '64', '--disable-log-requests']);

const words = 'the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches'.split(' ');
const text = (i, n) => Array.from({ length: n }, (_, k) => words[(i * 7 + k * 3) % words.length]).join(' ');
// 24 distinct requests: prompt lengths 1..~60 tokens, 2..6 tokens out
const specs = [];
for (let i = 0; i < 24; i++) {
  const chat = i % 3 === 0;
  const sampling = i % 4 === 1 ? { temperature: 0.8, top_p: 0.95, seed: 1000 + i } : { temperature: 0 };
  const body = chat
    ? { messages: [{ role: 'user', content: text(i, 1 + (i * 5) % 40) }], chat_template_kwargs: { thinking_mode: i % 2 ? 'disabled' : 'enabled' } }
    : { prompt: text(i, 1 + (i * 11) % 60) };
  specs.push({ route: chat ? '/v1/chat/completions' : '/v1/completions', chat, body: { ...body, ...sampling, max_tokens: 2 + i % 5, stream_options: { include_usage: true } } });
}

// one streamed response -> {text, problems[]}
function check(spec, res) {
  const problems = [];
  if (res.status !== 200) problems.push('status ' + res.status);
  if (!res.done) problems.push('no [DONE]');
  if (res.bad.length) problems.push('malformed events: ' + res.bad.length);
  const ids = new Set(res.events.map(e => e.id));
  if (ids.size !== 1) problems.push('ids: ' + [...ids].join(','));
  let out = '', fins = 0, usage = null, n = 0;
  for (const e of res.events) {
    if (e.object !== (spec.chat ? 'chat.completion.chunk' : 'text_completion')) problems.push('object ' + e.object);
    if (e.usage) { usage = e.usage; continue; }
    if (e.choices.length !== 1 || e.choices[0].index !== 0) problems.push('choices');
    const c = e.choices[0];
    if (spec.chat) out += (c.delta.reasoning_content || '') + (c.delta.content || '');
    else out += c.text;
    if (c.finish_reason) { fins++; if (!['length', 'stop'].includes(c.finish_reason)) problems.push('finish ' + c.finish_reason); }
    n++;
  }
  if (fins !== 1) problems.push('finish chunks: ' + fins);
  if (!usage || usage.completion_tokens < 1 || usage.completion_tokens > spec.body.max_tokens) problems.push('usage');
  if (res.events.length && res.events[res.events.length - 1] !== res.events.find(e => e.usage)) problems.push('usage not last');
  return { text: out, usage, problems, n };
}

try {
  // alone, one at a time
  const alone = [];
  for (const s of specs) {
    const r = check(s, await stream(srv.base, s.route, s.body));
    alone.push(r);
    if (r.problems.length) ok(false, 'alone: ' + r.problems.join('; '));
  }
  ok(alone.every(r => !r.problems.length), `${specs.length} distinct requests alone: well-formed`);
  // all together
  const t0 = Date.now();
  let peakRunning = 0, done = false;
  // (polled until more than 8 are seen running at once, a state; 5 ms between reads is pacing only)
  const watch = (async () => { while (!done && peakRunning <= 8) { const m = await metrics(srv.base); peakRunning = Math.max(peakRunning, m.m3_num_requests_running); await new Promise(r => setTimeout(r, 5)); } })();
  const results = await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    const mine = [];
    for (let j = 0; j < PER; j++) {
      const k = (c * PER + j) % specs.length;
      mine.push({ k, r: check(specs[k], await stream(srv.base, specs[k].route, specs[k].body)) });
    }
    return mine;
  }));
  done = true;
  await watch;
  const secs = (Date.now() - t0) / 1000;
  const flat = results.flat();
  const bad = flat.filter(x => x.r.problems.length);
  const diff = flat.filter(x => x.r.text !== alone[x.k].text || x.r.usage.completion_tokens !== alone[x.k].usage.completion_tokens);
  for (const x of bad.slice(0, 5)) console.log('  request', x.k, x.r.problems.join('; '));
  for (const x of diff.slice(0, 5)) console.log('  request', x.k, JSON.stringify(x.r.text), '!=', JSON.stringify(alone[x.k].text));
  const toks = flat.reduce((a, x) => a + (x.r.usage ? x.r.usage.completion_tokens : 0), 0);
  ok(flat.length === CLIENTS * PER && bad.length === 0, `${CLIENTS} concurrent clients x ${PER} streams: all ${flat.length} complete and well-formed (${secs.toFixed(1)} s, ${toks} tokens, ${peakRunning} seen running at once)`);
  ok(diff.length === 0, 'every output equals the same request alone (greedy and seeded)');
  ok(peakRunning > 8, 'requests really ran batched together');
  // the streams have all ended; the engine and the HTTP layer let their requests go just after
  // (a state to wait for: a hung server's limit, 120 s)
  const idle = x => x.m3_num_requests_running === 0 && x.m3_num_requests_waiting === 0 && x.m3_kv_blocks_used === 0 && x.m3_http_requests_in_flight === 0;
  let m = await metrics(srv.base);
  for (const t1 = Date.now(); !idle(m) && Date.now() - t1 < 120000; m = await metrics(srv.base)) await new Promise(r => setTimeout(r, 10));
  ok(m.m3_num_requests_running === 0 && m.m3_num_requests_waiting === 0 && m.m3_kv_blocks_used === 0 && m.m3_http_requests_in_flight === 0, 'afterwards: nothing running or waiting, no KV blocks held');
  ok(m['m3_http_responses_total{code="200"}'] >= specs.length + flat.length && m.m3_time_to_first_token_seconds_count >= flat.length && m.m3_inter_token_latency_seconds_count > 0, '/metrics counted the requests and their latencies');
  // the same numbers under vLLM's names (vllm:..., label model_name): what a vLLM dashboard queries
  const text = await (await fetch(srv.base + '/metrics')).text();
  const mn = /^m3_model_info\{model_name="((?:[^"\\]|\\.)*)"\} 1$/m.exec(text)?.[1];
  const v = (name, more = '') => m[`vllm:${name}{${more}model_name="${mn}"}`];
  const fin = r => m[`m3_requests_finished_total{finish_reason="${r}"}`];
  const same = [
    [v('num_requests_running'), m.m3_num_requests_running], [v('num_requests_waiting'), m.m3_num_requests_waiting],
    [v('kv_cache_usage_perc'), m.m3_kv_cache_usage_ratio], [v('gpu_cache_usage_perc'), m.m3_kv_cache_usage_ratio],
    [v('prompt_tokens_total'), m.m3_prompt_tokens_total], [v('generation_tokens_total'), m.m3_generation_tokens_total],
    [v('prefix_cache_hits_total'), m.m3_prefix_cache_hit_tokens_total], [v('num_preemptions_total'), m.m3_preemptions_total],
    [v('request_success_total', 'finished_reason="stop",'), fin('stop')], [v('request_success_total', 'finished_reason="length",'), fin('length')],
    [v('time_to_first_token_seconds_count'), m.m3_time_to_first_token_seconds_count],
    [v('inter_token_latency_seconds_count'), m.m3_inter_token_latency_seconds_count],
    [v('time_per_output_token_seconds_count'), m.m3_inter_token_latency_seconds_count],
    [v('e2e_request_latency_seconds_count'), m.m3_e2e_request_latency_seconds_count],
    [v('time_to_first_token_seconds_bucket', 'le="+Inf",'), m.m3_time_to_first_token_seconds_count]];
  const lines = text.split('\n').filter(l => l && !l.startsWith('#'));
  const sampleRe = /^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? -?[0-9.e+Inf-]+$/;
  const typed = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map(x => x[1]));
  const untyped = lines.map(l => l.split(/[{ ]/)[0].replace(/_(bucket|sum|count)$/, '')).filter(n => !typed.has(n) && !typed.has(n + '_bucket'));
  // (no preemption here: every request admitted once, so the queries are its prompt tokens exactly)
  ok(mn && same.every(([a, b]) => Number.isFinite(a) && a === b) && m.m3_preemptions_total === 0 &&
     v('prefix_cache_queries_total') === m.m3_prompt_tokens_total && v('prefix_cache_hits_total') > 0 &&
     v('prompt_tokens_total') > 0 && lines.every(l => sampleRe.test(l)) && !untyped.length,
     `vLLM's metric names carry the same numbers (${same.length} compared, model_name="${mn}"; prefix cache ${v('prefix_cache_hits_total')} hits of ` +
     `${v('prefix_cache_queries_total')} tokens); every sample line well-formed and typed` +
     (same.some(([a, b]) => a !== b) ? ` MISMATCH ${JSON.stringify(same)}` : '') + (untyped.length ? ` untyped: ${untyped.slice(0, 3)}` : ''));
} catch (e) { R.failed++; console.log('FAIL exception: ' + (e.stack || e)); }
const e = await srv.stop('SIGTERM');
ok(e.code === 0, 'server exits 0');
if (R.failed) console.log(srv.log);
console.log(R.failed ? `${R.failed} FAILED` : 'all passed');
process.exit(R.failed ? 1 : 0);
