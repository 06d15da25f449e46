#!/usr/bin/env python3
"""Loglikelihood throughput of an OpenAI-compatible server, as lm-evaluation-harness's
local-completions model asks for it: POST /v1/completions with a batch of token-id prompts,
echo true, logprobs K, max_tokens 1, temperature 0; the answer's per-token entries are the
prompt's logprobs (the first null) and the generated token's.

Prints, for the same distinct prompts (no two share a prefix: nothing comes from a prefix cache),
the plain requests (max_tokens 1, no echo: the prefill alone) and the loglikelihood ones:
requests/s, prompt tokens/s, latency p50 / p99. Every loglikelihood answer is checked: 200, one
choice per prompt in index order, L + 1 entries, the first null, the others finite and <= 0, each
position's top_logprobs dict holding a value at least its token's. Standard library only.

usage: tools/bench_loglik.py [--base URL] [--requests N] [--concurrency C] [--batch B]
                             [--prompt-tokens L] [--logprobs K] [--vocab V] [--json FILE]
"""
import argparse
import concurrent.futures as cf
import json
import math
import sys
import time
import urllib.request


def post(base, body, timeout):
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        j = json.loads(r.read())
    return time.perf_counter() - t, j


def check(j, prompts):
    ch = sorted(j.get("choices", []), key=lambda c: c["index"])
    if len(ch) != len(prompts):
        return f"{len(ch)} choices for {len(prompts)} prompts"
    for c, p in zip(ch, prompts):
        lp = c.get("logprobs") or {}
        tl, top = lp.get("token_logprobs", []), lp.get("top_logprobs", [])
        if len(tl) != len(p) + 1 or len(top) != len(p) + 1:
            return f"{len(tl)} entries for a prompt of {len(p)} tokens + 1"
        if tl[0] is not None or top[0] is not None:
            return "the first prompt token has a logprob"
        for x, d in zip(tl[1:], top[1:]):
            if not isinstance(x, (int, float)) or not math.isfinite(x) or x > 0:
                return f"a logprob of {x!r}"
            if not d or max(d.values()) < x:  # its token's value, or a likelier one of the same text
                return "a position's top_logprobs holds nothing as likely as its token"
    return None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def run(args, bodies, kind):
    lat, fails = [], []
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(args.concurrency) as ex:
        futs = {ex.submit(post, args.base, b, args.timeout): b for b in bodies}
        for f in cf.as_completed(futs):
            try:
                dt, j = f.result()
                lat.append(dt)
                if kind == "loglikelihood":
                    why = check(j, futs[f]["prompt"])
                    if why:
                        fails.append(why)
            except Exception as e:  # a refused or broken request counts as failed
                fails.append(str(e)[:200])
    secs = time.perf_counter() - t0
    toks = sum(len(p) for b in bodies for p in b["prompt"])
    return {"kind": kind, "requests": len(bodies), "failed": len(fails), "seconds": round(secs, 3),
            "req_s": round(len(bodies) / secs, 2), "prompt_tok_s": round(toks / secs, 1),
            "lat_p50_ms": round(1e3 * pct(lat, 50), 1), "lat_p99_ms": round(1e3 * pct(lat, 99), 1),
            "why": fails[:3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4, help="prompts a request (lm-eval's batch_size)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--logprobs", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=100000, help="prompt ids are drawn below this")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    s = 0x9E3779B97F4A7C15

    def prompt():
        nonlocal s
        out = []
        for _ in range(args.prompt_tokens):
            s ^= (s << 13) & (2**64 - 1); s ^= s >> 7; s ^= (s << 17) & (2**64 - 1)
            out.append(100 + s % (args.vocab - 100))
        return out

    def bodies(extra):
        out = []
        for _ in range(args.requests):
            b = {"prompt": [prompt() for _ in range(args.batch)], "max_tokens": 1, "temperature": 0, **extra}
            if args.model:
                b["model"] = args.model
            out.append(b)
        return out

    print(f"# loglikelihood bench: {args.base}, {args.requests} requests of {args.batch} x {args.prompt_tokens}-token "
          f"prompts, {args.concurrency} at once, logprobs {args.logprobs}; every prompt distinct")
    run(args, bodies({})[:2], "warm-up")
    rows = [run(args, bodies({}), "plain (prefill + 1 token)"),
            run(args, bodies({"echo": True, "logprobs": args.logprobs}), "loglikelihood")]
    print("| kind | requests | failed | seconds | req/s | prompt tok/s | latency p50 ms | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['requests']} | {r['failed']} | {r['seconds']} | {r['req_s']} | {r['prompt_tok_s']} | "
              f"{r['lat_p50_ms']} | {r['lat_p99_ms']} |")
        for w in r["why"]:
            print(f"  failed: {w}")
    if args.json:
        json.dump(rows, open(args.json, "w"), indent=1)
    bad = sum(r["failed"] for r in rows)
    print("every answer complete and well formed" if not bad else f"FAILED: {bad} requests")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
