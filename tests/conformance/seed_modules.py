"""The seeds' PyTorch classes, the references both conformance suites test
attn against: shared/seeds/001 (sections 3.3-3.6), 000 (a MultiHeadAttention
whose mask is never applied) and 004 (GPT-2's fused attention).

They are the seeds' code, with two kinds of change, each marked:
  - "test:" a `scale` attribute for the CLI's --scale; left at None the
    arithmetic is the seed's own (divide by keys.shape[-1]**0.5);
  - MultiHeadAttention scales by its own keys' width (head_dim), where the
    seed's code uses the global `key` of section 3.4 (a seed error).
Subclasses add the variants attn offers: the renormalising mask, nanoGPT's
two dropouts for GPT-2, and a batch loop for the 2-D-only SelfAttention_v1/v2.
"""
import torch
import torch.nn as nn


def scaled(attn_scores, keys, scale):
    # seeds: attn_scores / keys.shape[-1]**0.5; test: --scale S multiplies
    if scale is None:
        return attn_scores / keys.shape[-1] ** 0.5
    return attn_scores * scale


class SimplifiedSelfAttention(nn.Module):
    """Section 3.3: attn_scores = inputs @ inputs.T; softmax; @ inputs."""

    def forward(self, inputs):
        attn_scores = inputs @ inputs.T
        attn_weights = torch.softmax(attn_scores, dim=-1)
        return attn_weights @ inputs


class SelfAttention_v1(nn.Module):

    def __init__(self, d_in, d_out):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))
        self.scale = None  # test:

    def forward(self, x):
        keys = x @ self.W_key
        queries = x @ self.W_query
        values = x @ self.W_value

        attn_scores = queries @ keys.T  # omega
        attn_weights = torch.softmax(scaled(attn_scores, keys, self.scale), dim=-1)

        context_vec = attn_weights @ values
        return context_vec


class SelfAttention_v2(nn.Module):

    def __init__(self, d_in, d_out, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.scale = None  # test:

    def forward(self, x):
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(scaled(attn_scores, keys, self.scale), dim=-1)

        context_vec = attn_weights @ values
        return context_vec


class CausalAttention(nn.Module):

    def __init__(self, d_in, d_out, context_length,
                 dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)  # New
        self.register_buffer('mask', torch.triu(torch.ones(context_length, context_length), diagonal=1))  # New
        self.scale = None  # test:

    def forward(self, x):
        b, num_tokens, d_in = x.shape  # New batch dimension b
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)  # Changed transpose
        attn_scores.masked_fill_(  # New, _ ops are in-place
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(scaled(attn_scores, keys, self.scale), dim=-1)
        attn_weights = self.dropout(attn_weights)  # New

        context_vec = attn_weights @ values
        return context_vec


class CausalAttentionRenorm(CausalAttention):
    """CausalAttention with the seed's first masking method (section 3.5):
    softmax, multiply by tril(ones), divide by the row sums, then dropout.
    Same constructor, so the same draws."""

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        mask_simple = torch.tril(torch.ones(num_tokens, num_tokens, dtype=x.dtype))
        masked_simple = attn_weights*mask_simple
        row_sums = masked_simple.sum(dim=-1, keepdim=True)
        attn_weights = masked_simple / row_sums
        attn_weights = self.dropout(attn_weights)

        context_vec = attn_weights @ values
        return context_vec


class MultiHeadAttentionWrapper(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList([
            CausalAttention(d_in, d_out, context_length, dropout, qkv_bias)
            for _ in range(num_heads)
        ])

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=-1)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert (d_out % num_heads == 0), \
            "d_out must be divisible by num_heads"

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads

        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # Linear layer to combine head outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.scale = None  # test:

    def forward(self, x):
        b, num_tokens, d_in = x.shape

        keys = self.W_key(x)  # Shape: (b, num_tokens, d_out)
        queries = self.W_query(x)
        values = self.W_value(x)

        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)

        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)

        attn_scores = queries @ keys.transpose(2, 3)

        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]

        attn_scores.masked_fill_(mask_bool, -torch.inf)

        # The seed divides by the global `key`'s width (2 in its example);
        # the scale meant, and the CLI's, is the head_dim: keys.shape[-1].
        attn_weights = torch.softmax(scaled(attn_scores, keys, self.scale), dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = (attn_weights @ values).transpose(1, 2)

        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        context_vec = self.out_proj(context_vec)

        return context_vec


class MultiHeadAttentionRenorm(MultiHeadAttention):
    """MultiHeadAttention with the renormalising mask (ATTN_MASK_RENORMALIZE)."""

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        values = self.W_value(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        queries = self.W_query(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        masked = attn_weights * torch.tril(torch.ones(num_tokens, num_tokens, dtype=x.dtype))
        attn_weights = masked / masked.sum(dim=-1, keepdim=True)
        attn_weights = self.dropout(attn_weights)
        context_vec = (attn_weights @ values).transpose(1, 2)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)


class MultiHeadAttention000(nn.Module):
    """Seed 000's class: its masked_fill result is discarded, so no mask."""

    def __init__(self, d_in, d_out, context_length, num_heads, qkv_bias=False):
        super().__init__()
        assert(d_out % num_heads == 0)
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = self.d_out // self.num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.register_buffer('mask',
        torch.triu(torch.ones(context_length, context_length), diagonal=1))
        self.out_proj = nn.Linear(d_out, d_out) # another option projection layer

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        queries = self.W_query(x) # b, num_tokens, d_out
        keys = self.W_key(x) # b, num_tokens, d_out
        values = self.W_value(x) # b, num_tokens, d_out

        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim) # b, num_tokens, n_head, head_dim
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)

        queries = queries.transpose(1,2) # b, n_head, num_tokens, head_dim
        keys = keys.transpose(1,2)
        values = values.transpose(1,2)
        attn_scores = queries @ keys.transpose(2,3) # b, n_head, num_tokens, num_tokens
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill(mask_bool, -torch.inf)

        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1) # b, n_head, num_tokens, num_tokens
        context_vec = attn_weights @ values # b, n_head, num_tokens, head_dim

        context_vec = context_vec.transpose(1,2) # b, num_tokens, n_head, head_dim

        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)

        return self.out_proj(context_vec)


class GPTConfig:
    def __init__(self, n_embd, n_head, block_size, dropout=0.0):
        self.n_embd = n_embd
        self.n_head = n_head
        self.block_size = block_size
        self.dropout = dropout


class CausalSelfAttention(nn.Module):
    """Seed 004 (GPT-2)."""

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, config.n_embd * 3)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.register_buffer('bias',
                             torch.tril(torch.ones(config.block_size, config.block_size)).view(
                                 1, 1,
                                 config.block_size,
                                 config.block_size))
        self.scale = None  # test:

    def forward(self, x):
        B, T, C = x.size()
        qkv = self.c_attn(x)
        q, k, v = qkv.split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        factor = (k.size(-1) ** -0.5) if self.scale is None else self.scale  # test: --scale
        att = (q @ k.transpose(-2, -1)) * factor
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = nn.functional.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        y = self.c_proj(y)
        return y


class CausalSelfAttentionDropout(CausalSelfAttention):
    """Seed 004 plus nanoGPT's attn_dropout (on att) and resid_dropout (on
    c_proj's output). nn.Dropout draws nothing at construction."""

    def __init__(self, config: GPTConfig):
        super().__init__(config)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (k.size(-1) ** -0.5)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float('-inf'))
        att = nn.functional.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Batched2D(nn.Module):
    """SelfAttention_v1/v2 use keys.T, i.e. 2-D inputs (T, d_in): apply the
    module to each batch element and stack."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return torch.stack([self.inner(x[b]) for b in range(x.shape[0])])
