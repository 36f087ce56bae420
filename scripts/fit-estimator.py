#!/usr/bin/env python3
"""Fit and evaluate the class-count token estimator of ctxwin-core (core/src/estimator).

Standard library only. Input: a JSONL corpus with one
{"type", "source", "text", "cl100k", ..., "smollm2"} object per line (exact token counts).

    scripts/fit-estimator.py CORPUS.jsonl [--tokenizer smollm2]  # evaluate a shipped table
    scripts/fit-estimator.py CORPUS.jsonl --fit smollm2           # NNLS refit, one tokenizer
    scripts/fit-estimator.py CORPUS.jsonl --sample core/testdata/estimator-sample.jsonl \
        --per-type 42                                             # the shipped test sample

The feature extraction mirrors `core/src/estimator` exactly (the Rust unit tests check the
shipped sample against the same numbers). Held-out split: by source file within each type
(crc32 parity); a source holding 50+ messages of its type is cut into chunks of 10 lines.
The fit minimises the squared relative error sum(((w . f) / exact - 1)^2) with w >= 0.
"""

import argparse
import json
import random
import sys
import zlib
from collections import Counter, defaultdict

NFEAT = 24

# Must match core/src/estimator/weights.rs.
CL100K = [117, 35, 0, 11, 390, 0, 143, 19, 271, 237, 1398, 278,
          89, 132, 178, 232, 254, 230, 188, 97, 0, 429, 256, 233]
# Printed by `--fit smollm2` (refit on all messages, CTRL held at 256).
SMOLLM2 = [148, 35, 0, 0, 147, 246, 244, 19, 268, 58, 944, 682,
           191, 19, 241, 376, 449, 441, 624, 262, 0, 862, 256, 152]
SHIPPED = {"smollm2": SMOLLM2}

(LOWER, UPPER, DIGIT, SPACE, NL, PUNCT, CTRL, SYM, LATIN, GREEK, CYR, SEMI,
 BRAH, HANGUL, HAN, CJKP, KANA, ASTRAL) = range(18)

LETTERS = {LOWER, UPPER, LATIN, CYR, GREEK, SEMI, BRAH, HAN, KANA, HANGUL}
PUNCTLIKE = {PUNCT, SYM, CJKP}

# (last code point of the range, class), ascending, from U+0080.
RANGES = [
    (0x00BF, SYM), (0x036F, LATIN), (0x03FF, GREEK), (0x058F, CYR), (0x08FF, SEMI),
    (0x10FF, BRAH), (0x11FF, HANGUL), (0x1DFF, BRAH), (0x1EFF, LATIN), (0x1FFF, GREEK),
    (0x2E7F, SYM), (0x2FFF, HAN), (0x303F, CJKP), (0x312F, KANA), (0x318F, HANGUL),
    (0x31FF, KANA), (0x33FF, SYM), (0x9FFF, HAN), (0xABFF, BRAH), (0xD7FF, HANGUL),
    (0xF8FF, SYM), (0xFAFF, HAN), (0xFDFF, SEMI), (0xFE2F, SYM), (0xFE4F, CJKP),
    (0xFE6F, SYM), (0xFEFF, SEMI), (0xFFEF, CJKP), (0xFFFF, SYM),
]
PER_CLASS_FEATURE = {LATIN: 11, SEMI: 14, BRAH: 15, HAN: 16, KANA: 17, HANGUL: 18,
                     SYM: 19, CJKP: 20, ASTRAL: 21, CTRL: 22}


def classify(ch):
    cp = ord(ch)
    if cp < 0x80:
        if 0x61 <= cp <= 0x7A:
            return LOWER
        if 0x41 <= cp <= 0x5A:
            return UPPER
        if 0x30 <= cp <= 0x39:
            return DIGIT
        if cp in (0x20, 0x09):
            return SPACE
        if cp in (0x0A, 0x0D):
            return NL
        if 0x21 <= cp <= 0x7E:
            return PUNCT
        return CTRL
    if cp > 0xFFFF:
        return HAN if 0x20000 <= cp <= 0x3FFFF else ASTRAL
    for last, cls in RANGES:
        if cp <= last:
            return cls
    return SYM


def features(text):
    f = [0] * NFEAT
    in_letters = in_nonascii = in_punct = in_ws = False
    run_ascii_letters = digit_run = 0
    ws_nl = False
    ws_trailing = 0
    prev = None
    prev_backslash = False
    for ch in text:
        c = classify(ch)
        letter = c in LETTERS
        ascii_letter = c in (LOWER, UPPER)
        if letter:
            if not in_letters:
                f[0] += 1
                run_ascii_letters = 0
            if ascii_letter:
                f[1] += 1
                run_ascii_letters += 1
                if run_ascii_letters > 6:
                    f[2] += 1
                if c == UPPER and prev == LOWER:
                    f[3] += 1
            else:
                if not in_nonascii:
                    f[23] += 1
        in_letters = letter
        in_nonascii = letter and not ascii_letter
        if c == DIGIT:
            if digit_run % 3 == 0:
                f[4] += 1
            digit_run += 1
            f[5] += 1
        else:
            digit_run = 0
        punct = c in PUNCTLIKE
        if punct and not in_punct:
            f[6] += 1
        in_punct = punct
        if c == PUNCT:
            f[7] += 1
        if c in (SPACE, NL):
            if not in_ws:
                ws_nl = False
                ws_trailing = 0
            if c == NL:
                ws_nl = True
                ws_trailing = 0
            else:
                ws_trailing += 1
            in_ws = True
        elif in_ws:
            f[8] += ws_nl
            f[9] += ws_trailing >= 2
            in_ws = False
        if ch == "u" and prev_backslash:
            f[10] += 1
        prev_backslash = ch == "\\"
        if c in (GREEK, CYR):
            f[12] += 1
            if c == GREEK:
                f[13] += 1
        elif c in PER_CLASS_FEATURE:
            f[PER_CLASS_FEATURE[c]] += 1
        prev = c
    if in_ws:
        f[8] += ws_nl
        f[9] += ws_trailing >= 2
    return f


def estimate(f, w, num, den, nbytes):
    s = sum(a * b for a, b in zip(w, f))
    return min(nbytes, -(-s * num // (den * 256)))


def load(path):
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            d["f"] = features(d["text"])
            d["bytes"] = len(d["text"].encode("utf-8"))
            rows.append(d)
    per_source = Counter((d["type"], d["source"]) for d in rows)
    seen = Counter()
    for d in rows:
        key = (d["type"], d["source"])
        name = d["source"]
        if per_source[key] >= 50:
            name += "#%d" % (seen[key] // 10)
        seen[key] += 1
        d["half"] = zlib.crc32((d["type"] + "/" + name).encode()) & 1
    return rows


def nnls_relative(rows, tok, fixed, iters=20000):
    """Projected coordinate descent on the normal equations of the relative-error fit.

    `fixed` maps feature index -> weight (1/256 token) held constant, for features too rare
    in the corpus to fit (CTRL: 5 messages; one control byte is at most one token).
    """
    g = [[0.0] * NFEAT for _ in range(NFEAT)]
    c = [0.0] * NFEAT
    for d in rows:
        y = d[tok]
        if y <= 0:
            continue
        x = [v / y for v in d["f"]]
        target = 1.0 - sum(x[i] * w / 256 for i, w in fixed.items())
        nz = [i for i in range(NFEAT) if x[i] and i not in fixed]
        for i in nz:
            c[i] += x[i] * target
            for j in nz:
                g[i][j] += x[i] * x[j]
    w = [fixed.get(i, 0) / 256 for i in range(NFEAT)]
    for _ in range(iters):
        delta = 0.0
        for j in range(NFEAT):
            if g[j][j] == 0 or j in fixed:
                continue
            grad = sum(g[j][k] * w[k] for k in range(NFEAT)) - c[j]
            new = max(0.0, w[j] - grad / g[j][j])
            delta = max(delta, abs(new - w[j]))
            w[j] = new
        if delta < 1e-12:
            break
    return [round(v * 256) for v in w]


def evaluate(rows, tok, w, num, den, window=20):
    errs = []
    for d in rows:
        est = estimate(d["f"], w, num, den, d["bytes"])
        errs.append((est - d[tok]) / d[tok] if d[tok] else 0.0)
    n = len(errs)
    out = {
        "n": n,
        "mae": sum(abs(e) for e in errs) / n,
        "under": sum(e < 0 for e in errs) / n,
        "worst": min(errs),
    }
    # 20-message totals: 2000 random draws (seeded) of 20 distinct messages.
    rng = random.Random(20261122)
    under = 0
    worst = float("inf")
    for _ in range(2000):
        pick = rng.sample(range(n), min(window, n))
        est = sum(estimate(rows[i]["f"], w, num, den, rows[i]["bytes"]) for i in pick)
        ex = sum(rows[i][tok] for i in pick)
        e = (est - ex) / ex
        under += e < 0
        worst = min(worst, e)
    out["win_under"] = under / 2000
    out["win_worst"] = worst
    return out


def report(title, rows, tok, w):
    print("\n## %s (%d messages)" % (title, len(rows)))
    print("| type | n | MAE x1 | under x1 | MAE x5/4 | under x5/4 | worst x5/4 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    types = sorted({d["type"] for d in rows})
    for t in types + ["ALL"]:
        sub = [d for d in rows if t == "ALL" or d["type"] == t]
        a = evaluate(sub, tok, w, 1, 1)
        b = evaluate(sub, tok, w, 5, 4)
        print("| %s | %d | %.1f%% | %.1f%% | %.1f%% | %.1f%% | %+.0f%% |" % (
            t, len(sub), 100 * a["mae"], 100 * a["under"], 100 * b["mae"],
            100 * b["under"], 100 * b["worst"]))
    for name, num, den in (("x1", 1, 1), ("x23/20", 23, 20), ("x5/4", 5, 4)):
        a = evaluate(rows, tok, w, num, den)
        print("%s: MAE %.1f%%, under %.1f%%, worst %+.0f%%, 20-msg totals under %.2f%% "
              "(worst %+.1f%%)" % (name, 100 * a["mae"], 100 * a["under"], 100 * a["worst"],
                                   100 * a["win_under"], 100 * a["win_worst"]))


def write_sample(rows, path, per_type, seed=7):
    rng = random.Random(seed)
    by_type = defaultdict(list)
    for d in rows:
        by_type[d["type"]].append(d)
    picked = []
    for t in sorted(by_type):
        cands = [d for d in by_type[t] if d["bytes"] <= 4096] or by_type[t]
        picked += rng.sample(cands, min(per_type, len(cands)))
    rng.shuffle(picked)
    keys = ("type", "source", "text", "cl100k", "o200k", "llama3", "qwen3", "smollm2")
    with open(path, "w", encoding="utf-8") as fh:
        for d in picked:
            fh.write(json.dumps({k: d[k] for k in keys}, ensure_ascii=False) + "\n")
    print("wrote %d lines to %s" % (len(picked), path), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus")
    ap.add_argument("--tokenizer", default="cl100k")
    ap.add_argument("--fit", metavar="TOKENIZER", help="refit weights for this tokenizer")
    ap.add_argument("--weights", help="comma-separated 24 weights to evaluate")
    ap.add_argument("--sample", metavar="OUT", help="write a stratified sample")
    ap.add_argument("--per-type", type=int, default=42)
    ap.add_argument("--fix", default="22=256",
                    help="weights held constant in the fit, e.g. 22=256,21=429 ('' for none)")
    args = ap.parse_args()
    fixed = {int(k): int(v) for k, v in (kv.split("=") for kv in args.fix.split(",") if kv)}
    rows = load(args.corpus)
    if args.sample:
        write_sample(rows, args.sample, args.per_type)
        return
    tok = args.fit or args.tokenizer
    w = [int(v) for v in args.weights.split(",")] if args.weights else SHIPPED.get(tok, CL100K)
    if args.fit:
        train = [d for d in rows if d["half"] == 0]
        w = nnls_relative(train, tok, fixed)
        print("fit on %d messages (half 0) for %s:" % (len(train), tok))
        print("weights:", ", ".join(str(v) for v in w))
        report("train half, %s" % tok, train, tok, w)
        report("held-out half, %s" % tok, [d for d in rows if d["half"] == 1], tok, w)
        w = nnls_relative(rows, tok, fixed)
        print("\nrefit on all %d messages for %s:" % (len(rows), tok))
        print("weights:", ", ".join(str(v) for v in w))
    report("all, %s" % tok, rows, tok, w)
    report("held-out half, %s" % tok, [d for d in rows if d["half"] == 1], tok, w)


if __name__ == "__main__":
    main()
