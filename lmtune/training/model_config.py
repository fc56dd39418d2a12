"""The model's shape and switches (``ModelConfig``): the typed config of lmtune.training.model, part of every run's
config (lmtune.training.config.RunConfig)."""

from __future__ import annotations

from dataclasses import dataclass

# The ablation switches' choices (validated with the config's other choices: lmtune.training.config.CHOICES).
NORMS = ("pre", "post", "none")
POSITIONS = ("rope", "nope")
FFNS = ("swiglu", "silu")
ABLATION_SWITCHES = ("norm", "position", "ffn")


@dataclass
class ModelConfig:
    """Decoder-only Transformer of the CS336 shape (the defaults: ~17M non-embedding parameters)."""

    vocab_size: int = 10000
    """Token ids the embedding and the output layer cover (taken from the data's meta.json unless set)."""
    context_length: int = 256
    """Tokens per training window; also the length of the RoPE tables."""
    d_model: int = 512
    """Width of the residual stream."""
    d_ff: int = 1344
    """Hidden width of the feed-forward layer (ffn: silu: 0 is 4 x d_model)."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 16
    """Attention heads; d_model / n_heads is the head dimension (even, for RoPE)."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding's frequencies."""
    norm_eps: float = 1e-5
    """RMSNorm's epsilon, x / sqrt(mean(x^2) + norm_eps) (CS336's value; also for the q/k norms)."""
    qk_norm: bool = False
    """RMSNorm on per-head queries and keys (Wortsman et al. 2023): tames attention-logit growth."""
    z_loss: float = 0.0
    """Coefficient on log^2 Z of the output softmax (Wortsman et al. 2023): tames output-logit drift."""
    norm: str = "pre"
    """Where the RMSNorms stand (an ablation, CS336 assignment 1): pre (before attention and the FFN, their outputs
    added to the residual stream; a final norm before the output layer) | post (after each residual add, as in the
    original Transformer; the final norm kept) | none (no RMSNorm at all)."""
    position: str = "rope"
    """rope (rotary position embeddings on queries and keys) | nope (none: the causal mask alone orders tokens)."""
    ffn: str = "swiglu"
    """swiglu (down(silu(gate x) * up x)) | silu (down(silu(up x)): two matrices; give d_ff, or 0 for 4 x d_model,
    which matches SwiGLU's parameters at d_ff = 8/3 d_model)."""
    parametrization: str = "sp"
    """sp (standard: today's model) | mup (maximal-update parametrization, Yang et al. 2022: an LR tuned at
    one width transfers to wider models; see lmtune.training.model)."""
    mup_base_width: int = 128
    """mup only: the d_model at which mup equals sp (the width multiplier is d_model / mup_base_width)."""
    mup_base_head_dim: int = 32
    """mup only: the head dimension at which mup's attention scale sqrt(mup_base_head_dim) / head_dim equals
    sp's 1/sqrt(head_dim) (a family that keeps d_model/n_heads fixed as it widens never changes the scale)."""

    @property
    def ffn_width(self) -> int:
        """The feed-forward layer's hidden width: d_ff, or (a SiLU FFN's d_ff 0) 4 x d_model."""
        return 4 * self.d_model if self.ffn == "silu" and self.d_ff == 0 else self.d_ff
