#!/usr/bin/python3
"""Float64 reference forward pass of Hugging Face decoder models, for the
golden data in tests/data/golden/ (README.md there describes the format).

Written from the published semantics of LlamaForCausalLM,
MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and Gemma2ForCausalLM,
independently of the C engine: it recomputes the whole sequence for every greedy step (no KV
cache) with dense masks, in numpy float64.

  kvf_reference.py check GOLDEN_DIR
      recomputes every model of GOLDEN_DIR/expected.json from its prompt ids
      and prints the largest differences (non-zero exit beyond 1e-5 or on any
      argmax / greedy mismatch)
  kvf_reference.py add GOLDEN_DIR NAME --prompts FILE [--mkmodel-args ARGS]
      computes model GOLDEN_DIR/NAME on the prompts of FILE (a JSON list of
      {"text", "ids"}) and writes its entry into GOLDEN_DIR/expected.json
"""
import argparse
import json
import math
import struct
import sys

import numpy as np

GREEDY_STEPS = 24


# ---- safetensors ------------------------------------------------------

def read_safetensors(path):
    """name -> float64 array, decoding F32, F16 and BF16 exactly."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = data[base + lo:base + hi]
        dt = info["dtype"]
        if dt == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dt == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dt == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view("<f4")
        else:
            raise ValueError(f"{path}: tensor {name}: dtype {dt} not handled")
        out[name] = arr.astype(np.float64).reshape(info["shape"])
    return out


# ---- config -----------------------------------------------------------

class Config:
    def __init__(self, cfg):
        self.arch = cfg["architectures"][0]
        known = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                 "Qwen3ForCausalLM", "Gemma2ForCausalLM")
        if self.arch not in known:
            raise ValueError(f"architecture {self.arch} not handled")
        self.n_layers = cfg["num_hidden_layers"]
        self.hidden = cfg["hidden_size"]
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv_heads = cfg.get("num_key_value_heads") or self.n_heads
        self.head_dim = cfg.get("head_dim") or self.hidden // self.n_heads
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.theta = cfg.get("rope_theta", 10000.0)
        self.gemma2 = self.arch == "Gemma2ForCausalLM"
        # Gemma2's config class ties the embeddings by default
        self.tie = bool(cfg.get("tie_word_embeddings", self.gemma2))
        if cfg.get("rope_scaling"):
            raise ValueError("rope_scaling is not handled by the reference")
        qwen = self.arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
        # Qwen2 always has q/k/v biases; the others when attention_bias is true.
        self.qkv_bias = self.arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
        self.qk_norm = self.arch == "Qwen3ForCausalLM"
        # The window per layer. Mistral: every layer when sliding_window is
        # set. Qwen2/Qwen3: sliding_window counts only with
        # use_sliding_window, on layers i >= max_window_layers (or as
        # layer_types says).
        window = cfg.get("sliding_window")
        if qwen and not cfg.get("use_sliding_window", False):
            window = None
        if self.arch == "LlamaForCausalLM":
            window = None
        types = cfg.get("layer_types")
        if self.gemma2:
            self.gemma2_config(cfg)
            window = cfg.get("sliding_window", 4096)
            if types is None:  # local attention on the even layers, global on the odd
                types = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                         for i in range(self.n_layers)]
        if types is None:
            first = cfg.get("max_window_layers", 28) if qwen else 0
            types = ["sliding_attention" if window is not None and i >= first
                     else "full_attention" for i in range(self.n_layers)]
        self.windows = [window if t == "sliding_attention" and window else None for t in types]


    def gemma2_config(self, cfg):
        """Gemma2: the attention's scalar, the soft-caps (None: no capping)
        and the activation, gelu with the tanh approximation."""
        self.query_scalar = cfg.get("query_pre_attn_scalar", 256)
        self.attn_softcap = cfg.get("attn_logit_softcapping", 50.0)
        self.final_softcap = cfg.get("final_logit_softcapping", 30.0)
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"Gemma2 activation {act} not handled")


def load_model(model_dir):
    with open(f"{model_dir}/config.json") as f:
        cfg = Config(json.load(f))
    return cfg, read_safetensors(f"{model_dir}/model.safetensors")


# ---- forward ----------------------------------------------------------

def rmsnorm(x, w, eps):
    """w * x / sqrt(mean(x^2) + eps) over the last axis."""
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def norm(cfg, x, w):
    """The model's RMSNorm: Gemma2 scales by (1 + w)."""
    return rmsnorm(x, 1.0 + w if cfg.gemma2 else w, cfg.eps)


def softcap(s, cap):
    """cap * tanh(s / cap); no capping when cap is None."""
    return s if not cap else cap * np.tanh(s / cap)


def gelu_tanh(z):
    """gelu with the tanh approximation: 0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))."""
    return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))


def rope(x, positions, theta):
    """HF rotate_half: pairs (i, i + d/2), angle pos * theta^(-2i/d). x (..., T, d)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    ang = np.outer(positions.astype(np.float64), inv_freq)  # (T, d/2)
    cos = np.concatenate([np.cos(ang), np.cos(ang)], axis=-1)
    sin = np.concatenate([np.sin(ang), np.sin(ang)], axis=-1)
    half = d // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rot * sin


def attention_mask(n, window):
    """True where query q may see key k: k <= q, and k > q - window."""
    q = np.arange(n)[:, None]
    k = np.arange(n)[None, :]
    allowed = k <= q
    if window:
        allowed &= k > q - window
    return allowed


def softmax(s):
    s = s - np.max(s, axis=-1, keepdims=True)
    e = np.exp(s)
    return e / np.sum(e, axis=-1, keepdims=True)


def layer_forward(cfg, w, l, x, positions):
    p = f"model.layers.{l}."
    n = x.shape[0]
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    h = norm(cfg, x, w[p + "input_layernorm.weight"])
    q = h @ w[p + "self_attn.q_proj.weight"].T
    k = h @ w[p + "self_attn.k_proj.weight"].T
    v = h @ w[p + "self_attn.v_proj.weight"].T
    if cfg.qkv_bias:
        q = q + w[p + "self_attn.q_proj.bias"]
        k = k + w[p + "self_attn.k_proj.bias"]
        v = v + w[p + "self_attn.v_proj.bias"]
    q = q.reshape(n, nh, hd).transpose(1, 0, 2)  # (heads, T, hd)
    k = k.reshape(n, nkv, hd).transpose(1, 0, 2)
    v = v.reshape(n, nkv, hd).transpose(1, 0, 2)
    if cfg.qk_norm:  # Qwen3: RMSNorm over each head's head_dim, before RoPE
        q = rmsnorm(q, w[p + "self_attn.q_norm.weight"], cfg.eps)
        k = rmsnorm(k, w[p + "self_attn.k_norm.weight"], cfg.eps)
    q = rope(q, positions, cfg.theta)
    k = rope(k, positions, cfg.theta)
    rep = nh // nkv  # query head i uses kv head i // rep
    k = np.repeat(k, rep, axis=0)
    v = np.repeat(v, rep, axis=0)
    if cfg.gemma2:  # query_pre_attn_scalar^-1/2, then the soft-cap, then the mask
        s = softcap(q @ k.transpose(0, 2, 1) / math.sqrt(cfg.query_scalar), cfg.attn_softcap)
    else:
        s = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
    s = np.where(attention_mask(n, cfg.windows[l]), s, -np.inf)
    o = softmax(s) @ v  # (heads, T, hd)
    o = o.transpose(1, 0, 2).reshape(n, nh * hd)
    if cfg.gemma2:
        return gemma2_mlp(cfg, w, p, x, o @ w[p + "self_attn.o_proj.weight"].T)
    x = x + o @ w[p + "self_attn.o_proj.weight"].T
    h2 = rmsnorm(x, w[p + "post_attention_layernorm.weight"], cfg.eps)
    g = h2 @ w[p + "mlp.gate_proj.weight"].T
    u = h2 @ w[p + "mlp.up_proj.weight"].T
    return x + (g / (1.0 + np.exp(-g)) * u) @ w[p + "mlp.down_proj.weight"].T


def gemma2_mlp(cfg, w, p, x, attn):
    """Gemma2's rest of a layer: the attention output normed before its
    residual add, then the GeGLU MLP between pre- and post-norms."""
    x = x + norm(cfg, attn, w[p + "post_attention_layernorm.weight"])
    h = norm(cfg, x, w[p + "pre_feedforward_layernorm.weight"])
    g = h @ w[p + "mlp.gate_proj.weight"].T
    u = h @ w[p + "mlp.up_proj.weight"].T
    y = (gelu_tanh(g) * u) @ w[p + "mlp.down_proj.weight"].T
    return x + norm(cfg, y, w[p + "post_feedforward_layernorm.weight"])


def forward(cfg, w, ids):
    """Logits (T, vocab) at every position, and the residual stream of the
    last position after the embedding and after each layer."""
    x = w["model.embed_tokens.weight"][np.asarray(ids)]
    if cfg.gemma2:  # the normalizer sqrt(hidden_size)
        x = x * math.sqrt(cfg.hidden)
    positions = np.arange(len(ids))
    residuals = [x[-1].copy()]
    for l in range(cfg.n_layers):
        x = layer_forward(cfg, w, l, x, positions)
        residuals.append(x[-1].copy())
    x = norm(cfg, x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.tie else w["lm_head.weight"]
    logits = x @ head.T
    if cfg.gemma2:
        logits = softcap(logits, cfg.final_softcap)
    return logits, residuals


def argmax(row):
    return int(np.argmax(row))  # the first (lowest id) on a tie


def margin(row):
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def sig6(v):
    return float(f"{v:.6g}")


# ---- detokenizing (informational greedy_text) ------------------------

def byte_decoder():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def decode(model_dir, ids):
    try:
        with open(f"{model_dir}/tokenizer.json", encoding="utf-8") as f:
            tok = json.load(f)
    except OSError:
        return ""
    inv = {i: s for s, i in tok["model"]["vocab"].items()}
    for a in tok.get("added_tokens", []):
        inv[a["id"]] = a["content"]
    dec = byte_decoder()
    out = bytearray()
    for i in ids:
        s = inv.get(i, "")
        if s in [a["content"] for a in tok.get("added_tokens", [])]:
            out += s.encode("utf-8")
        else:
            out += bytes(dec[c] for c in s if c in dec)
    return out.decode("utf-8", errors="replace")


# ---- golden entries ---------------------------------------------------

def prompt_entry(cfg, w, model_dir, text, ids, with_residual):
    logits, residuals = forward(cfg, w, ids)
    last = logits[-1]
    entry = {
        "text": text,
        "ids": list(ids),
        "last_logits": [sig6(v) for v in last],
        "last_argmax": argmax(last),
        "position_argmax": [argmax(r) for r in logits],
    }
    seq = list(ids)
    greedy, min_margin = [], math.inf
    row = last
    for _ in range(GREEDY_STEPS):
        min_margin = min(min_margin, margin(row))
        t = argmax(row)
        greedy.append(t)
        seq.append(t)
        row = forward(cfg, w, seq)[0][-1]
    entry["greedy_ids"] = greedy
    entry["greedy_min_margin"] = sig6(min_margin)
    entry["greedy_text"] = decode(model_dir, greedy)
    if with_residual:
        entry["debug_residual_last_pos"] = [[sig6(v) for v in r] for r in residuals]
    return entry, logits


def cmd_check(golden):
    with open(f"{golden}/expected.json", encoding="utf-8") as f:
        exp = json.load(f)
    ok = True
    for name, m in exp["models"].items():
        cfg, w = load_model(f"{golden}/{name}")
        worst = 0.0
        for i, p in enumerate(m["prompts"]):
            logits, _ = forward(cfg, w, p["ids"])
            worst = max(worst, float(np.max(np.abs(logits[-1] - np.array(p["last_logits"])))))
            pos_ok = [argmax(r) for r in logits] == p["position_argmax"]
            seq, greedy = list(p["ids"]), []
            row = logits[-1]
            for _ in range(len(p["greedy_ids"])):
                greedy.append(argmax(row))
                seq.append(greedy[-1])
                row = forward(cfg, w, seq)[0][-1]
            if not pos_ok or greedy != p["greedy_ids"]:
                print(f"{name} prompt {i}: argmax or greedy ids differ")
                ok = False
        print(f"{name}: max |last logit - expected| = {worst:.3g}")
        ok = ok and worst <= 1e-5
    return 0 if ok else 1


def cmd_add(golden, name, prompts_path, mkmodel_args):
    model_dir = f"{golden}/{name}"
    cfg, w = load_model(model_dir)
    with open(prompts_path, encoding="utf-8") as f:
        prompts = json.load(f)
    with open(f"{model_dir}/config.json") as f:
        dims_src = json.load(f)
    keys = ("architectures", "num_hidden_layers", "hidden_size", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "torch_dtype",
            "tie_word_embeddings", "rope_theta", "rms_norm_eps", "max_position_embeddings",
            "sliding_window", "use_sliding_window", "max_window_layers", "layer_types",
            "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
            "hidden_activation", "bos_token_id", "eos_token_id")
    entry = {"dims": {k: dims_src[k] for k in keys if k in dims_src}}
    if mkmodel_args:
        entry["mkmodel_args"] = mkmodel_args
    entry["prompts"] = []
    for i, p in enumerate(prompts):
        e, _ = prompt_entry(cfg, w, model_dir, p["text"], p["ids"], i == 0)
        entry["prompts"].append(e)
        print(f"{name} prompt {i}: {len(p['ids'])} ids, greedy margin {e['greedy_min_margin']}")
    path = f"{golden}/expected.json"
    with open(path, encoding="utf-8") as f:
        exp = json.load(f)
    exp["models"][name] = entry
    with open(path, "w", encoding="utf-8") as f:
        json.dump(exp, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("golden")
    a = sub.add_parser("add")
    a.add_argument("golden")
    a.add_argument("name")
    a.add_argument("--prompts", required=True)
    a.add_argument("--mkmodel-args", default="")
    args = ap.parse_args(argv)
    if args.cmd == "check":
        return cmd_check(args.golden)
    return cmd_add(args.golden, args.name, args.prompts, args.mkmodel_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
