"""The Chinese calibration text of bench/fit.sh and bench/lowbit.sh: documents 60 on of
fixtures/tiny-zh/heldout.jsonl that are mostly Chinese (documents 0..42 are the evaluation
text, fixtures/perplexity/heldout-24k.txt).

    python3 bench/calib_zh_text.py ROOT OUT.txt
"""
import json
import re
import sys

root, out = sys.argv[1:]
docs = [json.loads(l) for l in open(f"{root}/fixtures/tiny-zh/heldout.jsonl", encoding="utf-8")]


def cjk(t):
    c = len(re.findall(r"[\u4e00-\u9fff]", t))
    l = len(re.findall(r"[A-Za-z]", t))
    return c / max(1, c + l)


later = [d["text"] for d in docs[60:] if cjk(d["text"]) >= 0.3]
open(out, "w", encoding="utf-8").write("\n\n".join(later))
