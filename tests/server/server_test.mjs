// m3 serve against the official openai client: the API features.
// Usage: node tests/server/server_test.mjs <m3-binary> <work-dir>
// Writes a tiny checkpoint with `m3 make-tiny --tokenizer` (qwen3 tokenizer + MiniMax-M3 chat
// tokens) into <work-dir>, starts `m3 serve` on a free port with an API key.
import OpenAI from 'openai';
import { makeCheckpoint, startServer, post, stream, reporter } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_test.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const ck = makeCheckpoint(m3, work + '/ck');
const KEY = 'sk-test-123';
const srv = await startServer(m3, ck, ['--api-key', KEY, '--served-model-name', 'tiny']);
const base = srv.base, auth = { Authorization: 'Bearer ' + KEY };
const client = new OpenAI({ baseURL: base + '/v1', apiKey: KEY });
const tokenize = async body => (await post(base, '/tokenize', body, auth)).json;
const maxOf = o => Math.max(...Object.values(o));
try {
  ok((await (await fetch(base + '/health')).json()).status === 'ok', '/health (no key needed)');
  const models = await client.models.list();
  ok(models.data.length === 1 && models.data[0].id === 'tiny' && models.data[0].max_model_len > 0, '/v1/models');

  // ---- completions
  const c1 = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 8, temperature: 0 });
  ok(c1.choices[0].finish_reason === 'length' && c1.usage.completion_tokens === 8 && c1.usage.prompt_tokens === 2 &&
     c1.usage.total_tokens === 10 && c1.object === 'text_completion', 'completions non-stream, usage');
  const c2 = await client.completions.create({ model: 'tiny', prompt: [1, 2, 3, 4], max_tokens: 4, temperature: 0 });
  ok(c2.usage.prompt_tokens === 4 && typeof c2.choices[0].text === 'string', 'completions with a token-id prompt');
  let text = '', usage = null, fin = null;
  for await (const ch of await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
    if (ch.choices.length) { text += ch.choices[0].text; if (ch.choices[0].finish_reason) fin = ch.choices[0].finish_reason; }
    if (ch.usage) usage = ch.usage;
  }
  ok(text === c1.choices[0].text && fin === 'length' && usage && usage.completion_tokens === 8, 'completions stream equals non-stream (greedy), usage chunk');
  const ce = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 8, temperature: 0, echo: true });
  ok(ce.choices[0].text === 'Hello world' + c1.choices[0].text, 'echo prepends the prompt');

  // ---- logprobs (completions): greedy picks the argmax, token texts concatenate to the text
  const lp = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 8, temperature: 0, logprobs: 5 });
  const L = lp.choices[0].logprobs;
  ok(L && L.tokens.length === 8 && L.token_logprobs.length === 8 && L.top_logprobs.length === 8 && L.text_offset.length === 8, 'completions logprobs: one entry per token');
  ok(L.tokens.join('') === lp.choices[0].text && lp.choices[0].text === c1.choices[0].text, 'completions logprobs: token texts concatenate to the text');
  ok(L.token_logprobs.every((v, i) => v === maxOf(L.top_logprobs[i]) && v <= 0), 'completions logprobs: greedy token logprob = max of top_logprobs');
  ok(L.top_logprobs.every(t => Object.keys(t).length >= 1 && Object.keys(t).length <= 5), 'completions logprobs: up to 5 alternatives');
  let off = 0;
  ok(L.text_offset.every((o, i) => { const good = o === off; off += [...L.tokens[i]].length; return good; }), 'completions logprobs: text_offset');
  let stl = [], stext = '';
  for await (const ch of await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 8, temperature: 0, logprobs: 2, stream: true })) {
    if (!ch.choices.length) continue;
    stext += ch.choices[0].text;
    if (ch.choices[0].logprobs) stl.push(...ch.choices[0].logprobs.tokens);
  }
  ok(stl.length === 8 && stl.join('') === stext && stext === c1.choices[0].text, 'completions stream logprobs: tokens concatenate to the streamed text');

  // ---- chat
  const msgs = [{ role: 'user', content: 'What is 2+2?' }];
  const off_ = { chat_template_kwargs: { thinking_mode: 'disabled' } };
  const r1 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 7, ...off_ });
  const r2 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 7, ...off_ });
  const r4 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 8, ...off_ });
  ok(r1.choices[0].message.role === 'assistant' && r1.usage.completion_tokens === 6 && r1.object === 'chat.completion', 'chat non-stream');
  ok(r1.choices[0].message.content === r2.choices[0].message.content, 'chat: the same seed gives the same output');
  ok(r1.choices[0].message.content !== r4.choices[0].message.content, 'chat: another seed gives another output');
  let sc = '', roles = 0, sfin = null, su = null;
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 7, stream: true, stream_options: { include_usage: true }, ...off_ })) {
    if (ch.choices.length) { const d = ch.choices[0].delta; if (d.role) roles++; if (d.content) sc += d.content; if (ch.choices[0].finish_reason) sfin = ch.choices[0].finish_reason; }
    if (ch.usage) su = ch.usage;
  }
  ok(roles === 1 && sfin === 'length' && sc === r1.choices[0].message.content && su && su.completion_tokens === 6 && su.prompt_tokens === r1.usage.prompt_tokens, 'chat stream equals non-stream, usage chunk');

  // ---- reasoning split: thinking on -> reasoning_content, off -> content
  const on = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0 });
  ok(typeof on.choices[0].message.reasoning_content === 'string' && on.choices[0].message.reasoning_content.length > 0 && on.choices[0].message.content === '', 'thinking enabled: the output is reasoning_content');
  const offr = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, ...off_ });
  ok(offr.choices[0].message.content.length > 0 && offr.choices[0].message.reasoning_content === undefined, 'thinking disabled: the output is content');
  const offk = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, chat_template_kwargs: { enable_thinking: false } });
  ok(offk.choices[0].message.content === offr.choices[0].message.content && offk.usage.prompt_tokens === offr.usage.prompt_tokens, 'enable_thinking: false = thinking_mode disabled');
  let sr = '', scont = '';
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, stream: true })) {
    if (ch.choices.length) { sr += ch.choices[0].delta.reasoning_content || ''; scont += ch.choices[0].delta.content || ''; }
  }
  ok(sr === on.choices[0].message.reasoning_content && scont === '', 'thinking enabled, stream: reasoning_content deltas');
  const pOn = await tokenize({ messages: msgs }), pOff = await tokenize({ messages: msgs, ...off_ });
  ok(on.usage.prompt_tokens === pOn.count && offr.usage.prompt_tokens === pOff.count && pOff.count > pOn.count, 'the generation prompt follows thinking_mode (/tokenize agrees with usage)');

  // ---- tools are rendered into the prompt
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const pT = await tokenize({ messages: msgs, tools });
  const dT = (await post(base, '/detokenize', { tokens: pT.tokens }, auth)).json.prompt;
  ok(pT.count > pOn.count + 10 && dT.includes('get_weather') && dT.includes('Weather for a city') && dT.includes(']<]minimax[>[<tool_call>'), 'tool definitions rendered into the prompt (/tokenize)');
  const rt = await client.chat.completions.create({ model: 'tiny', messages: msgs, tools, max_tokens: 4, temperature: 0 });
  ok(rt.usage.prompt_tokens === pT.count && ['length', 'stop', 'tool_calls'].includes(rt.choices[0].finish_reason), 'chat with tools: prompt tokens include the tool definitions');

  // ---- stop strings (non-stream and stream cut at the same place)
  const full = offr.choices[0].message.content;
  const mid = [...full];
  const stopStr = mid.slice(Math.floor(mid.length / 2), Math.floor(mid.length / 2) + 2).join('');
  const want = full.slice(0, full.indexOf(stopStr));
  const rs = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, stop: [stopStr], ...off_ });
  ok(rs.choices[0].message.content === want && rs.choices[0].finish_reason === 'stop', `stop string ${JSON.stringify(stopStr)}: output cut before it`);
  let ss = '', sf = null;
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, stop: stopStr, stream: true, ...off_ })) {
    if (ch.choices.length) { ss += ch.choices[0].delta.content || ''; sf = ch.choices[0].finish_reason || sf; }
  }
  ok(ss === want && sf === 'stop', 'stop string, stream: the same cut');

  // ---- chat logprobs (non-stream and stream)
  const cl = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 3, ...off_ });
  const C = cl.choices[0].logprobs.content;
  ok(C.length === 6 && C.map(e => e.token).join('') === cl.choices[0].message.content, 'chat logprobs: tokens concatenate to the content');
  ok(C.every(e => e.top_logprobs.length === 3 && e.logprob === e.top_logprobs[0].logprob && e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob), 'chat logprobs: greedy token logprob = the best of top_logprobs');
  ok(C.every(e => Buffer.from(e.bytes).toString('utf8') === e.token), 'chat logprobs: bytes are the token text');
  let sl = [], sct = '';
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 1, stream: true, ...off_ })) {
    if (!ch.choices.length) continue;
    sct += ch.choices[0].delta.content || '';
    if (ch.choices[0].logprobs) sl.push(...ch.choices[0].logprobs.content);
  }
  ok(sl.length === 6 && sl.map(e => e.token).join('') === sct && sl.every((e, i) => e.logprob === C[i].logprob), 'chat stream logprobs equal the non-stream ones');

  // ---- n > 1
  const n3 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 5, temperature: 0.9, seed: 7, n: 3, ...off_ });
  ok(n3.choices.length === 3 && n3.choices.every((c, i) => c.index === i && c.finish_reason === 'length') && n3.usage.completion_tokens === 15, 'n = 3: three choices, usage sums them');
  const s8 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 5, temperature: 0.9, seed: 8, ...off_ });
  const s7 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 5, temperature: 0.9, seed: 7, ...off_ });
  ok(n3.choices[0].message.content === s7.choices[0].message.content && n3.choices[1].message.content === s8.choices[0].message.content, 'n = 3 with a seed: choice i uses seed + i');
  const byIdx = {}, finIdx = {};
  let nu = null;
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 5, temperature: 0.9, seed: 7, n: 3, stream: true, stream_options: { include_usage: true }, ...off_ })) {
    for (const c of ch.choices) { byIdx[c.index] = (byIdx[c.index] || '') + (c.delta.content || ''); if (c.finish_reason) finIdx[c.index] = c.finish_reason; }
    if (ch.usage) nu = ch.usage;
  }
  ok([0, 1, 2].every(i => byIdx[i] === n3.choices[i].message.content && finIdx[i] === 'length') && nu && nu.completion_tokens === 15, 'n = 3, stream: choices indexed 0..2 equal the non-stream ones');
  // vLLM's continuous_usage_stats: every chunk carries its choice's usage so far
  const cu = [], cuIdx = {};
  let cuFinal = null;
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 5, temperature: 0.9, seed: 7, n: 2, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true }, ...off_ })) {
    if (!ch.choices.length) { cuFinal = ch.usage; continue; }
    for (const c of ch.choices) { cu.push([c.index, ch.usage]); cuIdx[c.index] = (cuIdx[c.index] || '') + (c.delta.content || ''); }
  }
  const perIdx = i => cu.filter(([k]) => k === i).map(([, u]) => u.completion_tokens);
  const mono = a => a.every((x, i) => !i || x >= a[i - 1]);
  ok(cu.length > 4 && cu.every(([, u]) => u && u.prompt_tokens === nu.prompt_tokens && u.total_tokens === u.prompt_tokens + u.completion_tokens) &&
     [0, 1].every(i => perIdx(i)[0] === 0 && mono(perIdx(i)) && perIdx(i).at(-1) === 5 && cuIdx[i] === n3.choices[i].message.content) &&
     cuFinal?.completion_tokens === 10,
     `stream_options.continuous_usage_stats: usage in all ${cu.length} chunks, each choice's tokens so far (${perIdx(0).join(',')}), the final usage too`);
  let plain = 0;
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 3, stream: true,
    stream_options: { continuous_usage_stats: true }, ...off_ })) plain += ch.usage ? 1 : 0;
  ok(plain === 0, 'continuous_usage_stats without include_usage: no usage (as vLLM)');
  const cn = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 4, temperature: 0, n: 2 });
  ok(cn.choices.length === 2 && cn.choices[0].text === cn.choices[1].text && cn.usage.completion_tokens === 8, 'completions n = 2 (greedy: equal choices)');

  // ---- logit_bias, stop_token_ids, min_tokens, ignore_eos
  const ban = await tokenize({ prompt: ' banana' });
  ok(ban.count === 1, "' banana' is one token");
  const B = ban.tokens[0];
  const fb = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 4, temperature: 0, logit_bias: { [B]: 100 } });
  ok(fb.choices[0].text === ' banana'.repeat(4), 'logit_bias +100 forces the token');
  const fs2 = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 4, temperature: 0, logit_bias: { [B]: 100 }, stop_token_ids: [B] });
  ok(fs2.choices[0].text === '' && fs2.choices[0].finish_reason === 'stop' && fs2.usage.completion_tokens === 1, 'stop_token_ids: stops at the token, which is not in the text');
  const mt = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 8, temperature: 0, logit_bias: { [B]: 100 }, stop_token_ids: [B], min_tokens: 3 });
  ok(mt.choices[0].finish_reason === 'stop' && mt.usage.completion_tokens === 4 && !mt.choices[0].text.includes('banana'), 'min_tokens holds the stop token back for 3 tokens');
  const eos = (await tokenize({ prompt: '[e~[' })).tokens;
  ok(eos.length === 1, 'the end-of-turn token [e~[ is one token');
  const fe = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 4, temperature: 0, logit_bias: { [eos[0]]: 100 } });
  ok(fe.choices[0].finish_reason === 'stop' && fe.usage.completion_tokens === 1 && fe.choices[0].text === '', 'EOS stops the request');
  const ie = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 4, temperature: 0, logit_bias: { [eos[0]]: 100 }, ignore_eos: true });
  ok(ie.choices[0].finish_reason === 'length' && ie.usage.completion_tokens === 4, 'ignore_eos: EOS does not stop');

  // ---- tokenize / detokenize
  const tk = await tokenize({ prompt: 'Hello world' });
  const dt = (await post(base, '/detokenize', { tokens: tk.tokens }, auth)).json;
  ok(tk.count === 2 && dt.prompt === 'Hello world', '/tokenize + /detokenize round trip');

  // ---- raw SSE shape: data lines, [DONE] last
  const raw = await stream(base, '/v1/chat/completions', { model: 'tiny', messages: msgs, max_tokens: 3, n: 2 }, { headers: auth });
  ok(raw.status === 200 && raw.done && raw.bad.length === 0 && raw.raw.trimEnd().endsWith('data: [DONE]'), 'SSE: every event a data line, [DONE] last');
} catch (e) { R.failed++; console.log('FAIL exception: ' + (e.stack || e)); }
const ex = await srv.stop('SIGTERM');
ok(ex.code === 0, `server exits 0 on SIGTERM (code ${ex.code}, signal ${ex.signal})`);
ok(/m3 serve: req \d+ POST \/v1\/chat\/completions 200 prompt_tokens=\d+ completion_tokens=\d+ ttft=[\d.]+ms total=[\d.]+ms/.test(srv.log), 'one log line per request');
if (R.failed) console.log(srv.log);
console.log(R.failed ? `${R.failed} FAILED` : 'all passed');
process.exit(R.failed ? 1 : 0);
