"""Hypothesis strategies and settings shared by the property tests of the sim modules
(``test_sim_ring.py``, ``test_sim_ulysses.py``, ...): random ranks, lengths, heads, layouts."""
import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

FAST = settings(max_examples=50, deadline=None)
LAYOUTS = st.sampled_from(["contiguous", "zigzag", "striped"])


@st.composite
def attention_case(draw, need_kv_split=False):
    """``(n, layout, causal, q, k, v)``: one sequence for ``n`` ranks (``a_kv`` a multiple of
    ``n`` with ``need_kv_split``), GQA included."""
    n = draw(st.integers(1, 5))
    layout = draw(LAYOUTS)
    unit = 2 * n if layout == "zigzag" else n
    s = unit * draw(st.integers(1, 3))
    a_kv = draw(st.sampled_from([n, 2 * n]) if need_kv_split else st.integers(1, 3))
    g = draw(st.integers(1, 3))
    d = draw(st.integers(1, 4))
    causal = draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((s, a_kv * g, d))
    k = rng.standard_normal((s, a_kv, d))
    v = rng.standard_normal((s, a_kv, d))
    return n, layout, causal, q, k, v
