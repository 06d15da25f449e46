#!/usr/bin/env python3
"""Serving load test for `m3 serve` (Python standard library only: runs in CI and on the GPU
machine alike).

For each concurrency level C, C clients each send --rounds streaming /v1/completions requests one
after the other (a prompt of about --prompt-tokens tokens, --max-tokens output tokens with
ignore_eos, stream_options.include_usage). Every response must be complete and well formed:
HTTP 200, every event a `data:` line holding JSON (SSE comment lines are keep-alives and are
allowed), no error event, exactly max_tokens tokens with finish_reason "length", a usage chunk
whose completion_tokens is max_tokens and prompt_tokens the prompt's, and `data: [DONE]` last.
Anything else counts as failed and is described (the first few).

Per level it prints one table row: requests, failed, seconds, requests/s, output and prompt
tokens/s, time to first token and inter-token latency p50 / p99 (measured here, as chunks
arrive), and the server's preemptions and keep-alive comments during the level (from /metrics).
Exit status 1 when any request failed or the server stopped answering.

  python3 tools/load_test.py --base http://127.0.0.1:8000 [--concurrency 1,16,64,128,256]
      [--rounds 2] [--prompt-tokens 700] [--max-tokens 128] [--timeout 600] [--model NAME]
"""
import argparse
import asyncio
import json
import random
import sys
import time
from urllib.parse import urlparse

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river mountain garden window silver orange music "
         "question answer table letter winter summer morning evening paper story market doctor teacher").split()


class Fail(Exception):
    pass


async def http(host, port, method, path, body=None, timeout=600.0):
    """One request on its own connection: (status, headers dict, body reader coroutine factory)."""
    r, w = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    data = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    w.write(head + data)
    await w.drain()
    line = await asyncio.wait_for(r.readline(), timeout)
    parts = line.decode("latin1").split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        w.close()
        raise Fail(f"bad status line {line!r}")
    status = int(parts[1])
    headers = {}
    while True:
        h = await asyncio.wait_for(r.readline(), timeout)
        if h in (b"\r\n", b"\n", b""):
            break
        k, _, v = h.decode("latin1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, r, w


async def body_chunks(r, headers, timeout):
    """Yields the body's pieces as they arrive (chunked or sized or until close)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size_line = await asyncio.wait_for(r.readline(), timeout)
            if not size_line:
                raise Fail("connection closed inside the chunked body (no terminating chunk)")
            n = int(size_line.split(b";")[0].strip() or b"0", 16)
            if n == 0:
                await asyncio.wait_for(r.readline(), timeout)
                return
            piece = await asyncio.wait_for(r.readexactly(n + 2), timeout)
            yield piece[:-2]
    elif "content-length" in headers:
        yield await asyncio.wait_for(r.readexactly(int(headers["content-length"])), timeout)
    else:
        while True:
            piece = await asyncio.wait_for(r.read(65536), timeout)
            if not piece:
                return
            yield piece


async def get_text(host, port, path, timeout=60.0):
    status, headers, r, w = await http(host, port, "GET", path, timeout=timeout)
    out = b"".join([p async for p in body_chunks(r, headers, timeout)])
    w.close()
    return status, out.decode("utf-8", "replace")


async def post_json(host, port, path, body, timeout=60.0):
    status, headers, r, w = await http(host, port, "POST", path, body, timeout=timeout)
    out = b"".join([p async for p in body_chunks(r, headers, timeout)])
    w.close()
    return status, json.loads(out or b"null")


async def metrics(host, port):
    status, text = await get_text(host, port, "/metrics")
    m = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, _, v = line.rpartition(" ")
            try:
                m[k] = float(v)
            except ValueError:
                pass
    return m


async def one_request(host, port, body, n_prompt, max_tokens, timeout):
    """Streams one completion; returns its record or raises Fail with what was wrong."""
    t0 = time.perf_counter()
    status, headers, r, w = await http(host, port, "POST", "/v1/completions", body, timeout)
    try:
        if status != 200:
            text = b"".join([p async for p in body_chunks(r, headers, timeout)])
            raise Fail(f"HTTP {status}: {text[:300]!r}")
        buf, arrivals, comments, usage, done, finish = b"", [], 0, None, False, None
        async for piece in body_chunks(r, headers, timeout):
            now = time.perf_counter()
            buf += piece
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if ev.startswith(b":"):  # an SSE comment: keep-alive
                    comments += 1
                    continue
                if not ev.startswith(b"data: "):
                    raise Fail(f"not an SSE data event: {ev[:200]!r}")
                if done:
                    raise Fail("an event after [DONE]")
                data = ev[6:]
                if data == b"[DONE]":
                    done = True
                    continue
                j = json.loads(data)
                if "error" in j:
                    raise Fail(f"error event: {j['error']}")
                if j.get("usage"):
                    usage = j["usage"]
                for ch in j.get("choices", []):
                    if ch.get("text"):
                        arrivals.append(now)
                    if ch.get("finish_reason"):
                        finish = ch["finish_reason"]
        if buf.strip():
            raise Fail(f"bytes after the last event: {buf[:200]!r}")
        if not done:
            raise Fail("no [DONE]")
        if usage is None:
            raise Fail("no usage chunk")
        if usage.get("completion_tokens") != max_tokens or usage.get("prompt_tokens") != n_prompt:
            raise Fail(f"usage {usage}, expected {n_prompt} prompt and {max_tokens} completion tokens")
        if finish != "length":
            raise Fail(f"finish_reason {finish!r}, expected 'length'")
        if not arrivals:
            raise Fail("no text arrived")
        return {"ttft": arrivals[0] - t0, "itl": [b - a for a, b in zip(arrivals, arrivals[1:])],
                "e2e": time.perf_counter() - t0, "out": usage["completion_tokens"], "prompt": usage["prompt_tokens"],
                "comments": comments}
    finally:
        w.close()


def pct(xs, p):
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


async def make_prompts(host, port, first, n, target):
    """Prompts first..first+n-1, each of exactly `target` tokens (counted by the server's
    /tokenize) and different from the first token on (no prefix-cache hits between them)."""
    out = []
    for i in range(first, first + n):
        rnd = random.Random(i)
        words = [f"{rnd.choice(WORDS).capitalize()} {i}:"] + [rnd.choice(WORDS) for _ in range(target)]
        while True:
            text = " ".join(words)
            st, j = await post_json(host, port, "/tokenize", {"prompt": text})
            if st != 200:
                raise Fail(f"/tokenize: HTTP {st}: {j}")
            k = j["count"]
            if k == target:
                break
            if k > target:
                words = words[:-max(1, (k - target) // 2)] if k - target > 1 else words[:-1]
            else:
                words += [rnd.choice(WORDS) for _ in range(max(1, (target - k) // 2))]
        out.append((text, target))
    return out


async def level(host, port, conc, rounds, first, args):
    prompts = await make_prompts(host, port, first, conc * rounds, args.prompt_tokens)
    m0 = await metrics(host, port)
    recs, fails = [], []
    t0 = time.perf_counter()

    async def client(c):
        for k in range(rounds):
            text, n_prompt = prompts[c * rounds + k]
            body = {"prompt": text, "max_tokens": args.max_tokens, "ignore_eos": True,
                    "temperature": getattr(args, "temperature", 0.0), "stream": True,
                    "stream_options": {"include_usage": True}}
            if getattr(args, "top_p", 1.0) < 1:
                body["top_p"] = args.top_p
            if args.model:
                body["model"] = args.model
            try:
                recs.append(await one_request(host, port, body, n_prompt, args.max_tokens, args.timeout))
            except (Fail, OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
                fails.append(f"client {c} request {k}: {type(e).__name__}: {e}")

    await asyncio.gather(*(client(c) for c in range(conc)))
    secs = time.perf_counter() - t0
    m1 = await metrics(host, port)
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    itl = [x for r in recs for x in r["itl"]]
    row = {"concurrency": conc, "requests": len(recs) + len(fails), "failed": len(fails), "seconds": secs,
           "req_s": len(recs) / secs, "out_tok_s": sum(r["out"] for r in recs) / secs,
           "prompt_tok_s": sum(r["prompt"] for r in recs) / secs,
           "ttft_p50": pct([r["ttft"] for r in recs], 50) * 1e3, "ttft_p99": pct([r["ttft"] for r in recs], 99) * 1e3,
           "itl_p50": pct(itl, 50) * 1e3, "itl_p99": pct(itl, 99) * 1e3,
           "preemptions": d("m3_preemptions_total"), "keepalives": d("m3_stream_keepalives_total")}
    return row, fails


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--concurrency", default="1,16,64,128,256")
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per level")
    ap.add_argument("--prompt-tokens", type=int, default=700)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds without a byte before a request fails")
    ap.add_argument("--model", default=None)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request (0: greedy)")
    ap.add_argument("--top-p", type=float, default=1.0, help="top_p of every request (1: off)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    u = urlparse(args.base)
    host, port = u.hostname, u.port or 80
    levels = [int(x) for x in args.concurrency.split(",") if x]
    st, text = await get_text(host, port, "/v1/models")
    if st != 200:
        print(f"/v1/models: HTTP {st}", file=sys.stderr)
        return 1
    if args.model is None:
        args.model = json.loads(text)["data"][0]["id"]
    m = await metrics(host, port)
    print(f"# m3 load test: {args.base}, model {args.model}, {args.prompt_tokens}-token prompts, {args.max_tokens} "
          f"output tokens (ignore_eos, {'greedy' if args.temperature <= 0 else f'temperature {args.temperature:g}, top_p {args.top_p:g}'}, "
          f"streamed), {args.rounds} requests per client; KV pool "
          f"{int(m.get('m3_kv_capacity_tokens', 0))} tokens, context {int(m.get('m3_max_model_len', 0))}; every prompt "
          f"distinct (no prefix-cache hits)", flush=True)
    cols = ["concurrency", "requests", "failed", "seconds", "req/s", "output tok/s", "prompt tok/s", "TTFT p50 ms",
            "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms", "preemptions", "keep-alives"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols), flush=True)
    rows, bad, first = [], 0, 0
    for c in levels:
        row, fails = await level(host, port, c, args.rounds, first, args)
        first += c * args.rounds
        rows.append(row)
        bad += len(fails)
        print(f"| {c} | {row['requests']} | {row['failed']} | {row['seconds']:.1f} | {row['req_s']:.2f} | "
              f"{row['out_tok_s']:.0f} | {row['prompt_tok_s']:.0f} | {row['ttft_p50']:.0f} | {row['ttft_p99']:.0f} | "
              f"{row['itl_p50']:.1f} | {row['itl_p99']:.1f} | {row['preemptions']:.0f} | {row['keepalives']:.0f} |",
              flush=True)
        for f in fails[:5]:
            print(f"FAIL {f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if bad:
        print(f"FAIL {bad} requests failed", flush=True)
        return 1
    print("every request complete and well formed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
