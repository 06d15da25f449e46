"""Reference outputs with quantized KV and index-K caches (fake-quantized on insert),
for the quantization rules in the spec. Usage: python3 make_kv_oracle.py OUTDIR NAME KIND
(the tool that made tests/data/m3-tiny.kv-*.oracle.*, copied from the project's shared tools;
tools/make_bf16gemm_oracles.py --kv KIND applies its patch to the bf16-GEMM references)"""
import json, os, sys
import torch
from safetensors.torch import save_file
from transformers import cache_utils
from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as mm
from make_m3_oracle import build, hub_tensors, load_hub_into, run_reference
from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLForCausalLM

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
ODD = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1], dtype=torch.float64)

def fp8_rt(x):
    return x.float().clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(x.dtype)

def nvfp4_rt(x):
    """Per 16 consecutive channels of the last dim: s = e4m3(amax/6) (fp32 divide, RNE),
    q = e2m1 round-half-to-even-code(x/s) saturated at 6; value = e2m1(q)*s; s == 0 -> 0."""
    shp = x.shape; b = x.float().reshape(*shp[:-1], shp[-1] // 16, 16)
    s = (b.abs().amax(-1) / 6.0).clamp(max=448.0).to(torch.float8_e4m3fn).float()  # saturating, as the C
    y = (b / torch.where(s == 0, torch.ones_like(s), s)[..., None]).clamp(-6.0, 6.0).double()
    d = (y.abs()[..., None] - E2M1).abs() + ODD * 1e-9
    mag = E2M1[d.argmin(-1)]
    v = torch.where(y < 0, -mag, mag) * s.double()[..., None]
    v = torch.where((s == 0)[..., None], torch.zeros_like(v), v)
    return v.reshape(shp).to(x.dtype)

def patch(kind):
    q = {"bf16": lambda x: x.to(torch.bfloat16).to(x.dtype), "fp8": fp8_rt, "nvfp4": nvfp4_rt}[kind]
    orig_update = cache_utils.DynamicLayer.update
    def update(self, key_states, value_states, *a, **k):
        return orig_update(self, q(key_states), q(value_states), *a, **k)
    cache_utils.DynamicLayer.update = update
    orig_idx = mm.MiniMaxM3VLSparseCacheLayer.update_index
    def update_index(self, idx_k):
        return orig_idx(self, q(idx_k))
    mm.MiniMaxM3VLSparseCacheLayer.update_index = update_index
    # full forwards with use_cache=False would bypass the cache: give them one
    orig_fwd = MiniMaxM3VLForCausalLM.forward
    def fwd(self, *a, use_cache=None, past_key_values=None, **k):
        if past_key_values is None:
            from transformers import DynamicCache
            past_key_values = DynamicCache(config=self.config)
        return orig_fwd(self, *a, use_cache=True, past_key_values=past_key_values, **k)
    MiniMaxM3VLForCausalLM.forward = fwd

def main(out, name, kind):
    os.makedirs(out, exist_ok=True)
    cfg, model, prompts, gen, seed = build(name)
    hubt = hub_tensors(model, cfg)
    patch(kind)
    ref = MiniMaxM3VLForCausalLM(cfg).to(torch.float64).eval()
    load_hub_into(ref, {k: v.double() for k, v in hubt.items()}, cfg)
    tensors, cases = run_reference(ref, cfg, prompts[:4], gen, seed, f"{name}-kv-{kind}")
    tensors = {k: v for k, v in tensors.items() if ".hidden." not in k}
    save_file(tensors, os.path.join(out, f"{name}.kv-{kind}.oracle.safetensors"))
    json.dump({"model": name, "kv_cache_dtype": kind, "index_cache_dtype": kind,
               "reference": "transformers 5.17, float64, K/V/index-K rounded on insert as in the spec",
               "cases": cases}, open(os.path.join(out, f"{name}.kv-{kind}.oracle.json"), "w"), indent=1)

if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
