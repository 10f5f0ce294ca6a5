"""A draft head in the style of EAGLE(-1): one decoder layer that predicts the target's next hidden
state from its current one, so drafting costs a thirtieth of a target step instead of a model.

Terms, for a sequence of tokens t_0 .. t_n and the target's hidden states f_j (the last layer's
output after the final norm, what the output layer reads; ``KVCache.hidden`` keeps them):

- entry j of the head reads ``cat(embed(t_{j+1}), f_j)`` through ``fc`` and one Llama decoder
  layer that attends over the entries before it, and outputs g_j, an estimate of f_{j+1};
- the target's own output layer turns g_j into a draft distribution for t_{j+2};
- chained, g_j stands in for f_{j+1} at entry j+1, with the drafted token as t_{j+2}.

The weights are named and laid out as EAGLE-1 publishes them (``fc`` with a bias, ``layers.0.*``
as in transformers' Llama with rotate-half rotary, no input norm on the first layer, no final
norm), so a published head for another Llama loads the same way; this project's own head
(``python -m speculative_complete.decoding.draft_head.training``) adds the first layer's input norm
and scores only the ``vocab`` most frequent tokens (the output layer over 49k tokens would cost more
than the layer).

Written by hand: no library runs an EAGLE head over this project's lean forward on the CPU
(EAGLE's own code wraps a transformers model on a GPU), and the layer is 60 lines.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

SHIPPED = Path(__file__).parent / "weights"  # heads that ship with the package, one folder each
WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


# On CUDA, torch prefers cuDNN's attention on Hopper (sm90, cuDNN > 9.15), which builds an
# execution plan the first time it meets each shape. A drafting head attends over one more entry
# every step, so nearly every step met a new shape: on an H200 a pass with the head took many
# times longer on prompts it had not seen than on the same prompts a second time
# (``CHANGELOG.md``, 2026-11-26, the GPU runs). Its attention is
# tiny (a few rows over at most 512 entries): the other kernels serve it without plans. (Read
# from torch's ``sdp_utils.cpp`` and those timings; not yet measured with this change on a GPU.)
NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass(frozen=True)
class HeadConfig:
    dim: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    input_norm: bool = True  # EAGLE-1's first layer has none
    target: str = ""  # the target's fingerprint (``fingerprint``); empty: not checked
    # Divides the head's scores where its probability for its own draft decides how far to draft
    # (fitted on held-out code by ``train_head``: that probability then tracks how often the
    # draft is right); 1.0 for a head that was never fitted.
    confidence_temperature: float = 1.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


class HeadCache:
    """The head's keys and values, (1, kv_heads, entries, head_dim) each; cropping slices."""

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys is not None:
            keys, values = torch.cat([self.keys, keys], dim=2), torch.cat([self.values, values], dim=2)
        self.keys, self.values = keys, values
        return keys, values

    def crop(self, length: int) -> None:
        if self.keys is not None:
            self.keys, self.values = self.keys[:, :, :length], self.values[:, :, :length]


class HeadAttention(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        c, d = config, config.head_dim
        self.config = config
        self.q_proj = nn.Linear(c.dim, c.heads * d, bias=False)
        self.k_proj = nn.Linear(c.dim, c.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(c.dim, c.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(c.heads * d, c.dim, bias=False)
        self.qkv: nn.Linear | None = None  # q/k/v's rows as one product, once ``fuse``d
        self.rotary = Rotary(config)

    def fuse(self) -> None:
        """q, k and v as one product (``DraftHead.fuse``)."""
        self.qkv = _fused((self.q_proj, self.k_proj, self.v_proj))
        del self.q_proj, self.k_proj, self.v_proj

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, rows, dim) -> the heads of q, k and v side by side,
        (batch, rows, heads + 2 * kv_heads, head_dim)."""
        if self.qkv is not None:
            out = self.qkv(x)
        else:
            out = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        return out.view(*x.shape[:2], -1, self.config.head_dim)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None, cache: HeadCache | None
    ) -> torch.Tensor:
        """x: (batch, rows, dim); mask: (rows, keys) bool, True where a row may look (None:
        causal without a cache, every key with one)."""
        c = self.config
        batch, rows, _ = x.shape
        heads = self._project(x)
        qk = self.rotary(heads[:, :, : c.heads + c.kv_heads], positions).transpose(1, 2)
        q, k = qk[:, : c.heads], qk[:, c.heads :]
        v = heads[:, :, c.heads + c.kv_heads :].transpose(1, 2)
        if cache is not None:
            k, v = cache.append(k, v)
        causal = mask is None and cache is None
        with sdpa_kernel(NO_CUDNN) if q.is_cuda else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, rows, c.heads * c.head_dim))


class Rotary:
    """Rotate-half rotary embeddings from a table of cos and sin per position, grown on demand:
    one lookup a pass instead of recomputing the angles (fewer small ops in a drafting step of
    well under a millisecond). Not a module, so that it stays fp32 when the head is
    cast to bf16 (positions of a few hundred times bf16-rounded frequencies are off by up to a
    radian), and not in the weights file."""

    def __init__(self, config: HeadConfig) -> None:
        d = config.head_dim
        # on the CPU even where a head is built on the meta device (``load_head``)
        cpu = torch.device("cpu")
        self.inverse_freq = config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=cpu) / d)
        self.cos = self.sin = torch.zeros(0, d, device=cpu)

    def _grow(self, positions: int, device: torch.device) -> None:
        angles = torch.arange(positions, dtype=torch.float32)[:, None] * self.inverse_freq[None, :]
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        self.cos, self.sin = cos.to(device), sin.to(device)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (batch, rows, heads, head_dim) rotated by positions (rows,)."""
        last = int(positions.max()) + 1
        if last > len(self.cos) or self.cos.device != x.device:
            self._grow(max(last, 2 * len(self.cos), 64), x.device)
        cos, sin = self.cos[positions][:, None].to(x.dtype), self.sin[positions][:, None].to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin


def _fused(parts: Sequence[nn.Linear]) -> nn.Linear:
    """One bias-free layer whose output rows are those of ``parts`` in order."""
    weight = torch.cat([p.weight.detach() for p in parts])
    # on the meta device: no random initialization to draw (and no global generator disturbed)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    return fused


class HeadMLP(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, config.ffn, bias=False)
        self.up_proj = nn.Linear(config.dim, config.ffn, bias=False)
        self.down_proj = nn.Linear(config.ffn, config.dim, bias=False)
        self.gate_up: nn.Linear | None = None  # gate's and up's rows as one product, once ``fuse``d

    def fuse(self) -> None:
        """gate and up as one product (``DraftHead.fuse``)."""
        self.gate_up = _fused((self.gate_proj, self.up_proj))
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
        else:
            gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(F.silu(gate) * up)


class HeadLayer(nn.Module):
    def __init__(self, config: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.dim, config.norm_eps) if config.input_norm else None
        self.self_attn = HeadAttention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.dim, config.norm_eps)
        self.mlp = HeadMLP(config)

    def forward(self, x, positions, mask, cache):
        normed = x if self.input_layernorm is None else self.input_layernorm(x)
        x = x + self.self_attn(normed, positions, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class DraftHead(nn.Module):
    """g = layer(fc(cat(embed(next token), f))); ``vocab`` lists the token ids it scores."""

    def __init__(self, config: HeadConfig, vocab: torch.Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        self.fc = nn.Linear(2 * config.dim, config.dim, bias=True)
        self.layers = nn.ModuleList([HeadLayer(config)])
        self.register_buffer("vocab", vocab if vocab is not None else torch.zeros(0, dtype=torch.long))

    def forward(
        self,
        features: torch.Tensor,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor | None = None,
        cache: HeadCache | None = None,
    ) -> torch.Tensor:
        """features, embeds: (batch, rows, dim) -> g: (batch, rows, dim)."""
        x = self.fc(torch.cat([embeds, features], dim=-1))
        return self.layers[0](x, positions, mask, cache)

    def fuse(self) -> DraftHead:
        """For drafting only: q/k/v and gate/up each as one product (3 products a step fewer,
        the same sums row for row). A fused head is neither trained nor saved."""
        for layer in self.layers:
            if layer.self_attn.qkv is None:
                layer.self_attn.fuse()
                layer.mlp.fuse()
        return self

    # -- files ---------------------------------------------------------------------------------
    def save(self, folder: Path, metadata: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        state = self.state_dict().items()
        tensors = {name: t.detach().to("cpu", torch.bfloat16).contiguous() for name, t in state}
        tensors["vocab"] = self.vocab.to("cpu", torch.int32)
        save_file(
            tensors, str(folder / WEIGHTS_NAME), metadata={k: str(v) for k, v in (metadata or {}).items()}
        )
        (folder / CONFIG_NAME).write_text(json.dumps({"draft_head": asdict(self.config)}, indent=1))


def load_head(folder: Path, dtype: torch.dtype = torch.float32) -> DraftHead:
    """A head saved by ``DraftHead.save``, or a published EAGLE-1 head (``config.json`` in
    transformers' Llama terms, weights in safetensors: pickles are never read)."""
    from safetensors.torch import load_file

    settings = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
    tensors = load_file(str(folder / WEIGHTS_NAME))
    if "draft_head" in settings:
        config = HeadConfig(**settings["draft_head"])
    else:  # EAGLE-1: a transformers Llama config, one layer
        config = HeadConfig(
            dim=settings["hidden_size"],
            heads=settings["num_attention_heads"],
            kv_heads=settings.get("num_key_value_heads", settings["num_attention_heads"]),
            ffn=settings["intermediate_size"],
            rope_theta=float(settings.get("rope_theta", 10000.0)),
            norm_eps=float(settings.get("rms_norm_eps", 1e-6)),
            input_norm="layers.0.input_layernorm.weight" in tensors,
        )
    vocab = tensors.pop("vocab", torch.zeros(0, dtype=torch.long)).long()
    with torch.device("meta"):  # the file's tensors become the weights: no random init to free
        head = DraftHead(config, vocab)
    wanted = {name for name in head.state_dict() if name != "vocab"}
    missing = wanted - set(tensors) - {"fc.bias"}  # some EAGLE heads have no bias: zeros
    if missing:
        raise ValueError(f"{folder}: not a draft head (missing {', '.join(sorted(missing)[:3])})")
    tensors = {name: tensors[name].to(dtype) for name in wanted if name in tensors}
    tensors.setdefault("fc.bias", torch.zeros(config.dim, dtype=dtype))
    head.load_state_dict({**tensors, "vocab": vocab}, strict=True, assign=True)
    return head.eval()


def shipped_head(target: str) -> Path | None:
    """The folder of a shipped head trained for the target with this fingerprint, if any."""
    for config in sorted(SHIPPED.glob(f"*/{CONFIG_NAME}")):
        settings = json.loads(config.read_text(encoding="utf-8")).get("draft_head", {})
        if settings.get("target") == target:
            return config.parent
    return None


def chain_mask(rows: int, depth: int) -> torch.Tensor:
    """The attention mask of ``depth`` chained passes over ``rows`` entries laid end to end
    (training-time test): pass d's entry j is the d-th draft of a chain whose last true entry is
    s = j - d + 1, so it sees pass 1's entries up to s and pass k's entry s + k - 1 for k in 2..d.
    (passes * rows, passes * rows) bool, True where a query row may look."""
    j = torch.arange(rows)
    mask = torch.zeros(depth, rows, depth, rows, dtype=torch.bool)
    for d in range(1, depth + 1):
        start = j - d + 1
        mask[d - 1, :, 0] = j[None, :] <= start[:, None]
        for k in range(2, d + 1):
            mask[d - 1, :, k - 1] = j[None, :] == (start + k - 1)[:, None]
    return mask.view(depth * rows, depth * rows)


def expected_tokens_per_pass(agreement: Sequence[float]) -> float:
    """1 + the expected accepted run of a draft whose d-th token agrees with conditional
    probability ``agreement[d-1]`` (given the ones before it agreed)."""
    total, run = 1.0, 1.0
    for rate in agreement:
        run *= rate
        total += run
    return total
