"""Reference outputs with the routed experts' FC1 input quantized to NVFP4 per token (spec section
1: the M3.1 experts were trained so; m3 --moe-act-quant nvfp4). The quantized tiny checkpoint
(m3-tiny-q: MXFP8 linears, NVFP4 routed experts) through the float64 transformers model, with a
pre-hook on every MoE layer's experts module that replaces its input x (the FC1 input: gate and
up read it, down reads h) by the rule of src/backend/cpu/act_quant.c, in float32 with each operation
rounded once:
    amax = max |x| over the token's row; gs = 2688 / amax; y = x * gs;
    per 16 values the KV cache's NVFP4 rule on y (make_kv_oracle.nvfp4_rt: s = e4m3(amax16 / 6),
    nearest E2M1 of y / s, ties to the even code); out = (e2m1 * s) / gs;
    a row of zeros, with a value that is not finite, or whose gs overflows (amax below ~7.9e-36),
    kept as it is; a value rounded to zero is +0.
The router and the shared expert read x as it is.
Usage (where torch + transformers 5.17 exist; make_m3_oracle.py and make_kv_oracle.py beside it):
    python3 tools/make_act_oracle.py OUTDIR [CHECKPOINT_DIR]
(CHECKPOINT_DIR: the stored m3-tiny-q, whose tensors must equal the ones rebuilt here byte for byte)
writes OUTDIR/m3-tiny-q.act-nvfp4.oracle.safetensors (+ .json): the first 4 cases of
m3-tiny-q.oracle (the same prompts), logits, block picks and greedy steps."""
import json, os, sys
import torch
from safetensors.torch import save_file
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_m3_oracle import build, hub_tensors, load_hub_into, quantize_hub, run_reference
from make_kv_oracle import nvfp4_rt
from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLForCausalLM


def act_nvfp4(x):
    shp = x.shape
    xf = x.float().reshape(-1, shp[-1])
    amax = xf.abs().amax(-1, keepdim=True)
    ok = (amax > 0) & torch.isfinite(xf).all(-1, keepdim=True)
    gs = torch.tensor(2688.0, dtype=torch.float32) / torch.where(ok, amax, torch.ones_like(amax))
    ok &= torch.isfinite(gs)  # gs overflows below amax ~7.9e-36: kept as is
    gs = torch.where(ok, gs, torch.ones_like(gs))
    v = (nvfp4_rt(xf * gs) + 0.0) / gs  # + 0.0: a value rounded to zero is +0, as the C code writes
    return torch.where(ok, v, xf).reshape(shp).to(x.dtype)


def patch(model, counter):
    n = 0
    for layer in model.model.layers:
        ex = getattr(layer.mlp, "experts", None)
        if ex is None:
            continue
        def pre(mod, args, kwargs):
            counter[0] += 1
            if args:
                return (act_nvfp4(args[0]),) + tuple(args[1:]), kwargs
            kwargs = dict(kwargs)
            kwargs["hidden_states"] = act_nvfp4(kwargs["hidden_states"])
            return args, kwargs
        ex.register_forward_pre_hook(pre, with_kwargs=True)
        n += 1
    return n


def main(out):
    os.makedirs(out, exist_ok=True)
    name = "m3-tiny"
    cfg, model, prompts, gen, seed = build(name)
    hubt = hub_tensors(model, cfg)
    qt, deq = quantize_hub(hubt)
    if len(sys.argv) > 2:  # the checkpoint the engine reads holds exactly these weights
        from safetensors.torch import load_file
        st = load_file(os.path.join(sys.argv[2], "model.safetensors"))
        assert set(st) == set(qt), f"tensor names differ: {sorted(set(st) ^ set(qt))[:5]}"
        for k, v in qt.items():
            assert st[k].dtype == v.dtype and torch.equal(st[k].view(torch.uint8), v.contiguous().view(torch.uint8)), k
        print("the stored checkpoint's", len(st), "tensors equal the rebuilt ones", flush=True)
    ref = MiniMaxM3VLForCausalLM(cfg).to(torch.float64).eval()
    load_hub_into(ref, deq, cfg)
    counter = [0]
    n = patch(ref, counter)
    assert n == sum(1 for t in cfg.mlp_layer_types if t == "sparse"), f"{n} experts modules patched"
    tensors, cases = run_reference(ref, cfg, prompts[:4], gen, seed, name + "-q-act-nvfp4")
    assert counter[0] > 0, "the experts' pre-hook never ran"
    print("experts calls quantized:", counter[0], flush=True)
    tensors = {k: v for k, v in tensors.items() if ".hidden." not in k}
    base = os.path.join(out, name + "-q.act-nvfp4.oracle")
    save_file(tensors, base + ".safetensors")
    json.dump({"model": name + "-q", "moe_act_quant": "nvfp4",
               "reference": "transformers 5.17, float64, on the dequantized MXFP8/NVFP4 weights; the routed experts' "
                            "FC1 input quantized to NVFP4 per token (tools/make_act_oracle.py)",
               "cases": cases}, open(base + ".json", "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
