"""Extracts llama.cpp's table of BPE pre-tokenizer hashes (get_vocab_base_pre in
conversion/base.py) into pre_tokenizers.tsv, and its probe text into chktxt.txt.

  python3 convert/data/extract_pre_tokenizers.py /path/to/llama.cpp
"""
import ast
import re
import sys
from pathlib import Path

src = (Path(sys.argv[1]) / "conversion/base.py").read_text(encoding="utf-8")
start = src.index("def get_vocab_base_pre")
body = src[start:src.index("if res is None:", start)]
here = Path(__file__).parent
chktxt = ast.literal_eval(re.search(r"chktxt = ('.*')\n", body).group(1))
(here / "chktxt.txt").write_bytes(chktxt.encode("utf-8"))
table = {}
for m in re.finditer(r'if chkhsh == "([0-9a-f]{64})":\s*\n\s*# ref: (\S+)\s*\n\s*res = "([^"]+)"', body):
    table[m.group(1)] = (m.group(3), m.group(2))  # later entries win, as in llama.cpp
with open(here / "pre_tokenizers.tsv", "w", encoding="utf-8") as f:
    f.write("# BPE pre-tokenizer names llama.cpp recognises, keyed by the SHA-256 of str(token ids)\n")
    f.write("# of its probe text. Data from llama.cpp 0c1e570 conversion/base.py (get_vocab_base_pre),\n")
    f.write("# extracted by convert/data/extract_pre_tokenizers.py. Columns: sha256, name, reference model.\n")
    for h, (name, ref) in table.items():
        f.write(f"{h}\t{name}\t{ref}\n")
print(len(table), "entries;", len(chktxt), "characters of probe text")
