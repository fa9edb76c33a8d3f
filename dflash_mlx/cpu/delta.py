"""Qwen3.5/3.6 GatedDeltaNet mixers whose multi-token passes cost little on a CPU.

Off Metal, mlx-lm runs the gated delta rule one token at a time: a Python loop of
compiled steps, ~75 us a token per layer even for tiny heads. Verifying a block of 16
then costs a hybrid target's recurrent layers ~10x what one token does, and a prompt is
prefilled token by token. Over a chunk of tokens the recurrence has a closed form. With
γ_t = Π_{r<=t} g_r and u_t = β_t (v_t − g_t S_{t−1} k_t), the state is

    S_t = γ_t S_0 + Σ_{s<=t} (γ_t/γ_s) u_s k_sᵀ,

so the u_t solve one unit lower-triangular system of the chunk's size, and the outputs
and the final state are a few matmuls (the chunked "WY" form of the delta rule).
Everything is float32, as mlx-lm's recurrence; it agrees with mlx-lm's within ~1e-7
relative (tests/test_cpu_delta.py).

`forward` mirrors `GatedDeltaNet.__call__` of mlx-lm's qwen3_5 (projections, causal conv
with its cache, q/k normalisation, recurrence, gated norm, output projection, the
sharded all-sum) and calls the mixer's own submodules, so quantized and sharded layers
and the target's projection taps keep working. Single tokens, padding masks and batched
caches with per-row lengths go to mlx-lm's own code. Like cpu/blocks.py: CPU only.
"""

from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.gated_delta import normalize_qk
from mlx_lm.models.qwen3_5 import GatedDeltaNet

CHUNK = 64  # tokens per closed-form step: the triangular system and decay are CHUNK²


def forward_for(mixer):
    """What runs `mixer(inputs, mask, cache)`: `forward` for qwen3_5's mixer (and views
    of it), the mixer itself for any other kind."""
    return partial(forward, mixer) if isinstance(mixer, GatedDeltaNet) else mixer


def forward(mixer, inputs: mx.array, mask=None, cache=None) -> mx.array:
    """`mixer(inputs, mask, cache)` with the recurrence computed in chunks."""
    B, S, _ = inputs.shape
    lengths = getattr(cache, "lengths", None)
    if S == 1 or mask is not None or lengths is not None:
        return mixer(inputs, mask, cache)
    if mixer.sharding_group is not None:
        from mlx.nn.layers.distributed import sum_gradients

        inputs = sum_gradients(mixer.sharding_group)(inputs)
    qkv = mixer.in_proj_qkv(inputs)
    z = mixer.in_proj_z(inputs).reshape(B, S, mixer.num_v_heads, mixer.head_v_dim)
    b = mixer.in_proj_b(inputs)
    a = mixer.in_proj_a(inputs)

    n_keep = mixer.conv_kernel_size - 1
    conv_state = cache[0] if cache is not None else None
    if conv_state is None:
        conv_state = mx.zeros((B, n_keep, mixer.conv_dim), dtype=inputs.dtype)
    conv_input = mx.concatenate([conv_state, qkv], axis=1)
    if cache is not None:
        cache[0] = mx.contiguous(conv_input[:, -n_keep:, :])
    conv_out = nn.silu(mixer.conv1d(conv_input))
    q, k, v = [
        t.reshape(B, S, h, d)
        for t, h, d in zip(
            mx.split(conv_out, [mixer.key_dim, 2 * mixer.key_dim], -1),
            [mixer.num_k_heads, mixer.num_k_heads, mixer.num_v_heads],
            [mixer.head_k_dim, mixer.head_k_dim, mixer.head_v_dim],
            strict=True,
        )
    ]
    q, k = normalize_qk(q, k, inv_scale=mixer.head_k_dim**-0.5, eps=1e-6)
    state = cache[1] if cache is not None else None
    if state is None:
        shape = (B, mixer.num_v_heads, mixer.head_v_dim, mixer.head_k_dim)
        state = mx.zeros(shape, dtype=mx.float32)
    # log g directly (mlx-lm's g is exp of this): no log of an underflowed decay
    log_g = -mx.exp(mixer.A_log.astype(mx.float32)) * nn.softplus(a + mixer.dt_bias)
    out, state = gated_delta_chunked(q, k, v, log_g, mx.sigmoid(b), state)
    if cache is not None:
        cache[1] = state
        cache.advance(S)

    out = mixer.norm(out, z)
    out = mixer.out_proj(out.reshape(B, S, -1))
    if mixer.sharding_group is not None:
        out = mx.distributed.all_sum(out, group=mixer.sharding_group)
    return out


def gated_delta_chunked(q, k, v, log_g, beta, state):
    """The gated delta rule over T tokens, CHUNK at a time.

    q, k: [B, T, Hk, Dk] (normalised); v: [B, T, Hv, Dv]; log_g, beta: [B, T, Hv];
    state: [B, Hv, Dv, Dk]. Returns y [B, T, Hv, Dv] in q's dtype and the new state."""
    if (repeat := v.shape[2] // q.shape[2]) > 1:
        q, k = mx.repeat(q, repeat, -2), mx.repeat(k, repeat, -2)
    heads_first = [x.swapaxes(1, 2) for x in (q, k, v, log_g, beta)]
    ys = []
    for start in range(0, q.shape[1], CHUNK):
        chunk = [x[:, :, start : start + CHUNK] for x in heads_first]
        y, state = _chunk(*chunk, state)
        ys.append(y)
    y = ys[0] if len(ys) == 1 else mx.concatenate(ys, axis=2)
    return y.swapaxes(1, 2).astype(q.dtype), state


@mx.compile
def _chunk(q, k, v, log_g, beta, state):
    """One chunk, heads first: q, k [B, H, T, Dk], v [B, H, T, Dv], log_g, beta
    [B, H, T], state [B, H, Dv, Dk] -> (y [B, H, T, Dv] float32, state)."""
    T = q.shape[2]
    q, k, v, beta = (x.astype(mx.float32) for x in (q, k, v, beta))
    c = mx.cumsum(log_g.astype(mx.float32), axis=-1)  # log γ_t
    causal = mx.tril(mx.ones((T, T), dtype=mx.bool_))
    # decay[t, s] = γ_t / γ_s for s <= t, else 0 (never above 1: no overflow)
    decay = mx.exp(mx.where(causal, c[..., :, None] - c[..., None, :], -mx.inf))
    gamma = mx.exp(c)[..., None]
    s0 = state.swapaxes(-1, -2)  # [B, H, Dk, Dv]: x @ s0 is S_0 x per row
    kkt = k @ k.swapaxes(-1, -2)
    strict = mx.tril(mx.ones((T, T), dtype=mx.bool_), k=-1)
    # (I + A) u = β (v − γ S_0 k), A[t, s] = β_t (γ_t/γ_s) k_t·k_s for s < t
    lower = mx.where(strict, decay * kkt, 0.0) * beta[..., None] + mx.eye(T)
    rhs = beta[..., None] * (v - gamma * (k @ s0))
    u = mx.linalg.solve_triangular(lower, rhs, upper=False, stream=mx.cpu)
    # y_t = S_t q_t = γ_t S_0 q_t + Σ_{s<=t} (γ_t/γ_s) (k_s·q_t) u_s
    y = gamma * (q @ s0) + (decay * (q @ k.swapaxes(-1, -2))) @ u
    last = decay[..., -1, :, None]  # γ_T / γ_s
    state = gamma[..., -1:, :] * state + (u * last).swapaxes(-1, -2) @ k
    return y, state
