"""Vision-language reference checkpoints of other shapes, made with the shared VL oracle script
(../shared/tools/make_vl_oracle.py) so the vision path is checked on shapes it was not written
against:
  m3vl-heldout: vision head_dim 80 (26 channels per RoPE axis, 2 passed through, as in the real
                tower's 1280 / 16), 3 heads, 3 layers, projector 136, on the m3-gqa3 text shapes;
                a 333 x 97 image (resized to 336 x 84: width up, height down; grid 6 x 24).
  m3vl-big:     vision head_dim 48 (whole head rotated), 2 heads, 1 layer, on the m3-mqa text
                shapes; a 900 x 700 image that hits max_pixels (resized to 756 x 588, 2268 patches).
Runs where torch + transformers 5.17 exist (the GPU machine):
    python3 tools/make_heldout_vl_oracles.py ../shared/tools OUTDIR [NAME ...]
then copy OUTDIR/NAME/, NAME.oracle.safetensors, NAME.oracle.json and NAME.image.png into
tests/data/: ctest registers vision_NAME for every NAME present (tests/CMakeLists.txt)."""
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

VL_HELDOUT = {
    "m3vl-heldout": dict(text="m3-gqa3", seed=2468, vision=dict(hidden_size=240, intermediate_size=352, num_hidden_layers=3,
                         num_attention_heads=3), proj=136, image=(333, 97), image_token=700),
    "m3vl-big": dict(text="m3-mqa", seed=1357, vision=dict(hidden_size=96, intermediate_size=160, num_hidden_layers=1,
                     num_attention_heads=2), proj=72, image=(900, 700), image_token=400),
}

def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod

def main():
    tools, out = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tools)
    m3 = load("make_m3_oracle", os.path.join(tools, "make_m3_oracle.py"))
    held = load("make_heldout_oracles", os.path.join(HERE, "make_heldout_oracles.py"))
    m3.CONFIGS.update(held.HELDOUT)          # the text shapes m3-gqa3 / m3-mqa
    vl = load("make_vl_oracle", os.path.join(tools, "make_vl_oracle.py"))
    vl.VL.update(VL_HELDOUT)
    for n in sys.argv[3:] or list(VL_HELDOUT):
        vl.main(out, n)

if __name__ == "__main__":
    main()
