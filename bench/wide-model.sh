#!/usr/bin/env bash
# A synthetic 1 GB model for the memory-wall benchmark: SmolLM2's tokenizer and llama
# architecture, widened to d=1536, 18 layers, FFN 4096, 12 heads / 4 KV heads (≈ 530M
# parameters, 1010 MiB at F16), weights drawn from N(0, 0.02²) with a fixed seed. At this
# size a 60 % cap is mostly weights, as it is for a 35B model on a phone; on the 258 MiB
# SmolLM2 the process's fixed overhead (binary, buffers) is a visible part of the cap.
# Its text is noise: use it for speed and memory only.
#
#   bench/wide-model.sh OUT.gguf        then   bench/memwall.sh OUT.gguf
#
# Needs python3 with numpy and safetensors.
set -euo pipefail
out="${1:?usage: bench/wide-model.sh OUT.gguf}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --quiet -p memwall
mw="$PWD/target/release/memwall"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/memwall-wide.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
fixtures/fetch.sh > /dev/null
"$mw" export fixtures/cache/SmolLM2-135M-Instruct.Q4_1.gguf "$tmp/smol" > /dev/null
mkdir "$tmp/wide"
cp "$tmp/smol"/tokenizer.json "$tmp/smol"/tokenizer_config.json "$tmp/wide"/
python3 - "$tmp/smol/config.json" "$tmp/wide" <<'PY'
import json, sys
import numpy as np
from safetensors.numpy import save_file
src, dst = sys.argv[1:]
d, ff, layers, heads, kv_heads = 1536, 4096, 18, 12, 4
kv = kv_heads * d // heads
cfg = json.load(open(src))
cfg.update(hidden_size=d, intermediate_size=ff, num_hidden_layers=layers,
           num_attention_heads=heads, num_key_value_heads=kv_heads, torch_dtype="float16")
json.dump(cfg, open(f"{dst}/config.json", "w"), indent=2)
rng = np.random.default_rng(1)
def w(rows, cols):
    return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)
ones = lambda: np.ones(d, np.float16)
t = {"model.embed_tokens.weight": w(cfg["vocab_size"], d), "model.norm.weight": ones()}
for l in range(layers):
    p = f"model.layers.{l}."
    t.update({
        p + "input_layernorm.weight": ones(), p + "post_attention_layernorm.weight": ones(),
        p + "self_attn.q_proj.weight": w(d, d), p + "self_attn.k_proj.weight": w(kv, d),
        p + "self_attn.v_proj.weight": w(kv, d), p + "self_attn.o_proj.weight": w(d, d),
        p + "mlp.gate_proj.weight": w(ff, d), p + "mlp.up_proj.weight": w(ff, d),
        p + "mlp.down_proj.weight": w(d, ff),
    })
save_file(t, f"{dst}/model.safetensors")
PY
"$mw" convert "$tmp/wide" -o "$out" --outtype f16
