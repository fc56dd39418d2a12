"""K Transformer LMs of the same shape trained as one (horizontal fusion, HFTA: Wang et al., MLSys 2021).

Every weight of ``TransformerLM`` gets a leading member dimension: linear layers become batched
matmuls over the members, embeddings and RMSNorm gains are per member, and attention folds the
members into SDPA's batch dimension. One forward and backward serves all members; the loss is one
value per member, and since no operation mixes members, the gradient of their sum is each member's
own gradient. The module tree mirrors ``TransformerLM``'s, so ``member_state_dict(k)`` is an ordinary
single-model state dict (checkpoints, ``best.pt``) and ``from_members`` stacks ordinary models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmtune.training.config import ModelConfig
from lmtune.training.model import TransformerLM, apply_rope, causal_logits, rope_tables


class MemberLinear(nn.Module):
    """``members`` bias-free linear layers: x (K, ..., in) -> (K, ..., out) as one batched matmul."""

    def __init__(self, members: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, out_features, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, *middle, d = x.shape
        y = torch.bmm(x.reshape(k, -1, d), self.weight.transpose(1, 2))
        return y.view(k, *middle, self.weight.shape[1])


class MemberRMSNorm(nn.Module):
    """RMSNorm with a gain per member: x (K, ..., d)."""

    def __init__(self, members: int, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(members, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gain = self.weight.view(self.weight.shape[0], *([1] * (x.dim() - 2)), self.weight.shape[1])
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * gain


class MemberEmbedding(nn.Module):
    """A token embedding per member, looked up as one table with each member's rows offset."""

    def __init__(self, members: int, vocab_size: int, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, vocab_size, dim))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        k, vocab, dim = self.weight.shape
        offsets = torch.arange(k, device=idx.device).view(k, *([1] * (idx.dim() - 1))) * vocab
        return F.embedding(idx + offsets, self.weight.view(k * vocab, dim))


class MemberAttention(nn.Module):
    def __init__(self, members: int, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.qkv = MemberLinear(members, cfg.d_model, 3 * cfg.d_model)
        self.out = MemberLinear(members, cfg.d_model, cfg.d_model)
        self.q_norm = MemberRMSNorm(members, self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = MemberRMSNorm(members, self.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q, k, v of shape (K * B, heads, T, head_dim): the members folded into the batch."""
        k, b, t, _ = x.shape
        q, key, v = self.qkv(x).view(k, b, t, 3, self.n_heads, self.head_dim).permute(3, 0, 1, 4, 2, 5)
        if self.q_norm is not None:
            q, key = self.q_norm(q), self.k_norm(key)
        q, key, v = (z.reshape(k * b, self.n_heads, t, self.head_dim) for z in (q, key, v))
        return apply_rope(q, cos, sin), apply_rope(key, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        k, b, t, d = x.shape
        q, key, v = self.project(x, cos, sin)
        y = F.scaled_dot_product_attention(q, key, v, is_causal=True)
        return self.out(y.view(k, b, self.n_heads, t, self.head_dim).transpose(2, 3).reshape(k, b, t, d))

    @torch.no_grad()
    def max_logit(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Each member's largest causal attention logit, shape (K,)."""
        q, key, _ = self.project(x, cos, sin)
        return causal_logits(q, key).view(x.shape[0], -1).amax(1)


class MemberSwiGLU(nn.Module):
    def __init__(self, members: int, d_model: int, d_ff: int):
        super().__init__()
        self.gate = MemberLinear(members, d_model, d_ff)
        self.up = MemberLinear(members, d_model, d_ff)
        self.down = MemberLinear(members, d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MemberBlock(nn.Module):
    def __init__(self, members: int, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = MemberRMSNorm(members, cfg.d_model, cfg.norm_eps)
        self.attn = MemberAttention(members, cfg)
        self.ffn_norm = MemberRMSNorm(members, cfg.d_model, cfg.norm_eps)
        self.ffn = MemberSwiGLU(members, cfg.d_model, cfg.d_ff)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class FusedTransformerLM(nn.Module):
    """``members`` TransformerLMs of one shape: ``forward(idx, targets)`` returns each member's mean loss.

    ``idx`` is (B, T) when every member sees the same batch (common random numbers) or (K, B, T) for a
    batch per member; the logits are (K, B, T, vocab).
    """

    def __init__(self, members: int, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = MemberEmbedding(members, cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(MemberBlock(members, cfg) for _ in range(cfg.n_layers))
        self.final_norm = MemberRMSNorm(members, cfg.d_model, cfg.norm_eps)
        self.lm_head = MemberLinear(members, cfg.d_model, cfg.vocab_size)
        cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.context_length, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def members(self) -> int:
        return self.embed.weight.shape[0]

    @classmethod
    def from_members(cls, models: list[TransformerLM]) -> FusedTransformerLM:
        """The fused model whose member k is ``models[k]`` (same config, device and dtype)."""
        first = models[0]
        fused = cls(len(models), first.cfg)
        states = [m.state_dict() for m in models]
        stacked = {name: torch.stack([s[name] for s in states]) for name in states[0]}
        param = next(first.parameters())
        fused.to(device=param.device, dtype=param.dtype)
        fused.load_state_dict(stacked)
        return fused

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member k's weights as a TransformerLM state dict (copies, so they outlive a later ``keep``)."""
        return {name: value[k].detach().clone() for name, value in self.state_dict().items()}

    @torch.no_grad()
    def keep(self, positions: list[int]) -> None:
        """Keep only the members at ``positions`` (in that order): the others' compute is reclaimed."""
        index = torch.tensor(positions, dtype=torch.long, device=self.rope_cos.device)
        for param in self.parameters():
            param.data = param.data.index_select(0, index)
            param.grad = None

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() == 2:  # one batch for every member
            idx = idx.unsqueeze(0).expand(self.members, *idx.shape)
        return self.embed(idx)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(idx)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin)
        logits = self.lm_head(self.final_norm(x))
        if targets.dim() == 2:
            targets = targets.unsqueeze(0).expand(self.members, *targets.shape)
        return member_losses(logits, targets, self.cfg.z_loss)

    @torch.no_grad()
    def stability_probes(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        """Per member (tensors of shape (K,)): largest attention logit over layers and output-logit size."""
        x = self.embed_tokens(idx)
        attn_max = torch.full((self.members,), float("-inf"), device=idx.device)
        for block in self.blocks:
            attn_max = torch.maximum(attn_max, block.attn.max_logit(block.attn_norm(x), self.rope_cos, self.rope_sin))
            x = block(x, self.rope_cos, self.rope_sin)
        logits = self.lm_head(self.final_norm(x)).float().view(self.members, -1, self.cfg.vocab_size)
        return {
            "attn_logit_max": attn_max,
            "output_logit_max": logits.abs().amax(dim=(1, 2)),
            "output_logz_mean": logits.logsumexp(-1).mean(1),
        }


def member_losses(logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0) -> torch.Tensor:
    """Each member's mean cross-entropy (+ z-loss), shape (K,), in at least float32 (as ``lm_loss``)."""
    members, vocab = logits.shape[0], logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    flat = flat.to(torch.promote_types(flat.dtype, torch.float32))
    loss = F.cross_entropy(flat, targets.reshape(-1), reduction="none").view(members, -1).mean(1)
    if z_loss > 0:
        loss = loss + z_loss * flat.logsumexp(-1).square().view(members, -1).mean(1)
    return loss
