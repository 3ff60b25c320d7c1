#!/usr/bin/python3
"""Quick self-checks of reference.py (run: /usr/bin/python3 tests/reference/self_check.py).

1. rope layouts: rotate_half on HF-layout q/k == interleaved rotary on
   Meta-permuted q/k (then un-permuted).
2. stories260K: safetensors (rotate_half) vs GGUF f32 (interleaved) logits.
3. stories260K greedy continuation of [1, 403, 407, 261, 378], decoded.
4. tiny-qwen2: bf16 safetensors vs f32 GGUF vs Q8_0 GGUF logits.
5. timing of a 120-token tiny-qwen2 forward.
Exits non-zero if a check fails.
"""

import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference as R  # noqa: E402

MODELS = os.environ.get("LLM_TEST_MODELS", "/work/shared/models")
failures = []


def check(name, ok, detail):
    print(f"[{'ok' if ok else 'FAIL'}] {name}: {detail}")
    if not ok:
        failures.append(name)


def to_meta(x, hd):
    """HF rotate_half row order -> Meta interleaved order along the last axis:
    element half*hd/2 + i moves to 2i + half."""
    shp = x.shape
    return x.reshape(*shp[:-1], 2, hd // 2).swapaxes(-1, -2).reshape(shp)


def rope_layouts():
    rng = np.random.default_rng(0)
    hd, n = 16, 7
    x = rng.standard_normal((3, n, hd))
    pos = np.arange(n) + 5
    a = R.rope(x, pos, 10000.0, "half")
    b = R.rope(to_meta(x, hd), pos, 10000.0, "interleaved")
    d = np.abs(to_meta(a, hd) - b).max()
    check("rope layouts agree after permutation", d < 1e-12, f"max diff {d:.3g}")


def rel(a, b):
    return np.abs(a - b).max() / np.abs(b).max()


def stories():
    d = os.path.join(MODELS, "stories260K")
    hf = R.load_model(d)
    gg = R.load_model(os.path.join(d, "stories260K-f32.gguf"))
    # stored q weights really are permuted versions of each other
    hd = hf[0]["head_dim"]
    wq_hf = hf[1]["layers"][0]["wq"]
    wq_gg = gg[1]["layers"][0]["wq"]
    perm = to_meta(wq_hf.T.reshape(64, hf[0]["n_heads"], hd), hd).reshape(64, -1).T
    check("stories260K GGUF attn_q == Meta-permuted q_proj",
          np.array_equal(perm, wq_gg), "")
    toks = [1, 403, 407, 261, 378] + list(range(300, 315))
    la, lb = R.forward(*hf, toks), R.forward(*gg, toks)
    d_abs = np.abs(la - lb).max()
    check("stories260K safetensors vs GGUF (20 tokens)", rel(la, lb) < 1e-5,
          f"max abs {d_abs:.3g}, rel to max|logit| {rel(la, lb):.3g} "
          f"(GGUF eps is f32 {gg[0]['eps']!r} vs config 1e-5)")
    hf_same_eps = (dict(hf[0], eps=gg[0]["eps"]), hf[1])
    lc = R.forward(*hf_same_eps, toks)
    check("  ... with the GGUF eps on both", rel(lc, lb) < 1e-12,
          f"max abs {np.abs(lc - lb).max():.3g}")

    with open(os.path.join(d, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    inv = {v: k for k, v in vocab.items()}
    prompt = [1, 403, 407, 261, 378]
    g = R.greedy(*hf, prompt, 30)
    g2 = R.greedy(*gg, prompt, 30)
    text = "".join(inv[t] for t in prompt[1:] + g).replace("\u2581", " ")
    print("      greedy ids:", g)
    print("      text:", repr(text))
    check("stories260K greedy continuation", text.startswith(
        " Once upon a time, there was a little girl named Lily. She loved to play outside in the park."),
        "matches expected story" if g == g2 else "GGUF greedy differs!")
    check("stories260K greedy safetensors == GGUF", g == g2, "")


def qwen():
    d = os.path.join(MODELS, "tiny-qwen2")
    hf = R.load_model(d)
    f32 = R.load_model(os.path.join(d, "tiny-qwen2-f32.gguf"))
    q8_m = R.load_model(os.path.join(d, "tiny-qwen2-q8_0.gguf"))
    exact = all(np.array_equal(hf[1]["layers"][i][k], f32[1]["layers"][i][k])
                for i in range(hf[0]["n_layers"]) for k in hf[1]["layers"][i]
                if hf[1]["layers"][i][k] is not None)
    exact = exact and np.array_equal(hf[1]["embed"], f32[1]["embed"])
    check("tiny-qwen2 bf16 weights == f32 GGUF weights", exact, "")
    rng = np.random.default_rng(1)
    toks = [int(t) for t in rng.integers(0, 151936, 40)]
    la, lb, lq = (R.forward(*m, toks) for m in (hf, f32, q8_m))
    check("tiny-qwen2 safetensors vs f32 GGUF", rel(la, lb) < 1e-5,
          f"max abs {np.abs(la - lb).max():.3g}, rel {rel(la, lb):.3g} "
          f"(eps {hf[0]['eps']!r} vs {f32[0]['eps']!r})")
    hf_same_eps = (dict(hf[0], eps=f32[0]["eps"]), hf[1])
    lc = R.forward(*hf_same_eps, toks)
    check("  ... with the GGUF eps on both", rel(lc, lb) < 1e-12,
          f"max abs {np.abs(lc - lb).max():.3g}")
    # Q8_0 decoding: must equal a round-to-nearest Q8_0 quantization of the
    # f32 weights (d = amax/127 stored as f16, q = round(x/d)).
    def q8(wt):
        b = wt.astype(np.float32).reshape(-1, 32)
        dd = np.abs(b).max(1, keepdims=True) / np.float32(127)
        qq = np.round(b * np.where(dd > 0, 1 / np.where(dd > 0, dd, 1), 0))
        return (dd.astype(np.float16).astype(np.float64) * qq).reshape(wt.shape)
    same = np.array_equal(q8(f32[1]["embed"]), q8_m[1]["embed"])
    same = same and all(np.array_equal(q8(f32[1]["layers"][i][k]), q8_m[1]["layers"][i][k])
                        for i in range(f32[0]["n_layers"])
                        for k in ("wq", "wk", "wv", "wo", "wgate", "wup", "wdown"))
    check("tiny-qwen2 Q8_0 weights == requantized f32 weights", same, "")
    r = rel(lq, lb)
    rms = np.sqrt(np.mean((lq - lb) ** 2) / np.mean(lb ** 2))
    agree = np.mean(lq.argmax(1) == lb.argmax(1))
    # informational: this random-weight model amplifies perturbations ~15x
    check("tiny-qwen2 Q8_0 GGUF vs f32 GGUF (info)", True,
          f"max abs {np.abs(lq - lb).max():.3g}, rel to max|logit| {r:.3g}, "
          f"rms rel {rms:.3g}, max|logit| {np.abs(lb).max():.3g}, "
          f"argmax agreement {agree:.0%}")

    toks = [int(t) for t in rng.integers(0, 151936, 120)]
    t0 = time.time()
    R.forward(*hf, toks)
    t1 = time.time()
    check("tiny-qwen2 120-token forward timing", t1 - t0 < 30, f"{t1 - t0:.2f} s")


if __name__ == "__main__":
    rope_layouts()
    stories()
    qwen()
    print("FAILED: " + ", ".join(failures) if failures else "all checks passed")
    sys.exit(1 if failures else 0)
