"""Decoder-only Transformer LM of the CS336 shape.

token embedding -> n_layers x [RMSNorm -> causal MHA with RoPE -> +residual, RMSNorm -> SwiGLU -> +residual]
-> RMSNorm -> untied output projection. No biases. The ablations CS336's assignment asks for are switches of
ModelConfig (each default is the model above, bit for bit): norm post (RMSNorm after each residual add) or none,
position nope (no RoPE), ffn silu (down(silu(up x)), its width d_ff or 4 x d_model).

RMSNorm(x) = x / sqrt(mean(x^2) + eps) * g with eps = ModelConfig.norm_eps, 1e-5 by default as in
CS336's reference (torch's own default would be float32's machine epsilon, 1.19e-7), for every norm
of the model, the optional per-head q/k norms included.

Initialization: every Linear weight is drawn from a normal truncated at +-3 std with
std = sqrt(2 / (fan_in + fan_out)) (Glorot-style, so activations keep their scale in both
directions); the two projections that write into the residual stream (attention output and the
SwiGLU down projection) are further scaled by 1/sqrt(2 n_layers) so the residual stream's variance
does not grow with depth (GPT-2). The token embedding is truncated normal with std 1, which the
first pre-norm RMSNorm rescales anyway. RMSNorm gains start at 1.

Parametrization (ModelConfig.parametrization). "sp", the standard one, is all of the above: one learning
rate for every parameter. Under it the best LR shifts as the model widens, because Adam moves every weight
by about lr per step whatever its fan-in, so a hidden matrix's effect on its output grows with the width.
"mup" is the maximal-update parametrization (Yang et al. 2022, "Tensor Programs V", Table 3; the microsoft/mup
package's MuAdam and MuReadout), which makes the best LR transfer across widths. With the width multiplier
m = d_model / mup_base_width (d_ff and the heads are assumed to widen with d_model), under AdamW:
- the hidden matrices (attention qkv/out, SwiGLU gate/up/down: both dimensions grow) take lr/m, and m times
  the weight decay, so AdamW's per-step shrink lr * wd stays width-independent (MuAdam, decoupled_wd=False);
  their init is SP's, whose variance already falls as 1/fan_in when both dimensions grow together;
- the embedding and the output layer keep the full lr; the output layer's 1/m lives in the forward instead
  (logits = lm_head(h) / m, MuReadout's output multiplier), and its init std is the base shape's,
  sqrt(2 / (mup_base_width + vocab)), constant in width (MuReadout's rescale by sqrt(m));
- attention scores are q.k * sqrt(mup_base_head_dim) / head_dim (1/d_head, not 1/sqrt(d_head): under μP q and
  k become correlated as the head widens).
At d_model == mup_base_width and head_dim == mup_base_head_dim every one of these equals SP, bit for bit.
Lingle 2024 ("A Large-Scale Exploration of μ-Transfer") found trainable RMSNorm gains and the attention scale
to be where μ-transfer can break; this model keeps its RMSNorm gains (LR multiplier 1, no decay), so check
transfer on it (lmtune.training.coord_check) rather than assume it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmtune.training.model_config import ModelConfig


def rope_tables(head_dim: int, context_length: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (context_length, head_dim // 2) for rotary position embeddings."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(context_length, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :h], x[..., h:]) of x (..., T, head_dim) by position-dependent angles, in at
    least float32 whatever x's dtype (as torchtitan does): in bf16, cos and sin of the far positions keep
    only 8 bits, and the rotation's error grows with the position."""
    half = x.shape[-1] // 2
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    x1, x2 = wide[..., :half], wide[..., half:]
    cos = cos[: x.shape[-2]].to(wide.dtype)
    sin = sin[: x.shape[-2]].to(wide.dtype)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).to(x.dtype)


def attention_scores(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """q.k times ``scale`` (None: SP's 1/sqrt(head_dim), divided as ever)."""
    product = q @ k.transpose(-2, -1)
    return product / math.sqrt(q.shape[-1]) if scale is None else product * scale


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Plain masked-softmax attention (explicit T x T mask): the slow, obviously-correct path."""
    scores = attention_scores(q, k, scale)
    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v


def causal_logits(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """Attention logits q.k/sqrt(d) (or q.k * ``scale``) in float32, the positions a causal mask hides at -inf."""
    scores = attention_scores(q.float(), k.float(), scale)
    t = q.shape[-2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    return scores.masked_fill(~mask, float("-inf"))


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.out = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.norm_eps) if cfg.qk_norm else None
        self.use_sdpa = True
        self.rope = cfg.position == "rope"
        self.scale = attention_scale(cfg)
        """The softmax scale: None for SP's 1/sqrt(head_dim) (μP's too at its base head dimension)."""

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, d = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if not self.rope:  # (NoPE: the causal mask alone tells positions apart)
            return q, k, v
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.project(x, cos, sin)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            y = reference_attention(q, k, v, self.scale)
        return self.out(y.transpose(1, 2).reshape(b, t, d))

    @torch.no_grad()
    def max_logit(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Largest causal attention logit q.k/sqrt(d): the quantity whose growth breaks small models."""
        q, k, _ = self.project(x, cos, sin)
        return causal_logits(q, k, self.scale).amax()


def attention_scale(cfg: ModelConfig) -> float | None:
    """μP's 1/d_head softmax scale, sqrt(mup_base_head_dim) / head_dim; None (SDPA's default 1/sqrt(head_dim))
    under SP and wherever μP's equals it, so the base shape's arithmetic is SP's exactly."""
    head_dim = cfg.d_model // cfg.n_heads
    if cfg.parametrization == "sp" or head_dim == cfg.mup_base_head_dim:
        return None
    return math.sqrt(cfg.mup_base_head_dim) / head_dim


# The matrices inside a block whose both dimensions grow with the width (μP's "hidden" weights).
HIDDEN = ("attn.qkv.weight", "attn.out.weight", "ffn.gate.weight", "ffn.up.weight", "ffn.down.weight")


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SiLUFeedForward(nn.Module):
    """The ungated FFN of the SwiGLU ablation: down(silu(up x))."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


def rms_norm(cfg: ModelConfig) -> nn.Module:
    """An RMSNorm over d_model, or (norm: none) the identity."""
    return nn.Identity() if cfg.norm == "none" else nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    """Attention then the FFN, each added to the residual stream, with RMSNorms where ``cfg.norm`` puts them:
    pre x + f(norm(x)), post norm(x + f(x)), none x + f(x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.post_norm = cfg.norm == "post"
        self.attn_norm = rms_norm(cfg)
        self.attn = Attention(cfg)
        self.ffn_norm = rms_norm(cfg)
        self.ffn = SwiGLU(cfg.d_model, cfg.ffn_width) if cfg.ffn == "swiglu" else SiLUFeedForward(cfg.d_model,
                                                                                                  cfg.ffn_width)

    def attention_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention reads of the residual stream ``x``."""
        return x if self.post_norm else self.attn_norm(x)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.post_norm:
            x = self.attn_norm(x + self.attn(x, cos, sin))
            return self.ffn_norm(x + self.ffn(x))
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class TransformerLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = rms_norm(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.context_length, cfg.rope_theta)
        # Not persistent: derived from the config, so checkpoints stay small and shape-agnostic.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @property
    def width_multiplier(self) -> float:
        """μP's m = d_model / mup_base_width (1.0 under SP)."""
        if self.cfg.parametrization == "sp":
            return 1.0
        return self.cfg.d_model / self.cfg.mup_base_width

    def lr_multipliers(self) -> dict[str, float]:
        """Each parameter's learning rate over the schedule's, by name: 1/m for μP's hidden matrices (Adam's
        rule), 1.0 for everything else and for every parameter under SP."""
        hidden = 1.0 / self.width_multiplier
        return {name: hidden if name.endswith(HIDDEN) else 1.0 for name, _ in self.named_parameters()}

    def weight_decay_multipliers(self) -> dict[str, float]:
        """Each parameter's weight decay over the config's, by name: 0 for the RMSNorm gains (never decayed),
        m for μP's hidden matrices (so lr * wd is width-independent), 1.0 for the rest."""
        gains = {f"{owner}.weight" for owner, module in self.named_modules()
                 if isinstance(module, nn.RMSNorm)}
        return {name: 0.0 if name in gains else self.width_multiplier if name.endswith(HIDDEN) else 1.0
                for name, _ in self.named_parameters()}

    def reset_parameters(self) -> None:
        residual_scale = 1.0 / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                fan_out, fan_in = module.weight.shape
                if name == "lm_head" and self.cfg.parametrization == "mup":
                    fan_in = self.cfg.mup_base_width  # the base shape's std, constant in width (MuReadout)
                std = math.sqrt(2.0 / (fan_in + fan_out))
                if name.endswith("attn.out") or name.endswith("ffn.down"):
                    std *= residual_scale
                nn.init.trunc_normal_(module.weight, std=std, a=-3 * std, b=3 * std)
            elif isinstance(module, nn.Embedding):
                nn.init.trunc_normal_(module.weight, std=1.0, a=-3.0, b=3.0)
            elif isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        return self.final_norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) without targets; with targets, the mean loss (cross-entropy + z-loss)."""
        logits = self.readout(self.hidden(idx))
        if targets is None:
            return logits
        return lm_loss(logits, targets, self.cfg.z_loss)

    def readout(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of the final hidden states: lm_head's, divided by m under μP (its output multiplier)."""
        logits = self.lm_head(hidden)
        return logits if self.cfg.parametrization == "sp" else logits / self.width_multiplier

    @torch.no_grad()
    def stability_probes(self, idx: torch.Tensor) -> dict[str, float]:
        """Largest attention logit over layers and output-logit size, for the instability diagnostics."""
        return {name: value.item() for name, value in self.probe_tensors(idx).items()}

    @torch.no_grad()
    def probe_tensors(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """``stability_probes`` as 0-d tensors on the device (no host sync: a fused model takes them per member)."""
        x = self.embed(idx)
        attn_max = torch.tensor(float("-inf"), device=idx.device)
        for block in self.blocks:
            attn_max = torch.maximum(attn_max, block.attn.max_logit(block.attention_input(x), self.rope_cos,
                                                                     self.rope_sin))
            x = block(x, self.rope_cos, self.rope_sin)
        logits = self.readout(self.final_norm(x)).float()
        return {
            "attn_logit_max": attn_max,
            "output_logit_max": logits.abs().amax(),
            "output_logz_mean": logits.logsumexp(-1).mean(),
        }


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy (+ z-loss), computed in at least float32 whatever the logits' dtype."""
    flat = logits.reshape(-1, logits.shape[-1])
    flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
    loss = F.cross_entropy(flat, targets.reshape(-1))
    if z_loss > 0:
        loss = loss + z_loss * flat.logsumexp(-1).square().mean()
    return loss


def count_parameters(cfg: ModelConfig) -> dict[str, int]:
    """Parameter counts by part. ``non_embedding`` excludes the token embedding and the output
    projection (the convention behind the CS336 "17M": 12.46M here + 5.12M output = 17.58M)."""
    d, f, v, n = cfg.d_model, cfg.ffn_width, cfg.vocab_size, cfg.n_layers
    head_dim = d // cfg.n_heads
    gains = 0 if cfg.norm == "none" else d  # (one RMSNorm's)
    ffn = (3 if cfg.ffn == "swiglu" else 2) * d * f
    per_layer = 4 * d * d + ffn + 2 * gains + (2 * head_dim if cfg.qk_norm else 0)
    non_embedding = n * per_layer + gains
    embedding = v * d
    output = v * d
    return {
        "embedding": embedding,
        "output": output,
        "non_embedding": non_embedding,
        "total": embedding + output + non_embedding,
    }


def flops_per_token(cfg: ModelConfig) -> float:
    """Training FLOPs per token: 6 x (non-embedding + output params) for the matmuls, forward and
    backward, plus attention's QK^T and AV: 12 * n_layers * context * d_model (full square, no causal
    discount). The default config gives ~112 MFLOP/token."""
    counts = count_parameters(cfg)
    return 6.0 * (counts["non_embedding"] + counts["output"]) + 12.0 * cfg.n_layers * cfg.context_length * cfg.d_model
