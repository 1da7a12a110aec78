"""The lesson's closed forms: memory, bytes on the wire, FLOPs and the times they imply.

Conventions (the lesson's):

* ``s`` tokens, micro-batch ``b``, hidden size ``h``, ``a`` attention heads;
* ``e`` bytes per element, default 2 (bf16);
* ``g = a / n_kv`` is the GQA group size (``g = 1``: multi-head attention);
* bytes are *sent per GPU per layer in the forward pass*, for ``b = 1``;
* ``F`` is FLOP/s and ``W`` is link bandwidth in bytes/s; see :data:`HARDWARE`.

Everything here is plain Python arithmetic on numbers; the functions accept floats
so that figures can sweep them, but reject values that have no meaning (zero
ranks, negative sizes, ...) with a ``ValueError``.
"""
from __future__ import annotations

from typing import Any

from .rules import MoEConfig, count, number

__all__ = [
    "HARDWARE",
    "peak_flops",
    "link_bandwidth",
    "activation_bytes",
    "all_reduce_bytes",
    "reduce_scatter_bytes",
    "all_gather_bytes",
    "comm_bytes",
    "COMM_METHODS",
    "usp_bytes",
    "ring_round_flops",
    "ring_round_bytes",
    "ring_round_times",
    "min_block_size",
    "moe_a2a_bytes",
    "moe_expert_flops",
    "moe_comm_ratio",
    "expert_capacity",
    "sp_block_activation_bytes",
    "link_split",
]

#: Hardware presets used in the lesson. GPUs carry ``flops`` (dense bf16 peak, FLOP/s)
#: and ``memory`` (HBM bytes); links carry ``bandwidth`` (bytes/s per GPU, one direction).
#: The H200 has the H100's compute and more (and faster) HBM.
HARDWARE: dict[str, dict[str, Any]] = {
    "H100": {"kind": "gpu", "flops": 989e12, "memory": 80e9},
    "H200": {"kind": "gpu", "flops": 989e12, "memory": 141e9},
    "NVLink": {"kind": "link", "bandwidth": 450e9},
    "InfiniBand": {"kind": "link", "bandwidth": 50e9},
}


def _preset(name, kind: str, field: str) -> float:
    valid = [k for k, v in HARDWARE.items() if v["kind"] == kind]
    if isinstance(name, str):
        for key in valid:
            if key.lower() == name.lower():
                return HARDWARE[key][field]
        raise ValueError(f"unknown {kind} {name!r}; use one of {valid} or a number in "
                         f"{'FLOP/s' if kind == 'gpu' else 'bytes/s'}")
    return number(f"{kind} {field}", name)


def peak_flops(gpu) -> float:
    """FLOP/s of a GPU preset name (``"H100"``, ``"H200"``) or a number passed through."""
    return _preset(gpu, "gpu", "flops")


def link_bandwidth(link) -> float:
    """Bytes/s of a link preset name (``"NVLink"``, ``"InfiniBand"``) or a number passed through."""
    return _preset(link, "link", "bandwidth")


def _tokens(s, n: int, what: str):
    """``s`` checked (a number > 0 that, given as an integer, ``n`` ranks split evenly)."""
    s = number("s", s)
    if isinstance(s, int) and s % n:
        raise ValueError(f"s = {s} tokens do not split evenly over {what} = {n}; "
                         f"use a multiple of {n} (pad the sequence)")
    return s


# --------------------------------------------------------------------------- memory
def activation_bytes(s, b, h, a, t: int = 1, sp: bool = False, flash: bool = True) -> float:
    """Activation bytes stored per layer per GPU (Korthikanti et al. 2022).

    * TP alone (Eq. 2): ``s b h (10 + 24/t + 5 a s / (h t))``; the ``10 sbh`` of the
      LayerNorm/dropout regions is replicated on every GPU of the TP group.
    * TP + SP (Eq. 4): ``s b h / t (34 + 5 a s / h)``: everything divided by ``t``.
    * ``flash=True`` (FlashAttention) does not store the score matrix: the
      ``5as/h`` term is dropped. ``t = 1`` gives ``34 sbh`` in both cases.
    """
    s, b, h, a = (number(nm, v) for nm, v in (("s", s), ("b", b), ("h", h), ("a (heads)", a)))
    t = count("t (TP degree)", t)
    sbh = s * b * h
    scores = 0.0 if flash else 5 * a * s / h
    if sp:
        return sbh / t * (34 + scores)
    return sbh * (10 + 24 / t + scores / t)


# --------------------------------------------------------------------------- collectives
def all_reduce_bytes(nbytes, n: int) -> float:
    """Bytes each of ``n`` GPUs sends in a ring all-reduce of ``nbytes``: ``2 (n-1)/n nbytes``."""
    n = count("n", n)
    return 2 * (n - 1) / n * number("nbytes", nbytes, strict=False)


def reduce_scatter_bytes(nbytes, n: int) -> float:
    """Bytes per GPU of a ring reduce-scatter of an ``nbytes`` tensor: ``(n-1)/n nbytes``."""
    n = count("n", n)
    return (n - 1) / n * number("nbytes", nbytes, strict=False)


def all_gather_bytes(nbytes, n: int) -> float:
    """Bytes per GPU of a ring all-gather producing ``nbytes`` on every GPU: ``(n-1)/n nbytes``."""
    n = count("n", n)
    return (n - 1) / n * number("nbytes", nbytes, strict=False)


COMM_METHODS = ("sp", "ring", "ulysses", "allgather")


def comm_bytes(method: str, s, h, n: int, g=1, e=2) -> float:
    """Bytes sent per GPU per layer, forward pass, ``b = 1``, for one of :data:`COMM_METHODS`.

    * ``"sp"`` (Megatron SP, TP degree ``n``): 2 reduce-scatters + 2 all-gathers of the
      ``s x h`` activation = the 2 all-reduces of plain TP: ``4 (n-1)/n s h e``.
      (GQA does not change these activations, so ``g`` has no effect.)
    * ``"ring"`` (ring attention, ``n = N_c`` ranks, ``c = s/N_c``): ``N_c - 1`` shifts of a
      K and a V block: ``(N_c - 1) * 2 c h e / g``.
    * ``"ulysses"``: four all-to-alls (Q, K, V, output), each sending ``(N_c-1)/N_c`` of a
      local ``s/N_c x h`` tensor; K and V have ``h/g`` columns:
      ``(N_c-1)/N_c * (2 + 2/g) * s h e / N_c``.
    * ``"allgather"`` (Llama 3's context parallelism): all-gather the whole K and V, each
      ``s x h/g``: ``(N_c-1)/N_c * 2 s h e / g``, the ring's bytes in one exposed step.
    """
    if not isinstance(method, str) or method.lower() not in COMM_METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(map(repr, COMM_METHODS))}")
    method = method.lower()
    h = number("h", h)
    g, e = number("g (GQA group size)", g), number("e (bytes per element)", e)
    n = count("n (number of GPUs)", n)
    s = _tokens(s, n, "n")
    if method == "sp":
        return 4 * (n - 1) / n * s * h * e
    if method == "ring":
        c = s / n
        return (n - 1) * 2 * c * h * e / g
    if method == "allgather":
        return (n - 1) / n * 2 * s * h * e / g
    return (n - 1) / n * (2 + 2 / g) * s * h * e / n


def usp_bytes(s, h, ulysses_size: int, ring_size: int, g=1, e=2) -> float:
    """Bytes per GPU per layer (forward, ``b = 1``) of USP: Ulysses over ``u = ulysses_size``
    ranks inside a node, ring attention over ``r = ring_size`` groups across nodes,
    ``N_c = u r`` and ``c = s / N_c``:

    ``(u-1)/u * (2 + 2/g) * c h e  +  (r-1) * 2 (s/r) h e / (g u)``

    The first term is Ulysses' four all-to-alls inside the group; the second is the ring on
    ``s/r`` tokens and ``h/u`` columns. ``u = N_c`` gives ``"ulysses"``, ``u = 1``
    gives ``"ring"``. Ulysses needs ``u`` to divide the number of K/V heads (not checked here).
    """
    h = number("h", h)
    g, e = number("g (GQA group size)", g), number("e (bytes per element)", e)
    u, r = count("ulysses_size", ulysses_size), count("ring_size", ring_size)
    s = _tokens(s, u * r, "ulysses_size * ring_size")
    c = s / (u * r)
    return (u - 1) / u * (2 + 2 / g) * c * h * e + (r - 1) * 2 * (s / r) * h * e / (g * u)


# --------------------------------------------------------------------------- ring attention
def ring_round_flops(c, h, causal: bool = False) -> float:
    """FLOPs of one ring round: ``Q K^T`` and ``P V`` for ``c`` queries and ``c`` keys over all
    heads, ``4 c^2 h``; half of that, ``2 c^2 h``, per round with a causal mask and a balanced
    (zig-zag) layout."""
    c, h = number("c (block size)", c), number("h", h)
    return (2 if causal else 4) * c * c * h


def ring_round_bytes(c, h, g=1, e=2) -> float:
    """Bytes one rank sends per ring round: a K and a V block, ``2 c (h/g) e`` (``4ch`` in bf16)."""
    c, h = number("c (block size)", c), number("h", h)
    g, e = number("g (GQA group size)", g), number("e (bytes per element)", e)
    return 2 * c * h * e / g


def ring_round_times(c, h, F, W, causal: bool = False, g=1, e=2) -> tuple[float, float]:
    """(compute seconds, transfer seconds) of one ring round.

    ``F`` and ``W`` may be preset names (``"H100"``, ``"InfiniBand"``) or numbers.
    The transfer is hidden when compute >= transfer, i.e. when ``c >= min_block_size``.
    """
    F, W = peak_flops(F), link_bandwidth(W)
    return ring_round_flops(c, h, causal) / F, ring_round_bytes(c, h, g, e) / W


def min_block_size(F, W, causal: bool = False, g=1, e=2) -> float:
    """Smallest block ``c`` (tokens per rank) for which ring attention hides its K/V transfer.

    ``4 c^2 h / F >= 4 c h / W`` gives ``c >= F / W`` (bf16, multi-head attention); a causal
    mask halves the work per round (x2), GQA divides the bytes by ``g``, other formats scale
    the bytes by ``e/2``: ``c* = F/W * (2 if causal) / g * e/2``. Independent of ``h`` and ``N_c``.
    """
    F, W = peak_flops(F), link_bandwidth(W)
    g, e = number("g (GQA group size)", g), number("e (bytes per element)", e)
    return F / W * (2 if causal else 1) / g * e / 2


def link_split(nbytes, pattern: str, rank: int, n: int, node_size: int) -> tuple[float, float]:
    """``(inside the node, across nodes)``: how rank ``rank``'s ``nbytes`` split over the
    links, ``n`` ranks in nodes of ``node_size`` (node ``i // node_size``).

    ``pattern``: ``"ring"``, every byte to the next rank ``r+1 mod n`` (ring steps and the
    ring collectives: all-gather, reduce-scatter, all-reduce), so only the last rank of a
    node sends across; ``"all_to_all"``, equal blocks to each of the ``n-1`` others, of
    which ``node_size - 1`` share the node. Two nodes of 4 and an all-to-all: 3/7 of the
    bytes stay inside, 4/7 cross.
    """
    n, node_size = count("n (ranks)", n), count("node_size", node_size)
    if n % node_size:
        raise ValueError(f"n = {n} ranks do not fill nodes of node_size = {node_size}; every "
                         f"node runs the same number of ranks")
    nbytes = number("nbytes", nbytes, strict=False)
    if pattern == "ring":
        across = n > node_size and (rank + 1) % n // node_size != rank // node_size
        return (0.0, nbytes) if across else (nbytes, 0.0)
    if pattern == "all_to_all":
        inside = nbytes * (node_size - 1) / (n - 1) if n > 1 else nbytes
        return inside, nbytes - inside
    raise ValueError(f"pattern must be 'ring' or 'all_to_all', got {pattern!r}")


# --------------------------------------------------------------------------- mixture of experts
def moe_a2a_bytes(k, T, h, Ne: int, e=2) -> float:
    """Bytes each GPU sends per MoE layer, forward, uniform routing: ``2 k T h e (Ne-1)/Ne``.

    ``k T`` (token, expert) copies, each ``h e`` bytes, leave the GPU with probability
    ``(Ne-1)/Ne`` in the dispatch, and come back the same way in the combine (factor 2).
    """
    k = count("k (experts per token)", k)
    T, h, e = number("T (tokens per GPU)", T), number("h", h), number("e (bytes per element)", e)
    Ne = count("Ne (expert-parallel GPUs)", Ne)
    return 2 * k * T * h * e * (Ne - 1) / Ne


def moe_expert_flops(k, T, h, d_ff, swiglu: bool = False) -> float:
    """Expert FLOPs per GPU for ``k T`` copies: ``2 * 2 h d_ff`` each for a two-matrix MLP,
    ``3 * 2 h d_ff`` with SwiGLU (three matrices)."""
    k = count("k (experts per token)", k)
    T, h, d_ff = number("T (tokens per GPU)", T), number("h", h), number("d_ff", d_ff)
    return k * T * (6 if swiglu else 4) * h * d_ff


def moe_comm_ratio(F, W, Ne: int, d_ff, swiglu: bool = False, e=2) -> float:
    """All-to-all time / expert time for one MoE layer, uniform routing:
    ``F/W * (Ne-1)/Ne / d_ff`` (bf16, two-matrix MLP); SwiGLU has 1.5x the FLOPs
    (ratio / 1.5); other formats scale the bytes by ``e/2``. Independent of ``k``, ``T``, ``h``."""
    F, W = peak_flops(F), link_bandwidth(W)
    Ne = count("Ne (expert-parallel GPUs)", Ne)
    d_ff, e = number("d_ff", d_ff), number("e (bytes per element)", e)
    return F / W * (Ne - 1) / Ne / d_ff / (1.5 if swiglu else 1.0) * e / 2


def expert_capacity(N: int, E: int, k: int, capacity_factor=None):
    """``C = ceil(CF * k * N / E)`` copies per expert, or ``None`` without a capacity factor.

    The factor is read as the decimal number it was written as (``1.1`` is 11/10), so
    that ``C`` is not off by one because of binary rounding.
    """
    return MoEConfig(E, k, capacity_factor).capacity(N)


def sp_block_activation_bytes(s, b, h, t: int = 1, sp: bool = False, e: float = 2,
                              mask_bytes: float = 1, ffn_mult: int = 4,
                              regather: bool = True, stats_bytes: float = 0) -> float:
    """Activation bytes one rank stores for the backward of LN -> MLP -> dropout (one block).

    Terms (Korthikanti et al. 2022, the MLP half of a layer plus one LayerNorm), with
    ``e`` bytes per activation and ``mask_bytes`` per dropout-mask element:

    ============================  ============  =====================
    stored tensor                 TP            TP + SP
    ============================  ============  =====================
    LayerNorm input               ``sbh e``     ``sbh e / t``
    fc1 input (= LN output)       ``sbh e``     ``sbh e / t`` (``sbh e`` if not ``regather``)
    GELU input, fc2 input         ``2 sb (4h/t) e`` both
    dropout mask                  ``sbh m``     ``sbh m / t``
    ============================  ============  =====================

    In general (``m = ffn_mult``): TP ``sbh (2e + mask + 2me/t)``, TP + SP
    ``sbh (2e + mask + 2me) / t``: SP divides every term by ``t``. With ``e=2,
    mask_bytes=1``: TP ``sbh (5 + 16/t)``, TP + SP ``21 sbh / t``; adding the attention
    half and the other LayerNorm (``sbh (5 + 8/t)`` resp. ``13 sbh / t``) gives
    :func:`lesson10.cost.activation_bytes` (``10 + 24/t``, ``34/t``). ``regather=False``:
    the all-gathered fc1 input is kept in full for the weight gradient (plain autograd
    around an all-gather) instead of re-gathered in the backward as Megatron and
    :class:`lesson10.spmd.sp.SequenceParallelBlock` do. ``stats_bytes``: bytes per token
    of the LayerNorm statistics (mean and 1/std, each one number per token: 8 in float32;
    the lesson ignores them, default 0), for ``s b`` tokens (TP) or ``s b / t`` (SP).
    With ``e`` the dtype's size, ``mask_bytes=1`` and ``stats_bytes`` = twice the size of
    the LayerNorm statistics' dtype, this is exactly what autograd keeps for the block.
    """
    sbh = s * b * h
    mlp = 2 * sbh * ffn_mult * e / t
    if sp:
        return (sbh * e / t + sbh * e / (t if regather else 1) + mlp + sbh * mask_bytes / t
                + s * b * stats_bytes / t)
    return 2 * sbh * e + mlp + sbh * mask_bytes + s * b * stats_bytes
