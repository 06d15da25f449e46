#!/usr/bin/env python3
"""A queue longer than --timeout loses nothing (issue 22): `m3 serve --timeout 1 --max-num-seqs 2`
held by two endless streams while 64 streaming clients queue behind them. The test waits for
states, not for time: the 64 are waiting and the server has sent each of them keep-alive comments
for longer than the timeout (m3_stream_keepalives_total); then the two hogs leave and every one
of the 64 must complete, well formed (tools/load_test.py's checks), with the keep-alives seen by
its client. Then the same load without hogs at --max-num-seqs 64.

  python3 tests/server/server_queue.py M3_BINARY WORK_DIR"""
import asyncio
import os
import sys

import srvlib
from srvlib import check
import load_test as lt


async def main(m3, work):
    ck = srvlib.make_checkpoint(m3, os.path.join(work, "ck"))
    srv = srvlib.Server(m3, ck, ["--timeout", "1", "--max-num-seqs", "2", "--max-model-len", "65536"])
    host, port = "127.0.0.1", srv.port
    try:
        m = await lt.metrics(host, port)
        check(m.get("m3_kv_capacity_tokens", 0) > 0, f"pool of {m.get('m3_kv_capacity_tokens')} tokens")
        # two streams that would run for ages hold both sequence slots
        hogs = []
        for i in range(2):
            body = {"prompt": f"hog {i}", "max_tokens": 60000, "ignore_eos": True, "stream": True}
            st, headers, r, w = await lt.http(host, port, "POST", "/v1/completions", body)
            check(st == 200, f"hog {i} streams")
            hogs.append(w)

        async def running2():
            return (await lt.metrics(host, port)).get("m3_num_requests_running", 0) >= 2
        await srvlib.wait_for("both hogs running", running2)
        args = type("A", (), {"model": None, "max_tokens": 24, "prompt_tokens": 40, "timeout": 600.0})()
        prompts = await lt.make_prompts(host, port, 0, 64, args.prompt_tokens)
        k0 = (await lt.metrics(host, port)).get("m3_stream_keepalives_total", 0)
        recs, fails = [], []

        async def client(i):
            text, n = prompts[i]
            body = {"prompt": text, "max_tokens": args.max_tokens, "ignore_eos": True, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}}
            try:
                recs.append(await lt.one_request(host, port, body, n, args.max_tokens, args.timeout))
            except Exception as e:  # every failure is reported below
                fails.append(f"client {i}: {type(e).__name__}: {e}")
        load = asyncio.ensure_future(asyncio.gather(*(client(i) for i in range(64))))

        state = {}

        async def queued():
            m = await lt.metrics(host, port)
            # each of the 64 has had at least 4 keep-alives, at 0.5 s apart: 2 s queued, twice --timeout
            state["ok"] = m.get("m3_num_requests_waiting", 0) >= 64 and m.get("m3_stream_keepalives_total", 0) - k0 >= 4 * 64
            return state["ok"] or load.done()  # clients that gave up end the wait
        await srvlib.wait_for("64 streams queued past --timeout", queued)
        check(state.get("ok"), "64 streams waited in the queue for longer than --timeout, kept alive")
        for w in hogs:
            w.close()
        await load
        for f in fails[:5]:
            print("  " + f)
        check(not fails and len(recs) == 64, f"every queued request complete and well formed ({len(recs)} of 64, "
              f"{len(fails)} failed)")
        check(all(r["comments"] >= 2 for r in recs), "each queued client saw keep-alive comments "
              f"(fewest {min((r['comments'] for r in recs), default=0)})")
        m = await lt.metrics(host, port)
        check(m.get('m3_http_responses_total{code="499"}', 0) == 2, "only the two hogs ended as client-closed")
    finally:
        srv.stop()
    # the same 64 clients at once with room for all of them
    srv = srvlib.Server(m3, ck, ["--timeout", "1", "--max-num-seqs", "64"])
    try:
        args = type("A", (), {})()
        args.model, args.max_tokens, args.prompt_tokens, args.timeout = None, 24, 40, 600.0
        row, fails = await lt.level("127.0.0.1", srv.port, 64, 2, 1000, args)
        for f in fails[:5]:
            print("  " + f)
        check(row["failed"] == 0 and row["requests"] == 128, f"64 clients x 2 requests: {row['requests']} requests, "
              f"{row['failed']} failed, {row['preemptions']:.0f} preemptions")
    finally:
        srv.stop()


if __name__ == "__main__":
    srvlib.run(main, "server_queue", __doc__)
