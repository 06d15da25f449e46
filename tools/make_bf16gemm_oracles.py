"""References of the bf16 precision mode (issue 25's accuracy contract): the same cases as an
existing reference checkpoint's oracle, through the same float64 transformers model, with the
input of every product with a weight rounded to bf16 first (the attention and indexer
projections, the dense / shared / routed experts, the router, lm_head) and nothing else: what
the tensor-core path computes up to the order of its f32 sums (m3 --precision bf16, CPU and GPU).

Runs where torch + transformers 5.17 exist:
    python3 tools/make_bf16gemm_oracles.py [--kv bf16|fp8|nvfp4] PATH/TO/make_m3_oracle.py DATA_DIR OUT_DIR NAME [NAME ...]
For each NAME it reads DATA_DIR/NAME (config.json + model.safetensors, bf16 or MXFP8 + NVFP4)
and DATA_DIR/NAME.oracle.safetensors (the cases' prompt ids; the number of greedy steps), and
writes OUT_DIR/NAME.bf16gemm.oracle.safetensors (+ .json) with the same keys.
With --kv KIND the K / V / index-K rows are also rounded on insert into the cache as the spec's
cache dtype KIND does (tools/make_kv_oracle.py's patch, the references m3 --kv-cache-dtype KIND is
checked against): it reads DATA_DIR/NAME.kv-KIND.oracle.safetensors and writes
OUT_DIR/NAME.kv-KIND.bf16gemm.oracle.safetensors, with every layer's hidden states (the exact KV
references have none) for the teacher-forced check.

A product counts as one with a weight when one operand shares storage with a parameter of the
model (F.linear, matmul, bmm, mm, @): its other operand is rounded (round to nearest even),
the product itself stays float64. Each forward pass prints how many products it rounded.

The text attention's two products are GEMMs of the bf16 precision too (src/backend/cuda/attn_mma.cuh
defines them): q, K and V rounded to bf16, scores in log2 units s2 = (q . k) * sl with sl the f32
value of f32(1 / sqrt(D)) * f32(log2 e), M = ceil(max s2) per row, P = bf16(2^(s2 - M)) and
out = sum P v / sum P (eager attention replaced for MiniMaxM3VLAttention only; the indexer's
scores stay as they are)."""
import contextlib
import importlib.util
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file


def oracle_module(path):
    spec = importlib.util.spec_from_file_location("make_m3_oracle", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_m3_oracle"] = mod
    spec.loader.exec_module(mod)
    return mod


def text_config(hub):
    """the checkpoint's config.json (hub layout) -> MiniMaxM3VLTextConfig kwargs (make_m3_oracle's build)"""
    t = hub.get("text_config", hub)
    sp = t["sparse_attention_config"]
    n = t["num_hidden_layers"]
    c = dict(vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], num_hidden_layers=n,
             num_attention_heads=t["num_attention_heads"], num_key_value_heads=t["num_key_value_heads"],
             head_dim=t["head_dim"], rotary_dim=t["rotary_dim"], intermediate_size=t["intermediate_size"],
             shared_intermediate_size=t["shared_intermediate_size"],
             dense_intermediate_size=t["dense_intermediate_size"], num_local_experts=t["num_local_experts"],
             num_experts_per_tok=t["num_experts_per_tok"], routed_scaling_factor=t["routed_scaling_factor"],
             index_n_heads=sp["sparse_num_index_heads"], index_head_dim=sp["sparse_index_dim"],
             index_block_size=sp["sparse_block_size"], index_topk_blocks=sp["sparse_topk_blocks"],
             index_local_blocks=sp["sparse_local_block"],
             layer_types=["minimax_m3_sparse" if f else "full_attention" for f in sp["sparse_attention_freq"]],
             mlp_layer_types=["sparse" if f else "dense" for f in t["moe_layer_freq"]],
             swiglu_alpha=t["swiglu_alpha"], swiglu_limit=t["swiglu_limit"], rms_norm_eps=t["rms_norm_eps"],
             max_position_embeddings=t["max_position_embeddings"], bos_token_id=t["bos_token_id"],
             eos_token_id=t["eos_token_id"],
             rope_parameters={"rope_type": "default", "rope_theta": t["rope_theta"],
                              "partial_rotary_factor": t["rotary_dim"] / t["head_dim"]})
    assert len(c["layer_types"]) == n and len(c["mlp_layer_types"]) == n
    return c


def dequantized(mo, tensors):
    """hub tensors -> {hub name of each weight: float64 values}: MXFP8 (weight + weight_scale_inv)
    and NVFP4 (weight_packed + weight_scale + weight_global_scale) decoded as make_m3_oracle does"""
    deq, used = {}, set()
    for k, v in tensors.items():
        if k.endswith(".weight_packed"):
            b = k[: -len(".weight_packed")]
            deq[b + ".weight"] = mo.nvfp4_deq(v, tensors[b + ".weight_scale"], tensors[b + ".weight_global_scale"])
            used |= {k, b + ".weight_scale", b + ".weight_global_scale"}
        elif k.endswith(".weight_scale_inv"):
            b = k[: -len(".weight_scale_inv")]
            deq[b + ".weight"] = mo.mxfp8_deq(tensors[b + ".weight"], v)
            used |= {k, b + ".weight"}
    for k, v in tensors.items():
        if k not in used and k not in deq:
            deq[k] = v.double()
    return deq


@contextlib.contextmanager
def bf16_gemm_inputs(model, counter):
    ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def is_w(t):
        return isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in ptrs

    def rnd(x):
        counter[0] += 1
        return x.to(torch.bfloat16).to(x.dtype)

    F = torch.nn.functional
    saved = {"linear": F.linear, "matmul": torch.matmul, "bmm": torch.bmm, "mm": torch.mm,
             "__matmul__": torch.Tensor.__matmul__}

    def linear(x, w, b=None):
        return saved["linear"](rnd(x) if is_w(w) and not is_w(x) else x, w, b)

    def product(name):
        def f(a, b, *args, **kw):
            if is_w(b) and not is_w(a):
                a = rnd(a)
            elif is_w(a) and not is_w(b):
                b = rnd(b)
            return saved[name](a, b, *args, **kw)
        return f

    F.linear = linear
    torch.matmul, torch.bmm, torch.mm = product("matmul"), product("bmm"), product("mm")
    torch.Tensor.__matmul__ = product("__matmul__")
    try:
        yield
    finally:
        F.linear = saved["linear"]
        torch.matmul, torch.bmm, torch.mm = saved["matmul"], saved["bmm"], saved["mm"]
        torch.Tensor.__matmul__ = saved["__matmul__"]


@contextlib.contextmanager
def bf16_attention(counter):
    """the text attention at precision bf16 (the module header); counter[0] counts its calls"""
    import numpy as np
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as mm
    saved = mm.eager_attention_forward

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if not isinstance(module, mm.MiniMaxM3VLAttention):
            return saved(module, query, key, value, attention_mask, scaling, dropout=dropout, **kwargs)
        counter[0] += 1
        r = lambda x: x.to(torch.bfloat16).to(x.dtype)
        D = query.shape[-1]
        assert abs(scaling - D ** -0.5) < 1e-12, f"attention scaling {scaling}: the definition takes 1 / sqrt(head_dim)"
        sl = float(np.float32(np.float32(1.0) / np.sqrt(np.float32(D))) * np.float32(1.4426950408889634))
        k = r(mm.repeat_kv(key, module.num_key_value_groups))
        v = r(mm.repeat_kv(value, module.num_key_value_groups))
        s2 = torch.matmul(r(query), k.transpose(2, 3)) * sl
        if attention_mask is not None:
            s2 = s2 + attention_mask  # 0 or the dtype's lowest: exp2 of it is 0
        M = torch.ceil(s2.amax(dim=-1, keepdim=True))
        p = r(torch.exp2(s2 - M))
        out = torch.matmul(p, v) / p.sum(dim=-1, keepdim=True)
        return out.transpose(1, 2).contiguous(), p

    mm.eager_attention_forward = attention
    try:
        yield
    finally:
        mm.eager_attention_forward = saved


def run_cases(model, cfg, oracle, tag, hidden=False):
    """make_m3_oracle.run_reference on the oracle's own prompts (the layers' hidden states where the
    oracle has them, or with hidden)"""
    from transformers import DynamicCache
    tensors, cases, picks = {}, [], {}
    for i, layer in enumerate(model.model.layers):
        if layer.self_attn.indexer is not None:
            def hook(mod, args, kwargs, output, i=i):
                picks[i] = output.detach().clone()
            layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True)
    k = 0
    while f"case{k}.input_ids" in oracle:
        ids = oracle[f"case{k}.input_ids"].long()[None]
        gen = int(oracle[f"case{k}.greedy_tokens"].numel()) if f"case{k}.greedy_tokens" in oracle else 0
        L = ids.shape[1]
        picks.clear()
        counter, attn = [0], [0]
        with torch.no_grad(), bf16_gemm_inputs(model, counter), bf16_attention(attn):
            want_hidden = hidden or f"case{k}.hidden.0" in oracle
            o = model(input_ids=ids, use_cache=False, output_hidden_states=want_hidden)
            per_pass = counter[0]
            tensors[f"case{k}.input_ids"] = ids[0].to(torch.int32)
            tensors[f"case{k}.logits"] = o.logits[0].float()
            if want_hidden:
                for li, h in enumerate(o.hidden_states):
                    tensors[f"case{k}.hidden.{li}"] = h[0].float()
            for li, p in picks.items():
                tensors[f"case{k}.index_blocks.layer{li}"] = p[0].to(torch.int32)
            cache = DynamicCache(config=cfg)
            toks, steps = [], []
            o = model(input_ids=ids, past_key_values=cache, use_cache=True)
            for t in range(gen):
                lg = o.logits[0, -1]
                nxt = int(torch.argmax(lg))
                steps.append(lg.clone())
                toks.append(nxt)
                o = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True,
                          position_ids=torch.tensor([[L + t]]))
        if gen:
            tensors[f"case{k}.greedy_tokens"] = torch.tensor(toks, dtype=torch.int32)
            tensors[f"case{k}.greedy_logits"] = torch.stack(steps).float()
        same = gen and torch.equal(tensors[f"case{k}.greedy_tokens"], oracle[f"case{k}.greedy_tokens"])
        cases.append({"case": k, "prompt_len": L, "generated": gen, "products_rounded_per_pass": per_pass,
                      "greedy_tokens_as_exact_oracle": bool(same)})
        print(tag, "case", k, "len", L, "products rounded in the prompt pass", per_pass,
              "greedy tokens as the exact oracle:", bool(same), flush=True)
        assert per_pass > 0, "no product with a weight was seen: the rounding hook caught nothing"
        assert attn[0] >= cfg.num_hidden_layers, "the bf16 attention was not called: the eager hook caught nothing"
        k += 1
    return tensors, cases


def main():
    argv = sys.argv[1:]
    kv = None
    if argv[:1] == ["--kv"]:
        kv, argv = argv[1], argv[2:]
        if kv not in ("bf16", "fp8", "nvfp4"):
            sys.exit(f"--kv {kv}: the cache dtypes are bf16, fp8 and nvfp4")
    if len(argv) < 4:
        sys.exit("usage: make_bf16gemm_oracles.py [--kv bf16|fp8|nvfp4] make_m3_oracle.py DATA_DIR OUT_DIR NAME [NAME ...]")
    mo = oracle_module(argv[0])
    data, out = argv[1], argv[2]
    os.makedirs(out, exist_ok=True)
    tag = f".kv-{kv}" if kv else ""
    if kv:  # make_kv_oracle imports make_m3_oracle by name: oracle_module registered it
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import make_kv_oracle
        make_kv_oracle.patch(kv)
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig
    from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLForCausalLM
    for name in argv[3:]:
        d = os.path.join(data, name)
        hub = json.load(open(os.path.join(d, "config.json")))
        cfg = MiniMaxM3VLTextConfig(**text_config(hub))
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = "eager"
        model = MiniMaxM3VLForCausalLM(cfg).to(torch.float64).eval()
        mo.load_hub_into(model, dequantized(mo, load_file(os.path.join(d, "model.safetensors"))), cfg)
        # the cases' prompts: the exact reference of this cache dtype, else the model's own (the same prompts)
        of = os.path.join(data, name + tag + ".oracle.safetensors")
        oracle = load_file(of if os.path.exists(of) else os.path.join(data, name + ".oracle.safetensors"))
        tensors, cases = run_cases(model, cfg, oracle, name + tag, hidden=kv is not None)
        save_file(tensors, os.path.join(out, name + tag + ".bf16gemm.oracle.safetensors"))
        meta = {"model": name, "reference": "transformers 5.17 MiniMaxM3VLForCausalLM, eager, float64, every "
                "product with a weight taking its other operand rounded to bf16, the text attention at bf16 (q, K, V "
                "and the probabilities; tools/make_bf16gemm_oracles.py)",
                "cases": cases}
        if kv:
            meta.update({"kv_cache_dtype": kv, "index_cache_dtype": kv,
                         "kv_rounding": "K/V/index-K rounded on insert as in the spec (tools/make_kv_oracle.py)"})
        json.dump(meta, open(os.path.join(out, name + tag + ".bf16gemm.oracle.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
