#!/usr/bin/python3
"""Independent float64 numpy reference for Llama / Qwen2 causal LMs.

Written from the model definition (Hugging Face transformers' Llama/Qwen2
modelling), the safetensors format description and the GGUF specification
only; it shares no code with the C++ engine.  Standard library + numpy.

CLI:
  reference.py --model PATH --tokens 1,2,3 --out FILE [--dtype f32]
      writes logits of every position, little-endian float32, row-major
      [n_tokens, vocab], prints {"n_tokens": N, "n_vocab": V}
  reference.py --model PATH --tokens 1,2,3 --greedy N
      appends N argmax tokens (full recompute each step),
      prints {"greedy": [ids...]}
PATH is a Hugging Face directory (config.json + model.safetensors or a
sharded model.safetensors.index.json) or a .gguf file.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np


# ---------------------------------------------------------------------------
# safetensors
# ---------------------------------------------------------------------------

def _bf16_to_f32(raw_u16):
    return (raw_u16.astype(np.uint32) << 16).view(np.float32)


def read_safetensors(path):
    """Returns {name: float64 ndarray} for one .safetensors file."""
    out = {}
    with open(path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen).decode("utf-8"))
        base = 8 + hlen
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info["dtype"]
        shape = tuple(info["shape"])
        start, end = info["data_offsets"]
        raw = mm[base + start: base + end]
        if dtype == "F32":
            arr = raw.view("<f4")
        elif dtype == "F16":
            arr = raw.view("<f2").astype(np.float32)
        elif dtype == "BF16":
            arr = _bf16_to_f32(raw.view("<u2"))
        elif dtype == "F64":
            arr = raw.view("<f8")
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        n = int(np.prod(shape)) if shape else 1
        if arr.size != n:
            raise ValueError(f"{path}: tensor {name}: size mismatch")
        out[name] = np.asarray(arr, dtype=np.float64).reshape(shape)
    return out


def load_hf_dir(path):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    index = os.path.join(path, "model.safetensors.index.json")
    tensors = {}
    if os.path.exists(index):
        with open(index) as f:
            wm = json.load(f)["weight_map"]
        for shard in sorted(set(wm.values())):
            tensors.update(read_safetensors(os.path.join(path, shard)))
    else:
        tensors.update(read_safetensors(os.path.join(path, "model.safetensors")))

    hidden = cfg["hidden_size"]
    n_heads = cfg["num_attention_heads"]
    hp = dict(
        arch=cfg.get("model_type", "llama"),
        hidden=hidden,
        n_layers=cfg["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=cfg.get("num_key_value_heads") or n_heads,
        head_dim=cfg.get("head_dim") or hidden // n_heads,
        ffn=cfg["intermediate_size"],
        eps=float(cfg.get("rms_norm_eps", 1e-6)),
        theta=float(cfg.get("rope_theta", 10000.0)),
        rope="half",
    )
    tie = cfg.get("tie_word_embeddings", False)

    def get(name):
        return tensors.get(name)

    w = dict(
        embed=tensors["model.embed_tokens.weight"],
        norm=tensors["model.norm.weight"],
        layers=[],
    )
    lm = get("lm_head.weight")
    w["lm_head"] = w["embed"] if (tie or lm is None) else lm
    for i in range(hp["n_layers"]):
        p = f"model.layers.{i}."
        w["layers"].append(dict(
            attn_norm=tensors[p + "input_layernorm.weight"],
            wq=tensors[p + "self_attn.q_proj.weight"],
            wk=tensors[p + "self_attn.k_proj.weight"],
            wv=tensors[p + "self_attn.v_proj.weight"],
            wo=tensors[p + "self_attn.o_proj.weight"],
            bq=get(p + "self_attn.q_proj.bias"),
            bk=get(p + "self_attn.k_proj.bias"),
            bv=get(p + "self_attn.v_proj.bias"),
            bo=get(p + "self_attn.o_proj.bias"),
            ffn_norm=tensors[p + "post_attention_layernorm.weight"],
            wgate=tensors[p + "mlp.gate_proj.weight"],
            wup=tensors[p + "mlp.up_proj.weight"],
            wdown=tensors[p + "mlp.down_proj.weight"],
        ))
    hp["vocab"] = w["lm_head"].shape[0]
    return hp, w


# ---------------------------------------------------------------------------
# GGUF
# ---------------------------------------------------------------------------

GGUF_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
    7: "<?", 10: "<Q", 11: "<q", 12: "<d",
}
GGML_F32, GGML_F16, GGML_Q8_0, GGML_BF16 = 0, 1, 8, 30


class _Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def unpack(self, fmt):
        n = struct.calcsize(fmt)
        if self.pos + n > len(self.data):
            raise ValueError("GGUF: truncated file")
        v = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.unpack("<Q")
        if self.pos + n > len(self.data):
            raise ValueError("GGUF: truncated string")
        s = bytes(self.data[self.pos:self.pos + n]).decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, vtype):
        if vtype in GGUF_SCALARS:
            return self.unpack(GGUF_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in GGUF_SCALARS:
                fmt = GGUF_SCALARS[etype]
                size = struct.calcsize(fmt)
                arr = np.frombuffer(self.data, dtype=np.dtype(fmt), count=count,
                                    offset=self.pos)
                self.pos += size * count
                return arr
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"GGUF: unknown value type {vtype}")


def read_gguf(path):
    """Returns (metadata dict, {name: float64 ndarray in PyTorch [out, in] order})."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(data)
    r = _Reader(buf)
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    r.pos = 4
    version = r.unpack("<I")
    if version not in (2, 3):
        raise ValueError(f"{path}: unsupported GGUF version {version}")
    n_tensors = r.unpack("<Q")
    n_kv = r.unpack("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        vtype = r.unpack("<I")
        meta[key] = r.value(vtype)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        nd = r.unpack("<I")
        dims = [r.unpack("<Q") for _ in range(nd)]
        ttype = r.unpack("<I")
        off = r.unpack("<Q")
        infos.append((name, dims, ttype, off))
    align = int(meta.get("general.alignment", 32))
    base = (r.pos + align - 1) // align * align

    tensors = {}
    for name, dims, ttype, off in infos:
        n = int(np.prod(dims)) if dims else 1
        start = base + off
        if ttype == GGML_F32:
            arr = data[start:start + 4 * n].view("<f4")
        elif ttype == GGML_F16:
            arr = data[start:start + 2 * n].view("<f2")
        elif ttype == GGML_BF16:
            arr = _bf16_to_f32(data[start:start + 2 * n].view("<u2"))
        elif ttype == GGML_Q8_0:
            if n % 32:
                raise ValueError(f"{name}: Q8_0 size not a multiple of 32")
            nb = n // 32
            blk = data[start:start + 34 * nb].reshape(nb, 34)
            d = np.ascontiguousarray(blk[:, :2]).view("<f2").astype(np.float64)
            q = np.ascontiguousarray(blk[:, 2:]).view(np.int8).astype(np.float64)
            arr = (d * q).reshape(-1)
        else:
            raise ValueError(f"{name}: unsupported ggml type {ttype}")
        if arr.size != n:
            raise ValueError(f"{name}: truncated tensor data")
        # dims are innermost-first; numpy shape is outermost-first.
        tensors[name] = np.asarray(arr, dtype=np.float64).reshape(tuple(reversed(dims)))
    return meta, tensors


def load_gguf(path):
    meta, t = read_gguf(path)
    arch = meta["general.architecture"]
    g = lambda k, d=None: meta.get(f"{arch}.{k}", d)
    hidden = int(g("embedding_length"))
    n_heads = int(g("attention.head_count"))
    n_kv = g("attention.head_count_kv", n_heads)
    if isinstance(n_kv, np.ndarray):  # per-layer arrays are possible in the spec
        n_kv = n_kv[0]
    head_dim = int(g("attention.key_length", hidden // n_heads))
    n_rot = int(g("rope.dimension_count", head_dim))
    if n_rot != head_dim:
        raise ValueError(f"partial rotary (rope.dimension_count {n_rot} != head_dim "
                         f"{head_dim}) is not supported by this reference")
    hp = dict(
        arch=arch,
        hidden=hidden,
        n_layers=int(g("block_count")),
        n_heads=n_heads,
        n_kv_heads=int(n_kv),
        head_dim=head_dim,
        ffn=int(g("feed_forward_length")),
        eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
        theta=float(g("rope.freq_base", 10000.0)),
        # llama.cpp's converter stores llama q/k in Meta's interleaved layout
        rope="interleaved" if arch == "llama" else "half",
    )
    w = dict(embed=t["token_embd.weight"], norm=t["output_norm.weight"], layers=[])
    w["lm_head"] = t.get("output.weight", w["embed"])
    for i in range(hp["n_layers"]):
        p = f"blk.{i}."
        w["layers"].append(dict(
            attn_norm=t[p + "attn_norm.weight"],
            wq=t[p + "attn_q.weight"], wk=t[p + "attn_k.weight"],
            wv=t[p + "attn_v.weight"], wo=t[p + "attn_output.weight"],
            bq=t.get(p + "attn_q.bias"), bk=t.get(p + "attn_k.bias"),
            bv=t.get(p + "attn_v.bias"), bo=t.get(p + "attn_output.bias"),
            ffn_norm=t[p + "ffn_norm.weight"],
            wgate=t[p + "ffn_gate.weight"], wup=t[p + "ffn_up.weight"],
            wdown=t[p + "ffn_down.weight"],
        ))
    hp["vocab"] = w["lm_head"].shape[0]
    return hp, w


def load_model(path):
    if os.path.isdir(path):
        return load_hf_dir(path)
    if path.endswith(".gguf") or open(path, "rb").read(4) == b"GGUF":
        return load_gguf(path)
    raise ValueError(f"don't know how to load {path}")


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, theta, layout):
    """x: [n_heads, n_tok, head_dim]; pos: [n_tok]."""
    hd = x.shape[-1]
    half = hd // 2
    inv_freq = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / hd)
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [n_tok, half]
    cos, sin = np.cos(ang), np.sin(ang)
    if layout == "half":
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
        return out
    raise ValueError(layout)


def silu(x):
    return x / (1.0 + np.exp(-x))


def forward_hidden(hp, w, tokens):
    """Final-normed hidden states [n_tok, hidden] (float64)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= w["embed"].shape[0]):
        raise ValueError("token id out of range")
    n = tokens.size
    H, KV, hd = hp["n_heads"], hp["n_kv_heads"], hp["head_dim"]
    group = H // KV
    pos = np.arange(n)
    scale = 1.0 / np.sqrt(hd)
    mask = np.triu(np.full((n, n), -np.inf), k=1)
    x = w["embed"][tokens].copy()
    for L in w["layers"]:
        h = rmsnorm(x, L["attn_norm"], hp["eps"])
        q = h @ L["wq"].T
        k = h @ L["wk"].T
        v = h @ L["wv"].T
        if L["bq"] is not None: q = q + L["bq"]
        if L["bk"] is not None: k = k + L["bk"]
        if L["bv"] is not None: v = v + L["bv"]
        q = q.reshape(n, H, hd).transpose(1, 0, 2)
        k = k.reshape(n, KV, hd).transpose(1, 0, 2)
        v = v.reshape(n, KV, hd).transpose(1, 0, 2)
        q = rope(q, pos, hp["theta"], hp["rope"])
        k = rope(k, pos, hp["theta"], hp["rope"])
        k = np.repeat(k, group, axis=0)  # query head i -> kv head i // group
        v = np.repeat(v, group, axis=0)
        s = q @ k.transpose(0, 2, 1) * scale + mask
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        o = (p @ v).transpose(1, 0, 2).reshape(n, H * hd)
        o = o @ L["wo"].T
        if L["bo"] is not None: o = o + L["bo"]
        x = x + o
        h = rmsnorm(x, L["ffn_norm"], hp["eps"])
        x = x + (silu(h @ L["wgate"].T) * (h @ L["wup"].T)) @ L["wdown"].T
    return rmsnorm(x, w["norm"], hp["eps"])


def forward(hp, w, tokens):
    """Logits [n_tok, vocab] (float64)."""
    return forward_hidden(hp, w, tokens) @ w["lm_head"].T


def greedy(hp, w, tokens, n_new):
    toks = list(tokens)
    out = []
    for _ in range(n_new):
        h = forward_hidden(hp, w, toks)[-1]
        nxt = int(np.argmax(w["lm_head"] @ h))
        out.append(nxt)
        toks.append(nxt)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write all-position logits here (f32 LE)")
    ap.add_argument("--dtype", default="f32", choices=["f32"])
    ap.add_argument("--greedy", type=int, default=0, metavar="N")
    a = ap.parse_args(argv)
    tokens = [int(t) for t in a.tokens.replace(" ", "").split(",") if t != ""]
    if not tokens:
        ap.error("--tokens is empty")
    if not a.out and not a.greedy:
        ap.error("need --out and/or --greedy")
    hp, w = load_model(a.model)
    if a.out:
        logits = forward(hp, w, tokens)
        logits.astype("<f4").tofile(a.out)
        print(json.dumps({"n_tokens": len(tokens), "n_vocab": int(logits.shape[1])}))
    if a.greedy:
        print(json.dumps({"greedy": greedy(hp, w, tokens, a.greedy)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
