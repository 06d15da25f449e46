// m3 serve with image inputs, through the official openai client.
// Usage: node tests/server/server_images.mjs <m3-binary> <work-dir>
//
// The checkpoint is tests/data/m3vl-tiny (the vision-language reference model) with a tokenizer
// made here: every id k < 1024 is the added token "<k>", and 1000..1003 are ]<]image[>[,
// ]<]video[>[, ]<]start of image[>[, ]<]end of image[>[; the chat template writes the text
// parts and a bracketed placeholder per image. So the chat request
//   "<5><17><33>" + image + "<40><41>"
// renders to the reference's own prompt (m3vl-tiny.oracle.safetensors input_ids once the
// server expands the image to its 20 tokens), and the greedy output is compared with the
// reference's greedy tokens and with `m3 logits --image` (the CLI path) token by token.
import OpenAI from 'openai';
import { execFileSync, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { root, startServer, post, metrics, reporter } from './lib.mjs';

const [m3, work] = process.argv.slice(2);
if (!m3 || !work) { console.error('usage: node server_images.mjs <m3-binary> <work-dir>'); process.exit(2); }
const R = reporter(), ok = R.ok;
const DATA = path.join(root, 'tests/data');
const IMG_A = path.join(DATA, 'm3vl-tiny.image.png');
const ORACLE = path.join(DATA, 'm3vl-tiny.oracle.safetensors');

// ---- safetensors (F32 / I32 only)
function readSt(file) {
  const b = fs.readFileSync(file), n = Number(b.readBigUInt64LE(0)), h = JSON.parse(b.subarray(8, 8 + n).toString());
  const get = name => {
    const t = h[name]; if (!t) throw new Error(`${file}: no tensor ${name}`);
    const [s, e] = t.data_offsets, raw = b.subarray(8 + n + s, 8 + n + e);
    const buf = raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.length);
    return { shape: t.shape, data: t.dtype === 'I32' ? new Int32Array(buf) : new Float32Array(buf) };
  };
  return { get };
}
const logSoftmax = (row, k) => { let m = -Infinity; for (const v of row) m = Math.max(m, v); let s = 0; for (const v of row) s += Math.exp(v - m); return row[k] - m - Math.log(s); };

// ---- a PNG encoder (8-bit RGB), for synthetic images
const CRC = new Int32Array(256).map((_, n) => { let c = n; for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1; return c; });
const crc32 = buf => { let c = -1; for (const x of buf) c = CRC[(c ^ x) & 255] ^ (c >>> 8); return (c ^ -1) >>> 0; };
function chunk(type, data) {
  const len = Buffer.alloc(4); len.writeUInt32BE(data.length);
  const td = Buffer.concat([Buffer.from(type, 'latin1'), data]), crc = Buffer.alloc(4); crc.writeUInt32BE(crc32(td));
  return Buffer.concat([len, td, crc]);
}
function png(w, h, px, { headerW = w, headerH = h } = {}) { // px(x, y) -> [r, g, b]
  const ihdr = Buffer.alloc(13); ihdr.writeUInt32BE(headerW, 0); ihdr.writeUInt32BE(headerH, 4); ihdr[8] = 8; ihdr[9] = 2;
  const raw = Buffer.alloc(h * (1 + 3 * w));
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) { const [r, g, b] = px(x, y), o = y * (1 + 3 * w) + 1 + 3 * x; raw[o] = r; raw[o + 1] = g; raw[o + 2] = b; }
  return Buffer.concat([Buffer.from([137, 80, 78, 71, 13, 10, 26, 10]), chunk('IHDR', ihdr), chunk('IDAT', zlib.deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}
const dataUrl = (buf, mime = 'image/png') => `data:${mime};base64,${buf.toString('base64')}`;

// ---- the checkpoint: m3vl-tiny + a tokenizer and chat template that reproduce the reference prompt
function makeCheckpoint(dir) {
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  for (const f of ['config.json', 'model.safetensors']) fs.symlinkSync(path.join(DATA, 'm3vl-tiny', f), path.join(dir, f));
  const names = { 1000: ']<]image[>[', 1001: ']<]video[>[', 1002: ']<]start of image[>[', 1003: ']<]end of image[>[' };
  const vocab = {}, added = [];
  for (let i = 0; i < 1024; i++) {
    const c = names[i] || `<${i}>`;
    vocab[c] = i;
    added.push({ id: i, content: c, single_word: false, lstrip: false, rstrip: false, normalized: false, special: false });
  }
  fs.writeFileSync(path.join(dir, 'tokenizer.json'), JSON.stringify({
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null, pre_tokenizer: null,
    post_processor: null, decoder: null,
    model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [] },
  }));
  fs.writeFileSync(path.join(dir, 'chat_template.jinja'),
    "{%- for m in messages -%}{%- if m.content is string -%}{{ m.content }}{%- else -%}{%- for p in m.content -%}" +
    "{%- if p.type == 'text' -%}{{ p.text }}{%- elif p.type == 'image' -%}]<]start of image[>[]<]image[>[]<]end of image[>[" +
    '{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}');
  return dir;
}

// `m3 logits --image FILE` on the reference prompt (one placeholder): greedy tokens + their logprobs
function cliGreedy(ck, file, n) {
  const out = path.join(work, 'logits-' + path.basename(file) + '.safetensors');
  execFileSync(m3, ['logits', '-m', ck, '--ids', '5,17,33,1002,1000,1003,40,41', '--image', file, '--decode', String(n), '-o', out], { stdio: ['ignore', 'ignore', 'inherit'] });
  const st = readSt(out), toks = [...st.get('greedy_tokens').data], gl = st.get('greedy_logits'), V = gl.shape[1];
  return { toks, lps: toks.map((t, i) => logSoftmax(gl.data.subarray(i * V, (i + 1) * V), t)) };
}

fs.mkdirSync(work, { recursive: true });
const ck = makeCheckpoint(path.join(work, 'ck'));
const oracle = readSt(ORACLE);
const refIds = [...oracle.get('input_ids').data], refToks = [...oracle.get('greedy_tokens').data];
const N = refToks.length; // 16
const rgl = oracle.get('greedy_logits'), V = rgl.shape[1];
const refLps = refToks.map((t, i) => logSoftmax(rgl.data.subarray(i * V, (i + 1) * V), t));

const pngA = fs.readFileSync(IMG_A);
const fileB = path.join(work, 'b.png');
fs.writeFileSync(fileB, png(150, 100, (x, y) => [(x * 7 + y * 3) & 255, (x * y) & 255, (255 - 2 * y) & 255])); // same size as A, other content
const pngB = fs.readFileSync(fileB);
const jpgFile = path.join(root, 'fuzz/corpus/image/rgb.jpg');

const msgsWith = (url, extra = {}) => [{ role: 'user', content: [
  { type: 'text', text: '<5><17><33>' }, { type: 'image_url', image_url: { url, ...extra } }, { type: 'text', text: '<40><41>' }] }];
const NAMES = { ']<]image[>[': 1000, ']<]video[>[': 1001, ']<]start of image[>[': 1002, ']<]end of image[>[': 1003 };
const parseToks = content => [...content.matchAll(/<(\d+)>|(\]<\][^[]*\[>\[)/g)].map(m => m[1] !== undefined ? Number(m[1]) : NAMES[m[2]]);
const greedy = { max_tokens: N, temperature: 0, ignore_eos: true, logprobs: true };
const maxDiff = (a, b) => Math.max(...a.map((v, i) => Math.abs(v - b[i])));

// compared with references computed with an f32 cache
const srv = await startServer(m3, ck, ['--served-model-name', 'vl', '--kv-cache-dtype', 'f32']);
const base = srv.base;
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });
const chat = (messages, o = {}) => client.chat.completions.create({ model: 'vl', messages, ...greedy, ...o });
const lpsOf = r => r.choices[0].logprobs.content.map(e => e.logprob);
let srv2 = null, srv3 = null, srv4 = null;
try {
  const cliA = cliGreedy(ck, IMG_A, N);
  ok(JSON.stringify(cliA.toks) === JSON.stringify(refToks), '`m3 logits --image` greedy tokens = the reference (sanity of the comparison)');

  // ---- /tokenize counts the image tokens: the reference's expanded prompt
  const tk = (await post(base, '/tokenize', { messages: msgsWith(dataUrl(pngA)) })).json;
  ok(tk && tk.count === refIds.length && JSON.stringify(tk.tokens) === JSON.stringify(refIds),
     `/tokenize with an image: ${tk && tk.count} tokens = the reference's expanded input_ids (${refIds.length})`);

  // ---- an image chat end to end: greedy tokens = reference and CLI, logprobs = CLI's, usage counts the image
  const m0 = await metrics(base);
  const rA = await chat(msgsWith(dataUrl(pngA), { detail: 'high' }));
  const tA = parseToks(rA.choices[0].message.content);
  ok(JSON.stringify(tA) === JSON.stringify(refToks), `image chat: greedy tokens = the reference's (${tA.join(',')})`);
  ok(rA.choices[0].logprobs.content.length === N && maxDiff(lpsOf(rA), cliA.lps) < 2e-4,
     `image chat: logprobs = m3 logits --image (max diff ${maxDiff(lpsOf(rA), cliA.lps).toExponential(2)})`);
  const m1 = await metrics(base);
  ok(m1.m3_image_inputs_total - (m0.m3_image_inputs_total || 0) === 1 && m1.m3_vision_encoder_runs_total >= 1, '/metrics counts the image and the vision tower run');
  // the same image through Anthropic's Messages API: an image block with a base64 source
  const an = await post(base, '/v1/messages', { model: 'vl', max_tokens: N, temperature: 0, messages: [{ role: 'user', content: [
    { type: 'text', text: '<5><17><33>' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: pngA.toString('base64') } },
    { type: 'text', text: '<40><41>' }] }] });
  const rEos = await chat(msgsWith(dataUrl(pngA)), { ignore_eos: false, logprobs: false });
  const aText = an.json?.content?.map(b => b.text).join('');
  ok(an.status === 200 && aText && aText === rEos.choices[0].message.content && rA.choices[0].message.content.startsWith(aText) &&
     an.json.usage.input_tokens === rA.usage.prompt_tokens,
     `/v1/messages with an image block: the chat's greedy text (${parseToks(aText || '').length} tokens) and input_tokens ${an.json?.usage?.input_tokens}`);
  ok(maxDiff(lpsOf(rA), refLps) < 1e-3, `image chat: logprobs = the reference's (max diff ${maxDiff(lpsOf(rA), refLps).toExponential(2)})`);
  ok(rA.usage.prompt_tokens === refIds.length && rA.usage.completion_tokens === N,
     `usage.prompt_tokens ${rA.usage.prompt_tokens} includes the 20 image tokens (${refIds.length})`);

  // stream: the same tokens
  let sc = '', su = null;
  for await (const ch of await chat(msgsWith(dataUrl(pngA)), { stream: true, stream_options: { include_usage: true }, logprobs: false })) {
    if (ch.choices.length) sc += ch.choices[0].delta.content || '';
    if (ch.usage) su = ch.usage;
  }
  ok(sc === rA.choices[0].message.content && su && su.prompt_tokens === refIds.length, 'image chat stream = non-stream, usage counts the image');
  // n = 2: the choices share the images, both greedy
  const rn = await chat(msgsWith(dataUrl(pngA)), { n: 2, logprobs: false });
  ok(rn.choices.length === 2 && rn.choices.every(c => c.message.content === rA.choices[0].message.content), 'n = 2 with an image: both choices = the single answer');

  // ---- prefix caching keys on the image: same text + another image shares nothing past the image tokens
  const h0 = (await metrics(base)).m3_prefix_cache_hit_tokens_total;
  const rB = await chat(msgsWith(dataUrl(pngB)));
  const h1 = (await metrics(base)).m3_prefix_cache_hit_tokens_total;
  const cliB = cliGreedy(ck, fileB, N);
  ok(JSON.stringify(lpsOf(rB)) !== JSON.stringify(lpsOf(rA)), 'another image, same text: another output');
  ok(JSON.stringify(parseToks(rB.choices[0].message.content)) === JSON.stringify(cliB.toks) && maxDiff(lpsOf(rB), cliB.lps) < 2e-4,
     `another image after the first was cached: output = m3 logits --image on it (no stale KV; max logprob diff ${maxDiff(lpsOf(rB), cliB.lps).toExponential(2)})`);
  ok(h1 === h0, `another image: no prefix-cache hit (hit tokens ${h0} -> ${h1})`);
  const rA2 = await chat(msgsWith(dataUrl(pngA)));
  const h2 = (await metrics(base)).m3_prefix_cache_hit_tokens_total;
  ok(h2 > h1, `the same image again: prefix-cache hit tokens go up (${h1} -> ${h2})`);
  ok(JSON.stringify(lpsOf(rA2)) === JSON.stringify(lpsOf(rA)) && rA2.choices[0].message.content === rA.choices[0].message.content,
     'the same image again, from the cache: the same tokens and logprobs, bitwise');

  // ---- other formats: JPEG (and WebP when this build decodes it) = the CLI on the same file
  const cliJ = cliGreedy(ck, jpgFile, 4);
  const rJ = await chat(msgsWith(dataUrl(fs.readFileSync(jpgFile), 'image/jpeg')), { max_tokens: 4 });
  ok(JSON.stringify(parseToks(rJ.choices[0].message.content)) === JSON.stringify(cliJ.toks) && maxDiff(lpsOf(rJ), cliJ.lps) < 2e-4,
     'a JPEG data URL: output = m3 logits --image on the file');

  // ---- errors: 400 in OpenAI's shape, naming the part and the problem; the server keeps serving
  const P = 'messages[0].content[1].image_url';
  const bad = async (what, url, re, extra = {}) => {
    const r = await post(base, '/v1/chat/completions', { model: 'vl', messages: msgsWith(url), max_tokens: 2, ...extra });
    const e = r.json && r.json.error;
    ok(r.status === 400 && e && e.type === 'invalid_request_error' && e.param === P && e.code === 400 && re.test(e.message),
       `${what}: 400 (${e ? e.message : r.text})`);
  };
  await bad('bad base64', 'data:image/png;base64,iVBORw0K@@@@', /base64/);
  await bad('truncated PNG', dataUrl(pngA.subarray(0, pngA.length >> 1)), /PNG/);
  await bad('not an image', dataUrl(Buffer.from('hello, world: not an image'), 'image/png'), /unknown image format/);
  await bad('text media type', 'data:text/plain;base64,aGVsbG8=', /not an image/);
  // the request's words are never taken for the server's allocation failure (a 500)
  await bad('a media type that says out of memory', 'data:out of memory;base64,aGVsbG8=', /media type 'out of memory' is not an image/);
  await bad('huge image (header says 20000 x 20000)', dataUrl(png(4, 4, () => [1, 2, 3], { headerW: 20000, headerH: 20000 })), /too large/);
  await bad('degenerate aspect ratio (600 x 2)', dataUrl(png(600, 2, x => [x & 255, 0, 0])), /aspect ratio/);
  await bad('remote URL without --allowed-media-domains', 'https://example.com/cat.png', /remote image URLs are not accepted.*data URL/);
  await bad('file: URL', 'file:///etc/passwd', /'file:' URLs are not accepted/);
  await bad('a path', '/etc/passwd', /file paths are not accepted/);
  const rp = await post(base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: {} }] }] });
  ok(rp.status === 400 && rp.json.error.param === 'messages[0].content[0].image_url' && /'url'/.test(rp.json.error.message), `image_url without a url: 400 (${rp.json && rp.json.error.message})`);
  const ra = await post(base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'input_audio', input_audio: {} }] }] });
  ok(ra.status === 400 && /not supported/.test(ra.json.error.message), `an audio part: 400 (${ra.json && ra.json.error.message})`);
  const rt = await post(base, '/tokenize', { messages: msgsWith(dataUrl(pngA.subarray(0, 40))) });
  ok(rt.status === 400 && rt.json.error.param === P, '/tokenize with a corrupt image: 400');
  try {
    await chat(msgsWith('data:image/png;base64,!!!'));
    ok(false, 'openai client: a corrupt image throws');
  } catch (e) {
    ok(e instanceof OpenAI.BadRequestError && e.status === 400 && /base64/.test(e.message), `openai client: BadRequestError (${e.message})`);
  }
  // a placeholder typed in the text does not match the images: 400, not a misplaced image
  const rx = await post(base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'text', text: ']<]image[>[' }, { type: 'image_url', image_url: { url: dataUrl(pngA) } }] }] });
  ok(rx.status === 400 && /2 image placeholders .* for 1 image/.test(rx.json.error.message), `a placeholder in the text: 400 (${rx.json && rx.json.error.message})`);
  // context: the image tokens count against max_model_len (27 prompt tokens with the image)
  const rc = await post(base, '/v1/chat/completions', { model: 'vl', messages: msgsWith(dataUrl(pngA)), max_tokens: 1 << 30 });
  ok(rc.status === 400 && /27 in the prompt/.test(rc.json.error.message), `max_tokens beyond the context counts the image tokens (${rc.json && rc.json.error.message})`);

  const rOk = await chat(msgsWith(dataUrl(pngA)));
  ok(rOk.choices[0].message.content === rA.choices[0].message.content, 'after the errors: a normal image request gives the same answer');
  const rText = await chat([{ role: 'user', content: '<5><17><33>' }], { max_tokens: 4 });
  ok(rText.usage.prompt_tokens === 3 && rText.choices[0].logprobs.content.length === 4, 'a text-only request on the vision model');

  // ---- hostile images (issue 23): refused by their headers before decoding, and the loop serves
  // others meanwhile (their decoding runs on preparation threads)
  const multi = urls => [{ role: 'user', content: [{ type: 'text', text: '<5>' }, ...urls.map(u => ({ type: 'image_url', image_url: { url: u } }))] }];
  // a JPEG cut short with an end marker after the cut: refused as truncated, not decoded as gray
  const jpgBytes = fs.readFileSync(jpgFile), cutJpg = Buffer.concat([jpgBytes.subarray(0, jpgBytes.length * 2 / 3 | 0), Buffer.from([0xff, 0xd9])]);
  await bad('a JPEG cut short before its end marker', dataUrl(cutJpg, 'image/jpeg'), /truncated/);
  // three headers of 7000 x 7000 (each under the 50 M pixels of one image): over the request's 100 M in all
  const big = dataUrl(png(4, 4, () => [1, 2, 3], { headerW: 7000, headerH: 7000 }));
  const t3 = await post(base, '/v1/chat/completions', { model: 'vl', messages: multi([big, big, big]), max_tokens: 2 });
  ok(t3.status === 400 && /limit is 100000000 in all \(nothing was decoded\)/.test(t3.json.error.message) && t3.json.error.param === 'messages[0].content[3].image_url',
     `three images of 49 M pixels: 400 at the third (${t3.json && t3.json.error.message})`);
  // 32 images of 672 x 672 beside /health: the loop answers while they are decoded and preprocessed
  // (8 in the sanitizer builds, where the 18,000-token prefill after them took minutes of CI). Shown by
  // state, not by latency: /health answered between two /metrics reads that both saw the request on the
  // preparation threads (m3_requests_preparing > 0) with no preparation finished in between (the same
  // m3_requests_prepared_total), so it was answered during that preparation, not after it
  const NIMG = process.env.M3_SANITIZED ? 8 : 32;
  const mid = dataUrl(png(672, 672, (x, y) => [(x * 3 + y) & 255, (x ^ y) & 255, (y * 5) & 255]));
  const metricOf = (text, name) => { const m = text.match(new RegExp('^' + name + ' (\\S+)$', 'm')); return m ? Number(m[1]) : NaN; };
  const prepState = async () => {
    const t = await (await fetch(base + '/metrics')).text();
    return { preparing: metricOf(t, 'm3_requests_preparing'), prepared: metricOf(t, 'm3_requests_prepared_total') };
  };
  const before = await prepState();
  ok(before.preparing === 0 && before.prepared > 0, `/metrics: m3_requests_preparing ${before.preparing}, m3_requests_prepared_total ${before.prepared}`);
  const heavy = post(base, '/v1/chat/completions', { model: 'vl', messages: multi(Array(NIMG).fill(mid)), max_tokens: 1 });
  let done = false, during = 0, probes = 0, healthOk = true;
  heavy.then(() => { done = true; }, () => { done = true; }); // a failure is reported by the await below
  while (!done && !during) { // until shown (or the request is answered)
    const a = await prepState();
    const h = await fetch(base + '/health');
    await h.text();
    const b = await prepState();
    probes++;
    healthOk &&= h.status === 200;
    if (a.preparing > 0 && b.preparing > 0 && a.prepared === b.prepared) during++;
  }
  const hr = await heavy;
  ok(hr.status === 200 && hr.json.usage.prompt_tokens > NIMG * 500, `${NIMG} images of 672 x 672: 200, ${hr.json && hr.json.usage && hr.json.usage.prompt_tokens} prompt tokens`);
  const after = await prepState();
  ok(healthOk && during > 0 && after.preparing === 0 && after.prepared === before.prepared + 1,
     `/health answered during their preparation: ${during} of ${probes} probes (prepared ${before.prepared} -> ${after.prepared}; before the preparation threads: no answer for 21.6 s)`);

  // ---- --allowed-media-domains: hosts named allowed or not; nothing is fetched either way
  srv2 = await startServer(m3, ck, ['--served-model-name', 'vl', '--allowed-media-domains', 'example.com,img.example.org']);
  const d1 = await post(srv2.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith('https://evil.example.net/x.png') });
  ok(d1.status === 400 && /'evil\.example\.net' is not in --allowed-media-domains/.test(d1.json.error.message), `a host not allowed: 400 (${d1.json && d1.json.error.message})`);
  const d2 = await post(srv2.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith('https://user@IMG.example.org:8443/x.png') });
  ok(d2.status === 400 && /fetching remote images is not implemented.*'img\.example\.org'/.test(d2.json.error.message), `an allowed host: 400, fetching not implemented (${d2.json && d2.json.error.message})`);
  const d3 = await post(srv2.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith(dataUrl(pngA)), temperature: 0, ignore_eos: true });
  ok(d3.status === 200 && d3.json.usage.prompt_tokens === refIds.length, 'data URLs still work with --allowed-media-domains');
  await srv2.stop();
  srv2 = null;

  // ---- --max-image-memory: the preprocessed pixels all requests hold are bounded (429 beyond)
  srv4 = await startServer(m3, ck, ['--served-model-name', 'vl', '--max-image-memory', '100000']);
  const mm = await post(srv4.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith(dataUrl(pngA)) });
  ok(mm.status === 429 && mm.json.error.type === 'rate_limit_error' && /over its limit/.test(mm.json.error.message),
     `an image over --max-image-memory: 429 (${mm.json && mm.json.error.message})`);
  const mt = await post(srv4.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: [{ role: 'user', content: '<5><17>' }] });
  ok(mt.status === 200, 'text requests beside it work');
  await srv4.stop();
  srv4 = null;

  // ---- --limit-mm-per-prompt (vLLM's): images per request
  srv4 = await startServer(m3, ck, ['--served-model-name', 'vl', '--limit-mm-per-prompt.image', '1']); // (the dotted form)
  const two = [{ role: 'user', content: [{ type: 'text', text: '<5>' }, { type: 'image_url', image_url: { url: dataUrl(pngA) } },
    { type: 'image_url', image_url: { url: dataUrl(pngA) } }] }];
  const lm2 = await post(srv4.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: two });
  ok(lm2.status === 400 && lm2.json.error.param === 'messages[0].content[2]' && /at most 1 image may be provided in one prompt/.test(lm2.json.error.message),
     `--limit-mm-per-prompt '{"image": 1}': two images get 400 (${lm2.json && lm2.json.error.message})`);
  const lm1 = await post(srv4.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith(dataUrl(pngA)), temperature: 0, ignore_eos: true });
  ok(lm1.status === 200 && lm1.json.usage.prompt_tokens === refIds.length, '--limit-mm-per-prompt: one image served');
  await srv4.stop();
  srv4 = await startServer(m3, ck, ['--served-model-name', 'vl', '--limit-mm-per-prompt', '{"image": {"count": 0}, "video": 0}']);
  const lm0 = await post(srv4.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith(dataUrl(pngA)) });
  ok(lm0.status === 400 && /image inputs are off \(--limit-mm-per-prompt/.test(lm0.json.error.message) && !/vision tower:/.test(srv4.log),
     `--limit-mm-per-prompt image count 0: an image gets 400, no vision tower loaded (${lm0.json?.error?.message})`);
  await srv4.stop();
  srv4 = null;
  for (const [v, re] of [['{"image": -1}', /a count \(an integer, 0 or more\)/], ['{"audio_clip": 1}', /the modalities are image, video and audio/], ['x', /not JSON/]]) {
    const r = spawnSync(m3, ['serve', '-m', ck, '--limit-mm-per-prompt', v], { encoding: 'utf8' });
    ok(r.status === 2 && re.test(r.stderr), `--limit-mm-per-prompt ${v}: exit ${r.status}: ${r.stderr.trim().split('\n').pop()}`);
  }

  // ---- --language-model-only: images get 400, text still works
  srv3 = await startServer(m3, ck, ['--served-model-name', 'vl', '--language-model-only']);
  const l1 = await post(srv3.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: msgsWith(dataUrl(pngA)) });
  ok(l1.status === 400 && l1.json.error.param === 'messages[0].content[1]' && /--language-model-only/.test(l1.json.error.message),
     `--language-model-only: an image gets 400 (${l1.json && l1.json.error.message})`);
  const l2 = await post(srv3.base, '/v1/chat/completions', { model: 'vl', max_tokens: 2, messages: [{ role: 'user', content: '<5><17>' }] });
  ok(l2.status === 200, '--language-model-only: text requests work');
  const lm = await metrics(srv3.base);
  ok(lm.m3_vision_encoder_runs_total === 0, '--language-model-only: the vision tower never ran');
} catch (e) { R.failed++; console.log('FAIL exception: ' + (e.stack || e)); }
for (const s of [srv, srv2, srv3, srv4]) if (s) { const r = await s.stop(); if (r.code !== 0) { R.failed++; console.log('FAIL server exit ' + JSON.stringify(r) + '\n' + s.log); } }
console.log(R.failed ? `server_images: ${R.failed} FAILED` : 'server_images: all passed');
process.exit(R.failed ? 1 : 0);
