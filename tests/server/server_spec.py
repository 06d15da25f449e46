#!/usr/bin/env python3
"""`m3 serve --speculative-config` (issue 27, acceptance 3, on the CPU here): a DSpark draft beside
the target, 1, 16 and 64 concurrent streaming completions, every one complete and equal to what
the same server without speculation answers (greedy: on the CPU the forward is batch invariant per
token, so speculation changes no token), then /metrics: the speculative counters add up (drafts
per position, accepted <= verified, emitted = accepted + one per step when no stop cut a step),
MAL and the acceptance per position as gauges. The random draft of make-tiny accepts almost
nothing (its MAL is ~1): what acceptance does to the output is tests/spec's work (the lossless
rule by chi-square, drafts that agree with the target); here it is the server around it. Last,
vLLM's "disable_by_batch_size": past it the streams decode without drafts, alone one speculates.

  python3 tests/server/server_spec.py M3_BINARY WORK_DIR"""
import asyncio
import json
import os

import srvlib
from srvlib import check
import load_test as lt

K = 3
SPEC = '{"method": "dspark", "num_speculative_tokens": %d, "draft_sample_method": "greedy"}' % K


async def texts(port, prompts, max_tokens):
    """the streamed completions of the prompts, all at once; None for one that failed"""
    async def one(p):
        body = {"prompt": p, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        try:
            status, headers, r, w = await lt.http("127.0.0.1", port, "POST", "/v1/completions", body, 120.0)
            raw = b"".join([c async for c in lt.body_chunks(r, headers, 120.0)])
            w.close()
        except Exception as e:  # noqa: BLE001 (the failure is the check's message)
            return None, f"{type(e).__name__}: {e}"
        if status != 200:
            return None, f"status {status}"
        events = [x[6:] for x in raw.decode("utf-8", "replace").split("\n\n") if x.startswith("data: ")]
        if not events or events[-1] != "[DONE]":
            return None, "no [DONE]"
        out, finish = "", None
        for e in events[:-1]:
            j = json.loads(e)
            for c in j.get("choices", []):
                out += c.get("text", "")
                finish = c.get("finish_reason") or finish
        return (out if finish == "length" else None), f"finish {finish}"
    return await asyncio.gather(*[one(p) for p in prompts])


async def finished(port, n):
    """/metrics once n requests have finished and the engine has published the step they ended in.
    The finished count is the server's (a request's last token reaching it, during the step); the
    engine's counters (the speculative ones, the running gauge) are published at the end of the step:
    a read between the two saw the finished count but not the last step's decodes (seen once in CI:
    351 against 361 decodes without drafts). Running 0 and nothing waiting in the engine's numbers,
    once the n have finished, is that end (waits for the state)"""
    got = {}

    async def ready():
        m = got["m"] = await lt.metrics("127.0.0.1", port)
        return (m.get('m3_requests_finished_total{finish_reason="length"}', 0) >= n and m.get("m3_num_requests_running", -1) == 0
                and m.get("m3_num_requests_waiting", -1) == 0)
    await srvlib.wait_for(f"{n} finished requests in /metrics", ready)
    return got["m"]


# tokens a completion: 24, or 10 in the sanitizer builds (M3_SANITIZED; 6 minutes of a 2-core CI run at 24;
# still several verify steps of k 3 per request)
NTOK = 10 if os.environ.get("M3_SANITIZED") else 24


async def main(m3, work):
    ck = srvlib.make_checkpoint(m3, os.path.join(work, "ck"), ["--with-dspark"])
    prompts = [f"Prompt {i}: " + " ".join(str((i * 7 + j) % 97) for j in range(i % 11 + 1)) for i in range(64)]
    want = {}
    srv = srvlib.Server(m3, ck, ["--max-num-seqs", "64"])
    try:
        got = await texts(srv.port, prompts, NTOK)
        for p, (t, why) in zip(prompts, got):
            want[p] = t
        check(all(t is not None for t, _ in got), "without speculation: 64 completions, each complete")
    finally:
        srv.stop()
    srv = srvlib.Server(m3, ck, ["--max-num-seqs", "64", "--speculative-config", SPEC])
    try:
        for n in (1, 16, 64):
            got = await texts(srv.port, prompts[:n], NTOK)
            bad = [(i, why) for i, (t, why) in enumerate(got) if t is None]
            check(not bad, f"{n} concurrent streams with DSpark k {K}: every one complete ({bad[:3]})")
            diff = [i for i, (t, _) in enumerate(got) if t is not None and t != want[prompts[i]]]
            check(not diff, f"... each equal to the answer without speculation (differ: {diff[:5]})")
        m = await finished(srv.port, 1 + 16 + 64)
        steps = m.get("m3_spec_decode_num_drafts_total", 0)
        drafted = m.get("m3_spec_decode_num_draft_tokens_total", -1)
        acc = m.get("m3_spec_decode_num_accepted_tokens_total", -1)
        emitted = m.get("m3_spec_decode_num_emitted_tokens_total", -1)
        per_d = [m.get(f'm3_spec_decode_num_drafts_per_pos_total{{position="{i}"}}', -1) for i in range(K)]
        per_a = [m.get(f'm3_spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}', -1) for i in range(K)]
        rate = [m.get(f'm3_spec_decode_acceptance_rate{{position="{i}"}}', -1) for i in range(K)]
        mal = m.get("m3_spec_decode_mean_accepted_length", -1)
        check(steps > 0 and drafted > 0, f"/metrics: speculative steps ({steps:.0f}) and draft tokens ({drafted:.0f})")
        check(sum(per_d) == drafted and 0 <= acc <= drafted and sum(per_a) == acc,
              f"... per-position counts add up (drafted {per_d} = {drafted:.0f}, accepted {per_a} = {acc:.0f})")
        check(all(per_a[i] <= per_d[i] for i in range(K)) and all(per_d[i + 1] <= per_d[i] for i in range(K - 1)),
              f"... a position is verified only after the one before it ({per_d}), accepted at most as often ({per_a})")
        check(steps <= emitted <= acc + steps, f"... emitted tokens between one per step and accepted + one ({emitted:.0f})")
        check(abs(mal - emitted / steps) < 1e-4 and 1 <= mal <= K + 1, f"... MAL {mal:.4f} = emitted / steps, within 1..{K + 1}")
        check(all(abs(rate[i] - (per_a[i] / per_d[i] if per_d[i] else 0)) < 1e-4 for i in range(K)),
              f"... acceptance per position {rate} = accepted / verified there")
        check(m.get('m3_requests_finished_total{finish_reason="length"}', 0) == 1 + 16 + 64,
              "... and every request finished by its length")
        # the same under vLLM's names (label model_name: whatever the server calls the model)
        vl = {k.split("{")[0] + ("{" + k.split("{", 1)[1].split("model_name=")[0].rstrip(",") + "}" if "position=" in k else ""): x
              for k, x in m.items() if k.startswith("vllm:spec_decode")}
        check(vl.get("vllm:spec_decode_num_drafts_total") == steps and vl.get("vllm:spec_decode_num_draft_tokens_total") == drafted
              and vl.get("vllm:spec_decode_num_accepted_tokens_total") == acc
              and [vl.get(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}') for i in range(K)] == per_a,
              f"... and under vLLM's names (vllm:spec_decode_*: {len(vl)} series)")
        check(m.get("m3_spec_decode_num_decodes_without_drafts_total", -1) == 0,
              "... no decode ran without drafts (no disable_by_batch_size)")
    finally:
        srv.stop()
    # vLLM's disable_by_batch_size: 16 streams over a limit of 8 decode without drafts (the same
    # answers), one stream alone speculates
    spec8 = SPEC[:-1] + ', "disable_by_batch_size": 8}'
    srv = srvlib.Server(m3, ck, ["--max-num-seqs", "64", "--speculative-config", spec8])
    try:
        line = next((x for x in srv.log.splitlines() if "speculative decoding:" in x), "")
        check(f"{K} drafts a step (greedy)" in line and "off above 8 running" in line,
              f"the start-up log states the speculation: {line!r}")
        got = await texts(srv.port, prompts[:16], NTOK)
        ok = all(t is not None and t == want[prompts[i]] for i, (t, _) in enumerate(got))
        m = await finished(srv.port, 16)
        off, steps16 = m.get("m3_spec_decode_num_decodes_without_drafts_total", -1), m.get("m3_spec_decode_num_drafts_total", -1)
        check(ok and off > 0, f"disable_by_batch_size 8, 16 streams: every answer complete and equal to plain decoding's, "
                              f"{off:.0f} decodes without drafts, {steps16:.0f} speculative steps")
        got = await texts(srv.port, prompts[:1], NTOK)
        m = await finished(srv.port, 17)
        steps1 = m.get("m3_spec_decode_num_drafts_total", -1) - steps16
        check(got[0][0] == want[prompts[0]] and steps1 > 0 and m.get("m3_spec_decode_num_decodes_without_drafts_total", -1) == off,
              f"... one stream alone speculates ({steps1:.0f} speculative steps, decodes without drafts "
              f"{m.get('m3_spec_decode_num_decodes_without_drafts_total', -1):.0f} (before: {off:.0f}), answer {got[0][1]})")
    finally:
        srv.stop()


if __name__ == "__main__":
    srvlib.run(main, "server_spec", __doc__)
