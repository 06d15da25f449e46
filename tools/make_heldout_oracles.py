"""More reference checkpoints of other shapes, made with the shared oracle script
(../shared/tools/make_m3_oracle.py) so the engine is checked on shapes it was not written
against: GQA 3 and 4 (MQA), head/rotary/indexer sizes that are not powers of two, a quarter
rotary factor, local_blocks 2, MoE before dense layers, top-1 and top-3 routing.
Runs where torch + transformers 5.17 exist:
    python3 tools/make_heldout_oracles.py PATH/TO/make_m3_oracle.py OUTDIR [NAME ...]"""
import importlib.util
import sys

HELDOUT = {
    "m3-gqa3": dict(seed=7, vocab_size=777, hidden_size=96, num_hidden_layers=5,
        num_attention_heads=6, num_key_value_heads=2, head_dim=48, rotary_dim=24,
        intermediate_size=64, shared_intermediate_size=32, dense_intermediate_size=96,
        num_local_experts=6, num_experts_per_tok=3, routed_scaling_factor=1.5,
        index_n_heads=2, index_head_dim=40, index_block_size=8, index_topk_blocks=4,
        index_local_blocks=2, rope_theta=50000.0,
        layer_types=["minimax_m3_sparse", "full_attention", "minimax_m3_sparse", "minimax_m3_sparse", "full_attention"],
        mlp_layer_types=["sparse", "dense", "sparse", "dense", "sparse"],
        prompts=[5, 33, 130, 300], gen=12),
    "m3-mqa": dict(seed=99, vocab_size=500, hidden_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, rotary_dim=16,
        intermediate_size=32, shared_intermediate_size=64, dense_intermediate_size=128,
        num_local_experts=4, num_experts_per_tok=1, routed_scaling_factor=2.0,
        index_n_heads=1, index_head_dim=64, index_block_size=32, index_topk_blocks=2,
        index_local_blocks=1, rope_theta=1000000.0,
        layer_types=["minimax_m3_sparse", "minimax_m3_sparse", "full_attention"],
        mlp_layer_types=["dense", "sparse", "sparse"],
        prompts=[3, 100, 250], gen=10),
}

def main():
    spec = importlib.util.spec_from_file_location("make_m3_oracle", sys.argv[1])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["make_m3_oracle"] = mod
    spec.loader.exec_module(mod)
    mod.CONFIGS.update(HELDOUT)
    names = sys.argv[3:] or list(HELDOUT)
    for n in names:
        mod.main(sys.argv[2], n)

if __name__ == "__main__":
    main()
