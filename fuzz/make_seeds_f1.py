"""Writes the seed corpora of the gguf_split, safetensors_header, safetensors_index,
hf_config, tokenizer_json and sentencepiece fuzz targets (each seed < 64 KB).

usage: python3 fuzz/make_seeds_f1.py   (from the repository root; needs `pip install gguf
numpy`; the split set is cut by llama-gguf-split, path in $LLAMA_GGUF_SPLIT)
"""
import json
import os
import shutil
import struct
import subprocess
import tempfile

import gguf
import numpy as np

SEEDS = "fuzz/seeds/"
SPLIT = b"FUZZSPLIT"
GGUF_SPLIT = os.environ.get(
    "LLAMA_GGUF_SPLIT",
    "/work/tmp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-gguf-split",
)


def put(target, name, data):
    os.makedirs(SEEDS + target, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) < 65536, (target, name, len(data))
    with open(SEEDS + target + "/" + name, "wb") as f:
        f.write(data)


# gguf_split: a real three-file set from llama-gguf-split, and one unsplit file.
with tempfile.TemporaryDirectory() as tmp:
    whole = tmp + "/whole.gguf"
    w = gguf.GGUFWriter(whole, "llama")
    w.add_block_count(1)
    w.add_tensor("a.weight", np.arange(8, dtype=np.float32))
    w.add_tensor("b.weight", np.full((2, 34), 3, dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("c.weight", np.arange(16, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    subprocess.run([GGUF_SPLIT, "--split-max-tensors", "1", whole, tmp + "/m"], check=True,
                   stdout=subprocess.DEVNULL)
    parts = [open(tmp + f"/m-0000{i}-of-00003.gguf", "rb").read() for i in (1, 2, 3)]
    put("gguf_split", "three-files.bin", b"\x00" + SPLIT.join(parts))
    put("gguf_split", "three-files-open-third-read.bin", b"\x82" + SPLIT.join(parts))
    put("gguf_split", "unsplit.bin", b"\x00" + open(whole, "rb").read())


# safetensors: header length, JSON header, data.
def safetensors(tensors, metadata=None):
    header, data = {}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if metadata is not None:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + data


three = safetensors([
    ("model.embed_tokens.weight", "BF16", [4, 2], bytes(range(16))),
    ("model.norm.weight", "F32", [2], struct.pack("<2f", 1.0, 2.0)),
    ("lm_head.weight", "F16", [4, 2], bytes(16)),
], {"format": "pt"})
put("safetensors_header", "three-tensors.safetensors", three)
put("safetensors_header", "empty.safetensors", safetensors([]))
put("safetensors_header", "zero-sized.safetensors", safetensors([("z", "F32", [0, 3], b"")]))
put("safetensors_header", "int-dtype.safetensors", safetensors([("i", "I64", [1], bytes(8))]))

shard1 = safetensors([
    ("model.embed_tokens.weight", "F16", [4, 2], bytes(16)),
    ("model.norm.weight", "F32", [2], bytes(8)),
])
shard2 = safetensors([("lm_head.weight", "BF16", [4, 2], bytes(16))])
index = {
    "metadata": {"total_size": 40},
    "weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors",
    },
}
put("safetensors_index", "two-shards.bin", SPLIT.join([json.dumps(index, indent=2).encode(), shard1, shard2]))
escape = json.loads(json.dumps(index))
escape["weight_map"]["escaped"] = "../outside.safetensors"
put("safetensors_index", "escape-attempt.bin", SPLIT.join([json.dumps(escape).encode(), shard1, shard2]))

# hf_config: the tiny-zh config and one small config per architecture memwall converts.
put("hf_config", "tiny-zh.json", open("fixtures/tiny-zh/config.json").read())
base = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
        "num_key_value_heads": 2, "vocab_size": 300, "max_position_embeddings": 512, "rms_norm_eps": 1e-6}
for cls, model_type, extra in [
    ("MistralForCausalLM", "mistral", {"sliding_window": 4096}),
    ("MixtralForCausalLM", "mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    ("Qwen2ForCausalLM", "qwen2", {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 128}}),
    ("Qwen3ForCausalLM", "qwen3", {"head_dim": 16, "tie_word_embeddings": True}),
    ("Qwen3MoeForCausalLM", "qwen3_moe", {"num_experts": 8, "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 32}),
    ("CohereForCausalLM", "cohere", {"logit_scale": 0.0625, "layer_norm_eps": 1e-5}),
]:
    put("hf_config", model_type + ".json",
        json.dumps({"architectures": [cls], "model_type": model_type, **base, **extra}, indent=1))

# tokenizer_json: a tiny byte-level BPE (GPT-2 byte map, a few merges, added tokens).
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


chars = [bytes_to_unicode()[b] for b in range(256)]
vocab = {c: i for i, c in enumerate(chars)}
merges = [("Ġ", "w"), ("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġw", "o"), ("Ġwo", "r"),
          ("Ġwor", "l"), ("Ġworl", "d"), ("ä", "¸")]
for a, b in merges:
    vocab.setdefault(a + b, len(vocab))
added = [{"id": len(vocab), "content": "<|endoftext|>", "special": True},
         {"id": len(vocab) + 1, "content": "<|im_start|>", "special": True},
         {"id": len(vocab) + 2, "content": "<tool>", "special": False}]
tokenizer = {
    "version": "1.0",
    "added_tokens": added,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
    "post_processor": {"type": "TemplateProcessing",
                       "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                                  {"Sequence": {"id": "A", "type_id": 0}}],
                       "pair": []},
    "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges[:5]]
              + [[a, b] for a, b in merges[5:]]},
}
tc = {"bos_token": "<|endoftext|>", "eos_token": {"content": "<|im_start|>"}, "add_bos_token": True,
      "chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}
config = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": len(vocab) + 8, "eos_token_id": 1}
dump = lambda o: json.dumps(o, ensure_ascii=False).encode()
put("tokenizer_json", "bpe-full.bin", b"\x00".join([dump(tokenizer), dump(tc), dump(config)]))
put("tokenizer_json", "bpe-only.bin", dump(tokenizer))
llama = {"architectures": ["LlamaForCausalLM"]}
put("tokenizer_json", "bpe-llama.bin", b"\x00".join([dump(tokenizer), dump({"add_prefix_space": False}), dump(llama)]))


# sentencepiece: the fixture model (26 KB) and a tiny one written here.
def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([v & 0x7F | 0x80])
        v >>= 7
    return out + bytes([v])


def field(n, payload):
    return varint(n << 3 | 2) + varint(len(payload)) + payload


def piece(text, score, kind):
    p = field(1, text.encode()) + varint(2 << 3 | 5) + struct.pack("<f", score)
    return p + (varint(3 << 3) + varint(kind) if kind != 1 else b"")


pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
pieces += [("▁", -1.0, 1), ("▁H", -2.0, 1), ("ello", -3.0, 1), ("▁world", -2.5, 1), ("北京", -4.0, 1),
           ("<tool>", 0.0, 4), ("nan", float("nan"), 1)]
model = b"".join(field(1, piece(*p)) for p in pieces)
model += field(3, field(1, b"identity") + varint(3 << 3) + varint(1))
put("sentencepiece", "tiny-byte-fallback.model", model)
put("sentencepiece", "spm-fixture.model", open("fixtures/spm/tokenizer.model", "rb").read())
