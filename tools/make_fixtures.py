#!/usr/bin/env python3
"""Build the reference fixtures in tests/fixtures/<arch>/ with transformers (issue 3).

For each architecture (qwen4_exp, qwen3_next, qwen3_5_moe, qwen3_moe) this script builds a tiny
random-weight model from a fixed seed, saves it with save_pretrained (fp32 safetensors +
config.json), draws a seeded prompt, and records, all on the CPU in fp32:

  prompt.npy   int32 [P]             the prompt token ids
  logits.npy   float32 [P+31, V]     logits of ONE full (no-cache) forward over prompt + greedy[:31];
                                     row P-1+i is the distribution that greedy[i] was taken from
  greedy.json  the 32-token greedy continuation (incremental decode with the KV/state cache)
  meta.json    config, seed, versions, logit statistics, decision margins, cross-checks

It runs where transformers 5.17 is installed (the GPU machine; see docs/FIXTURES.md for the exact
command). Nothing here is needed at build or test time: the C++ tests read the committed files.

The weights are redrawn after the Hugging Face init (see reinit_weights) so that every block
contributes at O(1) scale; with the stock 0.02 init many paths are so small that a bug in them
would hardly move the logits. Seeds are searched (deterministically) until every discrete
decision the model takes -- MoE top-k, QSA block top-k, greedy argmax -- has a clear margin, so
an fp32 implementation that differs only in summation order makes the same decisions.
"""

import argparse
import hashlib
import importlib
import importlib.util
import json
import math
import os
import platform
import shutil
import sys
import tarfile
import time
import traceback

import numpy as np
import torch

ARCHS = ["qwen4_exp", "qwen3_next", "qwen3_5_moe", "qwen3_moe"]

# sha256 of /work/shared/reference/transformers-5.17/* (the copies the team reads).
EXPECTED_SHA256 = {
    "qwen3_moe/configuration_qwen3_moe.py": "d161e9dd37b1b208ddb400fa649e2bb410562dc6a459947d77723b5225a808af",
    "qwen3_next/configuration_qwen3_next.py": "931f04df4c8631942e12e1e045c3123d7a0a9336792aef902a7a5f899d0f4049",
    "qwen4_exp/configuration_qwen4_exp.py": "b78132d8cd935437208ee281fa4569b771a63fcb58ebffe84f3e62f5b86235ca",
    "qwen3_moe/modeling_qwen3_moe.py": "b2666af64b7b31a02a152e9187ed2c5671262543b61510d0359c26fa491105ca",
    "qwen3_next/modeling_qwen3_next.py": "7ea1b287cc795c701591744195497694b96e1a1555016fead9d17fd09f9f584f",
    "qwen4_exp/modeling_qwen4_exp.py": "ca9f00bbd73cfcfbad7ba6073b5ecc23ca27bdace58b746fe6ead6ab175efc0c",
}

VOCAB = 512
HIDDEN = 64
PROMPT_LEN = 237  # not a multiple of the GDN chunk (64) nor of the QSA block (4)
N_NEW = 32
EOS = 1
EOS_POSITIONS = (79, 158)  # eos inside the prompt exercises the PLE n-gram segment reset
BASE_SEED = 1234
MAX_ATTEMPTS = 16
# A seed is accepted when every discrete decision has at least this margin (see module doc).
MIN_ROUTER_GAP = 1e-4  # router logits, k-th minus (k+1)-th
MIN_INDEXER_GAP = 1e-4  # QSA block scores, k-th minus (k+1)-th block
MIN_GREEDY_GAP = 1e-3  # logits, top-1 minus top-2 at each of the 32 greedy steps

NORM_RULE = "1-D (norm weights): HF init (0 for (1+w) norms, 1 for w norms) + N(0,0.2)"
# Config attributes that are not dataclass fields of the config class but that the modeling code
# reads with getattr, and that real checkpoints set: passed anyway (real Qwen3-MoE: head_dim 128 with
# hidden 2048 / 32 heads, so head_dim != hidden / heads; the fixture keeps that property).
EXTRA_ATTRS = {"qwen3_moe": {"head_dim"}}
# Comparison rule the C++ tests apply (docs/FIXTURES.md): per row cosine >= MIN_COSINE and
# max |diff| <= ABS_TOL_REL * max(1, max |reference logit|); greedy tokens identical.
MIN_COSINE = 0.9999
ABS_TOL_REL = 1e-3
GDN_LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 2


def arch_kwargs(arch):
    """Tiny config kwargs. Shapes mirror the real models' structure, not their size."""
    common = dict(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        num_experts=16,
        num_experts_per_tok=4,
        moe_intermediate_size=16,
        norm_topk_prob=True,
        eos_token_id=EOS,
        initializer_range=0.02,
        use_cache=True,
    )
    gdn = dict(
        num_hidden_layers=len(GDN_LAYER_TYPES),
        layer_types=list(GDN_LAYER_TYPES),
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        shared_expert_intermediate_size=32,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    if arch == "qwen3_moe":
        return dict(common, num_hidden_layers=4, intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[],
                    use_sliding_window=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if arch == "qwen3_next":
        return dict(common, **gdn, intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])
    if arch == "qwen3_5_moe":
        return dict(common, **gdn, intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[])
    if arch == "qwen4_exp":
        return dict(
            common,
            **dict(gdn, linear_num_value_heads=6),  # 3 value heads per key head, as in the real model
            output_gate_type="sigmoid",
            hc_count=4,
            hc_lowrank=32,
            ple_layer_ids=[2, 5],  # one-indexed: layers 1 and 4, both GDN
            ple_embed_dim=64,
            ple_conv_kernel_size=4,
            ngram_size=3,
            heads_per_ngram=4,
            ngram_vocab_size_base=257,
            make_ngram_vocab_size_divisible_by=128,
            split_ngram_parts=4,
            indexer_n_heads=4,
            indexer_kv_heads=1,
            indexer_head_dim=32,
            indexer_budget=32,
            indexer_compress_ratio=4,
        )
    raise ValueError(arch)


def log(*a):
    print(*a, flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def config_fields(cls):
    names = set()
    for k in cls.__mro__:
        names |= set(getattr(k, "__annotations__", {}))
    return names


def resolve_classes(arch):
    mod = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    cmod = importlib.import_module(f"transformers.models.{arch}.configuration_{arch}")
    lm = [n for n in dir(mod) if n.endswith("ForCausalLM") and not n.startswith("_")]
    if len(lm) != 1:
        raise RuntimeError(f"{arch}: ForCausalLM classes {lm}")
    model_cls = getattr(mod, lm[0])
    cfg_names = [n for n in dir(cmod) if n.endswith("Config") and not n.startswith("_") and n != "PreTrainedConfig"]
    text = [n for n in cfg_names if n.endswith("TextConfig")]
    if text:
        cfg_cls = getattr(cmod, text[0])
    else:
        base = [n for n in cfg_names if "Vision" not in n]
        cfg_cls = getattr(cmod, base[0])
    return mod, model_cls, cfg_cls


def build_config(arch, cfg_cls):
    kw = arch_kwargs(arch)
    fields = config_fields(cfg_cls)
    extra = {k: kw[k] for k in EXTRA_ATTRS.get(arch, ()) if k in kw and k not in fields}
    dropped = sorted(k for k in kw if k not in fields and k not in extra)
    kw = {k: v for k, v in kw.items() if k in fields}
    if arch == "qwen3_5_moe":
        try:
            default_rope = dict(cfg_cls().rope_parameters or {})
        except Exception:
            default_rope = {}
        rope = dict(default_rope)
        rope.update(kw["rope_parameters"])
        if "mrope_section" in rope:
            rope["mrope_section"] = [2, 1, 1]  # rotary dim 8 -> 4 frequencies; text positions make all equal
        kw["rope_parameters"] = rope
    try:
        cfg = cfg_cls(**kw, **extra)
    except Exception as e:  # noqa: BLE001
        log(f"  {cfg_cls.__name__} refused {sorted(extra)} as kwargs ({e}); setting them as attributes")
        cfg = cfg_cls(**kw)
        for k, v in extra.items():
            setattr(cfg, k, v)
    for k, v in extra.items():
        log(f"  extra attribute {k}={getattr(cfg, k, None)} (wanted {v})")
    for attr in ("_attn_implementation", "_experts_implementation"):
        try:
            setattr(cfg, attr, "eager")
        except Exception as e:  # noqa: BLE001
            log(f"  could not set {attr}: {e}")
    return cfg, dropped


def set_eager(model):
    for meth in ("set_attn_implementation", "set_experts_implementation"):
        if hasattr(model, meth):
            try:
                getattr(model, meth)("eager")
            except Exception as e:  # noqa: BLE001
                log(f"  {meth}('eager') failed: {e}")
    return {
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "experts_implementation": getattr(model.config, "_experts_implementation", None),
    }


def reinit_weights(model, seed):
    """Redraw every parameter so each block acts at O(1) scale (documented in docs/FIXTURES.md)."""
    g = torch.Generator().manual_seed(seed * 7919 + 17)
    rules = {}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda t: t[0]):
            if not p.is_floating_point():
                continue
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.05, 2.0, generator=g).log())
                rule = "A_log=log(U(0.05,2))"
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=g))
                rule = "dt_bias~N(0,1)"
            elif p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=g))
                rule = NORM_RULE
            elif "embed_tokens" in name or "ngram_embedding" in name:
                p.copy_(torch.randn(p.shape, generator=g))
                rule = "embedding~N(0,1)"
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * (2.0 / math.sqrt(p.shape[-1])))
                rule = "router~N(0,(2/sqrt(fan_in))^2)"
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
                rule = "N(0,1/fan_in), fan_in=last dim"
            rules.setdefault(rule, []).append(name)
    return rules


class Probe:
    """Forward hooks that record decision margins (router / QSA top-k) and QSA selection stats."""

    def __init__(self, model):
        self.model = model
        self.on = False
        self.in_indexer = False
        self.handles = []
        self.reset()
        self.routers = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("TopKRouter")]
        if not self.routers:
            self.routers = [(n, m) for n, m in model.named_modules() if n.endswith("mlp.gate")]
        self.indexers = [(n, m) for n, m in model.named_modules() if type(m).__name__.endswith("QSAIndexer")]
        for n, m in self.routers:
            self.handles.append(m.register_forward_hook(self._router_hook(n)))
        for n, m in self.indexers:
            self.handles.append(m.register_forward_pre_hook(self._idx_pre))
            self.handles.append(m.register_forward_hook(self._idx_post(n)))
        self._orig_topk = torch.Tensor.topk
        probe = self

        def topk(t, k, dim=-1, largest=True, sorted=True):  # noqa: A002
            if probe.on and probe.in_indexer and t.dim() == 1:
                n = t.shape[0]
                if k < n:
                    s = t.detach().double().sort(descending=True).values
                    probe.idx_gaps.append(float(s[k - 1] - s[k]))
                    probe.idx_score_absmax = max(probe.idx_score_absmax, float(s.abs().max()))
                    probe.sparse_queries += 1
                else:
                    probe.dense_queries += 1
            return probe._orig_topk(t, k, dim=dim, largest=largest, sorted=sorted)

        torch.Tensor.topk = topk

    def reset(self):
        self.router_min = {}
        self.router_logit_absmax = 0.0
        self.idx_gaps = []
        self.idx_score_absmax = 0.0
        self.sparse_queries = 0
        self.dense_queries = 0
        self.selection = {}

    def _router_hook(self, name):
        def hook(mod, inp, out):
            if not self.on:
                return
            logits = out[0] if isinstance(out, tuple) else out
            k = getattr(mod, "top_k", None) or self.model.config.num_experts_per_tok
            s = logits.detach().double().sort(dim=-1, descending=True).values
            gap = s[:, k - 1] - s[:, k]
            i = int(gap.argmin())
            prev = self.router_min.get(name)
            if prev is None or float(gap[i]) < prev[0]:
                self.router_min[name] = (float(gap[i]), i)
            self.router_logit_absmax = max(self.router_logit_absmax, float(logits.detach().abs().max()))

        return hook

    def _idx_pre(self, mod, args):
        self.in_indexer = True

    def _idx_post(self, name):
        def hook(mod, inp, out):
            self.in_indexer = False
            if not self.on:
                return
            sel = out if out.dtype == torch.bool else (out == 0)
            n_sel = sel[0, 0].sum(-1).long()  # [Q]
            q = n_sel.shape[0]
            kv = sel.shape[-1]
            visible = torch.arange(kv - q + 1, kv + 1)  # causal, no padding
            excluded = visible - n_sel
            self.selection[name] = {
                "queries": q,
                "queries_with_excluded_tokens": int((excluded > 0).sum()),
                "first_query_with_exclusion": int((excluded > 0).nonzero()[0]) if bool((excluded > 0).any()) else None,
                "max_excluded_tokens": int(excluded.max()),
                "max_selected_tokens": int(n_sel.max()),
                "budget": int(mod.token_budget),
                "compress_ratio": int(mod.compress_ratio),
            }

        return hook

    def summary(self):
        r = min(self.router_min.values()) if self.router_min else (float("inf"), -1)
        return {
            "router_min_gap": r[0],
            "router_min_gap_per_layer": {k: v[0] for k, v in self.router_min.items()},
            "router_logit_absmax": self.router_logit_absmax,
            "indexer_min_gap": min(self.idx_gaps) if self.idx_gaps else None,
            "indexer_score_absmax": self.idx_score_absmax,
            "indexer_sparse_decisions": self.sparse_queries,
            "indexer_dense_queries": self.dense_queries,
            "qsa_selection": self.selection,
        }

    def close(self):
        for h in self.handles:
            h.remove()
        torch.Tensor.topk = self._orig_topk


def make_prompt(seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, VOCAB, (PROMPT_LEN,), generator=g)
    for p in EOS_POSITIONS:
        ids[p] = EOS
    return ids


@torch.no_grad()
def full_logits(model, ids):
    return model(input_ids=ids[None], use_cache=False).logits[0].float()


@torch.no_grad()
def greedy_decode(model, prompt, n_new):
    out = model(input_ids=prompt[None], use_cache=True)
    pkv = out.past_key_values
    prefill = out.logits[0].float()
    rows = [prefill[-1]]
    toks = [int(prefill[-1].argmax())]
    for _ in range(n_new - 1):
        out = model(input_ids=torch.tensor([[toks[-1]]]), past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        rows.append(out.logits[0, -1].float())
        toks.append(int(rows[-1].argmax()))
    return toks, torch.stack(rows), prefill


@torch.no_grad()
def token_by_token(model, ids):
    """Every position through the single-token (recurrent / cached) path, from an empty cache."""
    rows = []
    pkv = None
    for i in range(ids.shape[0]):
        out = model(input_ids=ids[i : i + 1][None], past_key_values=pkv, use_cache=True)
        pkv = out.past_key_values
        rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


def top2_gap(rows):
    s = rows.double().sort(dim=-1, descending=True).values
    return (s[:, 0] - s[:, 1]).tolist()


def rowcos(a, b):
    a = a.double()
    b = b.double()
    return ((a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).float()


def diff_stats(ref, other):
    return {
        "max_abs": float((ref - other).abs().max()),
        "min_cosine": float(rowcos(ref, other).min()),
        "argmax_agree": float((ref.argmax(-1) == other.argmax(-1)).float().mean()),
    }


def zero_output_hook(mod, inp, out):
    if isinstance(out, tuple):
        return (torch.zeros_like(out[0]),) + tuple(out[1:])
    return torch.zeros_like(out)


def ablation_targets(model):
    layers = model.model.layers
    t = []

    def mixer(layer):
        return layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn

    t.append(("layer0.token_mixer", mixer(layers[0])))
    for i, layer in enumerate(layers):
        if hasattr(layer, "self_attn"):
            t.append((f"layer{i}.attention (first)", layer.self_attn))
            break
    t.append(("layer0.routed_experts", layers[0].mlp.experts))
    if hasattr(layers[0].mlp, "shared_expert"):
        t.append(("layer0.shared_expert", layers[0].mlp.shared_expert))
    t.append((f"layer{len(layers) - 1}.routed_experts", layers[-1].mlp.experts))
    for i, layer in enumerate(layers):
        if getattr(layer, "ple", None) is not None:
            t.append((f"layer{i}.ple", layer.ple))
    return t


def safetensors_inventory(d):
    from safetensors import safe_open

    inv = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    sl = f.get_slice(k)
                    inv[k] = f"{sl.get_dtype()}{list(sl.get_shape())}" + ("" if fn == "model.safetensors" else f" in {fn}")
    return inv


def attempt(arch, model_cls, cfg, seed):
    torch.manual_seed(seed)
    model = model_cls(cfg)
    impl = set_eager(model)
    model = model.float().eval()
    rules = reinit_weights(model, seed)
    prompt = make_prompt(seed)
    toks, dec_rows, prefill = greedy_decode(model, prompt, N_NEW)
    seq = torch.cat([prompt, torch.tensor(toks[:-1], dtype=prompt.dtype)])
    probe = Probe(model)
    try:
        probe.on = True
        logits = full_logits(model, seq)
        probe.on = False
        margins = probe.summary()
    finally:
        probe.close()
    gaps = top2_gap(logits[PROMPT_LEN - 1 :])
    margins["greedy_min_gap"] = min(gaps)
    full_argmax = logits[PROMPT_LEN - 1 :].argmax(-1).tolist()
    ok = (
        margins["router_min_gap"] >= MIN_ROUTER_GAP
        and (margins["indexer_min_gap"] is None or margins["indexer_min_gap"] >= MIN_INDEXER_GAP)
        and margins["greedy_min_gap"] >= MIN_GREEDY_GAP
        and full_argmax == toks
        and bool(torch.isfinite(logits).all())
    )
    score = min(
        margins["router_min_gap"] / MIN_ROUTER_GAP,
        (margins["indexer_min_gap"] / MIN_INDEXER_GAP) if margins["indexer_min_gap"] is not None else float("inf"),
        margins["greedy_min_gap"] / MIN_GREEDY_GAP,
    )
    return dict(seed=seed, model=model, impl=impl, rules=rules, prompt=prompt, toks=toks, dec_rows=dec_rows, prefill=prefill,
                seq=seq, logits=logits, margins=margins, gaps=gaps, ok=ok, score=score,
                full_argmax_matches_greedy=(full_argmax == toks))


def run_arch(arch, root, versions, threads):
    t0 = time.time()
    log(f"\n===== {arch} =====")
    mod, model_cls, cfg_cls = resolve_classes(arch)
    log(f"  classes: {model_cls.__name__} / {cfg_cls.__name__} (model_type {getattr(cfg_cls, 'model_type', '?')})")
    cfg, dropped = build_config(arch, cfg_cls)
    if dropped:
        log(f"  kwargs not accepted by {cfg_cls.__name__} (dropped): {dropped}")
    log(f"  layer_types: {getattr(cfg, 'layer_types', None)}")

    chosen = None
    tried = []
    for k in range(MAX_ATTEMPTS):
        seed = BASE_SEED + k
        a = attempt(arch, model_cls, cfg, seed)
        m = a["margins"]
        tried.append({"seed": seed, "ok": a["ok"], "router_min_gap": m["router_min_gap"],
                      "indexer_min_gap": m["indexer_min_gap"], "greedy_min_gap": m["greedy_min_gap"],
                      "full_argmax_matches_greedy": a["full_argmax_matches_greedy"]})
        log(f"  seed {seed}: ok={a['ok']} router_gap={m['router_min_gap']:.3g} "
            f"indexer_gap={m['indexer_min_gap']} greedy_gap={m['greedy_min_gap']:.3g} "
            f"argmax==greedy {a['full_argmax_matches_greedy']}")
        if chosen is None or a["score"] > chosen["score"]:
            chosen = a
        if a["ok"]:
            chosen = a
            break
    a = chosen
    seed = a["seed"]
    model, logits, seq, prompt, toks = a["model"], a["logits"], a["seq"], a["prompt"], a["toks"]
    log(f"  chosen seed {seed} (ok={a['ok']}); impl {a['impl']}; "
        f"reinit {json.dumps({k: len(v) for k, v in a['rules'].items()})}")
    log(f"  1-D parameters (norm rule): {a['rules'].get(NORM_RULE, [])}")

    checks = {}
    # determinism: a second forward must be bitwise identical
    checks["second_forward_bitwise_equal"] = bool(torch.equal(full_logits(model, seq), logits))
    # decode path (cached, one token a step) vs the full forward
    checks["prefill_vs_full"] = diff_stats(logits[:PROMPT_LEN], a["prefill"])
    checks["decode_steps_vs_full"] = diff_stats(logits[PROMPT_LEN - 1 :], a["dec_rows"])
    # every position through the single-token path (recurrent GDN, cached attention / indexer)
    t1 = time.time()
    tbt = token_by_token(model, seq)
    checks["token_by_token_vs_full"] = diff_stats(logits, tbt)
    checks["token_by_token_vs_full"]["seconds"] = round(time.time() - t1, 2)
    # transformers' own generate()
    try:
        with torch.no_grad():
            gen = model.generate(prompt[None], max_new_tokens=N_NEW, do_sample=False, pad_token_id=0)
        gen_toks = gen[0, PROMPT_LEN:].tolist()
        checks["generate_matches_greedy"] = gen_toks == toks[: len(gen_toks)]
        checks["generate_len"] = len(gen_toks)
    except Exception as e:  # noqa: BLE001
        checks["generate_error"] = repr(e)[:300]
    log(f"  checks: {json.dumps(checks)}")

    # QSA: the sparse path must really be taken at this prompt length
    qsa = None
    indexers = [m for n, m in model.named_modules() if type(m).__name__.endswith("QSAIndexer")]
    if indexers:
        sel = a["margins"]["qsa_selection"]
        assert sel and all(v["queries_with_excluded_tokens"] > 0 for v in sel.values()), sel
        saved = [(m.token_budget, m.block_topk) for m in indexers]
        dense_budget = 4 * ((seq.shape[0] + 64) // 4)
        for m in indexers:
            m.token_budget = dense_budget
            m.block_topk = dense_budget // m.compress_ratio
        dense = full_logits(model, seq)
        for m, (b, k) in zip(indexers, saved):
            m.token_budget, m.block_topk = b, k
        budget = saved[0][0]
        fits = budget  # positions 0..budget-1 see <= budget tokens: sparse == dense there
        d = (dense - logits).abs().max(-1).values
        qsa = {
            "budget": budget,
            "compress_ratio": indexers[0].compress_ratio,
            "block_topk": saved[0][1],
            "selection_per_layer": sel,
            "dense_vs_sparse_max_abs_all": float(d.max()),
            "dense_vs_sparse_max_abs_where_context_fits_budget": float(d[:fits].max()),
            "dense_vs_sparse_min_cosine": float(rowcos(dense, logits).min()),
            "positions_where_dense_differs_gt_1e-4": int((d > 1e-4).sum()),
            "dense_argmax_agree": float((dense.argmax(-1) == logits.argmax(-1)).float().mean()),
        }
        assert qsa["dense_vs_sparse_max_abs_all"] > 1e-3, qsa
        assert qsa["dense_vs_sparse_max_abs_where_context_fits_budget"] <= 1e-5, qsa
        log(f"  QSA sparse path taken: {json.dumps(qsa)}")

    # Sensitivity: cosine of the logits when one component's output is zeroed
    ablations = {}
    for name, module in ablation_targets(model):
        h = module.register_forward_hook(zero_output_hook)
        try:
            ab = full_logits(model, seq)
        finally:
            h.remove()
        ablations[name] = {"min_cosine": float(rowcos(ab, logits).min()),
                           "mean_cosine": float(rowcos(ab, logits).mean()),
                           "max_abs": float((ab - logits).abs().max())}
    if qsa:
        ablations["qsa_dense_instead_of_sparse"] = {"min_cosine": qsa["dense_vs_sparse_min_cosine"],
                                                    "max_abs": qsa["dense_vs_sparse_max_abs_all"]}
    log(f"  ablations: {json.dumps(ablations)}")

    # Same model on the GPU in fp32 (TF32 off): a second, independent fp32 implementation
    gpu = None
    if torch.cuda.is_available():
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            model.to("cuda")
            with torch.no_grad():
                gl = model(input_ids=seq[None].cuda(), use_cache=False).logits[0].float().cpu()
            model.to("cpu")
            gpu = diff_stats(logits, gl)
            gpu["device"] = torch.cuda.get_device_name(0)
        except Exception as e:  # noqa: BLE001
            gpu = {"error": repr(e)[:300]}
            model.to("cpu")
        log(f"  gpu fp32 vs cpu: {json.dumps(gpu)}")

    # Save and reload
    out = os.path.join(root, arch)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    model.save_pretrained(out)
    reload = {}
    try:
        kw = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        try:
            m2, info = model_cls.from_pretrained(out, experts_implementation="eager", **kw)
        except TypeError:
            m2, info = model_cls.from_pretrained(out, **kw)
        set_eager(m2)
        m2.eval()
        rl = full_logits(m2, seq)
        reload = {"bitwise_equal": bool(torch.equal(rl, logits)), "max_abs": float((rl - logits).abs().max()),
                  "loading_info": {k: sorted(map(str, v)) for k, v in info.items() if v}}
        del m2
    except Exception as e:  # noqa: BLE001
        reload = {"error": repr(e)[:500]}
    log(f"  reload: {json.dumps(reload)}")

    np.save(os.path.join(out, "prompt.npy"), prompt.numpy().astype(np.int32))
    np.save(os.path.join(out, "logits.npy"), np.ascontiguousarray(logits.numpy().astype(np.float32)))
    greedy = {
        "prompt_len": PROMPT_LEN,
        "n_new": N_NEW,
        "tokens": toks,
        "logits_row_of_token_0": PROMPT_LEN - 1,
        "note": "tokens[i] = argmax(logits.npy[prompt_len - 1 + i]); logits.npy covers prompt + tokens[:-1]",
        "top1_top2_gaps": a["gaps"],
        "min_top1_top2_gap": min(a["gaps"]),
    }
    with open(os.path.join(out, "greedy.json"), "w") as f:
        json.dump(greedy, f, indent=1)

    with open(os.path.join(out, "config.json")) as f:
        saved_cfg = json.load(f)
    extra_saved = {k: saved_cfg.get(k) for k in EXTRA_ATTRS.get(arch, ())}
    if extra_saved:
        attn0 = next((l.self_attn for l in model.model.layers if hasattr(l, "self_attn")), None)
        extra_saved["q_proj_shape"] = list(attn0.q_proj.weight.shape) if attn0 is not None else None
        log(f"  extra attributes in the saved config.json: {extra_saved}")
    absl = logits.abs()
    max_abs_logit = float(absl.max())
    variance = {k: v["max_abs"] for k, v in (("token_by_token_vs_full", checks["token_by_token_vs_full"]),
                                              ("gpu_fp32_vs_cpu", gpu or {})) if v and "max_abs" in v}
    files = {fn: {"bytes": os.path.getsize(os.path.join(out, fn)), "sha256": sha256_file(os.path.join(out, fn))}
             for fn in sorted(os.listdir(out))}
    meta = {
        "arch": arch,
        "hf_class": model_cls.__name__,
        "config_class": cfg_cls.__name__,
        "seed": seed,
        "seed_rule": f"first seed from {BASE_SEED} upward whose decisions all clear the margins (see margins)",
        "seeds_tried": tried,
        "weights_dtype": "float32",
        "compute": {"device": "cpu", "dtype": "float32", "torch_threads": threads,
                    "deterministic_algorithms": True, **a["impl"]},
        "versions": versions,
        "prompt_len": PROMPT_LEN,
        "prompt_rule": f"torch.randint(2, {VOCAB}) with torch.Generator seeded {seed}; eos ({EOS}) at {list(EOS_POSITIONS)}",
        "eos_positions_in_prompt": list(EOS_POSITIONS),
        "logits_shape": list(logits.shape),
        "logits_rows": "rows 0..P-1: prompt positions; row P-1+i: position whose argmax is greedy token i",
        "greedy_tokens": toks,
        "logit_stats": {"max_abs": float(absl.max()), "mean_abs": float(absl.mean()), "std": float(logits.std()),
                        "row_max_abs_min": float(absl.max(-1).values.min())},
        "comparison": {
            "rule": "every compared row: cosine >= min_cosine and max|diff| <= max_abs; greedy tokens identical",
            "min_cosine": MIN_COSINE,
            "max_abs": ABS_TOL_REL * max(1.0, max_abs_logit),
            "observed_fp32_implementation_variance_max_abs": variance,
            "smallest_ablation_max_abs": min(v["max_abs"] for v in ablations.values()),
            "largest_ablation_min_cosine": max(v["min_cosine"] for v in ablations.values()),
        },
        "dropped_config_kwargs": dropped,
        "extra_config_attributes": extra_saved,
        "margins": {k: v for k, v in a["margins"].items() if k != "qsa_selection"},
        "margin_thresholds": {"router": MIN_ROUTER_GAP, "indexer": MIN_INDEXER_GAP, "greedy": MIN_GREEDY_GAP},
        "checks": checks,
        "qsa": qsa,
        "ablations": ablations,
        "gpu_fp32_vs_cpu": gpu,
        "reload": reload,
        "reinit_rules": a["rules"],
        "tensors": safetensors_inventory(out),
        "files": files,
        "config": saved_cfg,
        "seconds": round(time.time() - t0, 1),
    }
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    log(f"  wrote {out}: " + ", ".join(f"{k} {v['bytes']}" for k, v in files.items()) + f" ({meta['seconds']} s)")
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures")
    ap.add_argument("--tar", default=None, help="also pack the fixtures into this .tar.gz")
    ap.add_argument("--src-tar", default=None, help="pack the installed reference sources here (for review)")
    ap.add_argument("--archs", default=",".join(ARCHS))
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.set_float32_matmul_precision("highest")
    try:
        torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    except Exception:  # noqa: BLE001
        pass

    import transformers
    import safetensors

    versions = {"transformers": transformers.__version__, "torch": torch.__version__, "numpy": np.__version__,
                "safetensors": safetensors.__version__, "python": platform.python_version(),
                "machine": platform.machine()}
    log("versions:", json.dumps(versions))
    tdir = os.path.dirname(transformers.__file__)
    log("transformers at", tdir)
    for pkg in ("fla", "causal_conv1d", "kernels"):
        log(f"  optional kernel package {pkg}: {'PRESENT' if importlib.util.find_spec(pkg) else 'absent'}")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    log("qwen model types:", sorted(k for k in CONFIG_MAPPING_NAMES if k.startswith("qwen")))
    hashes = {}
    for rel, exp in EXPECTED_SHA256.items():
        p = os.path.join(tdir, "models", rel)
        got = sha256_file(p) if os.path.exists(p) else None
        hashes[rel] = {"sha256": got, "matches_shared_reference": got == exp}
        log(f"  {rel}: {got} {'== shared copy' if got == exp else '!= shared copy ' + exp}")
    versions["reference_file_hashes"] = hashes
    if args.src_tar:
        with tarfile.open(args.src_tar, "w:gz") as tf:
            for sub in ("qwen4_exp", "qwen3_5_moe", "qwen3_next", "qwen3_moe"):
                d = os.path.join(tdir, "models", sub)
                if os.path.isdir(d):
                    for fn in sorted(os.listdir(d)):
                        if fn.endswith(".py"):
                            tf.add(os.path.join(d, fn), arcname=f"{sub}/{fn}")
            for extra in ("conversion_mapping.py", "integrations/moe.py", "integrations/hub_kernels.py",
                          "masking_utils.py"):
                p = os.path.join(tdir, extra)
                if os.path.exists(p):
                    tf.add(p, arcname=f"extra/{extra.replace('/', '__')}")

    os.makedirs(args.out, exist_ok=True)
    metas, failed = {}, {}
    for arch in args.archs.split(","):
        try:
            metas[arch] = run_arch(arch, args.out, versions, args.threads)
        except Exception:  # noqa: BLE001
            failed[arch] = traceback.format_exc()
            log(f"!! {arch} FAILED\n{failed[arch]}")
    if args.tar:
        with tarfile.open(args.tar, "w:gz") as tf:
            for arch in metas:
                tf.add(os.path.join(args.out, arch), arcname=arch)
    log("\nSUMMARY")
    for arch, m in metas.items():
        log(f"  {arch}: seed {m['seed']} logits {m['logits_shape']} max|logit| {m['logit_stats']['max_abs']:.3f} "
            f"greedy {m['greedy_tokens'][:8]}... reload {m['reload'].get('bitwise_equal')}")
    for arch in failed:
        log(f"  {arch}: FAILED")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
