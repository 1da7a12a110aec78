"""Check functions for the exercise notebooks: the framework (:mod:`.core`) and one module
per notebook. Every exercise has one ``check_<exercise>(student_fn)``; see :mod:`.core`."""
from .core import EXERCISES, OUTCOMES, CheckFailed, fallback, summary
from .nb01_sequence_parallel import check_all_gather, check_reduce_scatter, check_sp_bytes, check_sp_forward
from .nb02_ring_attention import check_block_attention, check_merge, check_ring_attention
from .nb03_load_balance import check_causal_work, check_ring_time, check_zigzag_positions
from .nb04_ulysses import check_heads_to_seq, check_seq_to_heads, check_ulysses_attention, check_ulysses_bytes
from .nb05_moe_dispatch import check_aux_loss, check_capacity, check_moe_stats, check_route_topk

__all__ = ["CheckFailed", "EXERCISES", "OUTCOMES", "fallback", "summary",
           "check_reduce_scatter",
           "check_all_gather",
           "check_sp_forward",
           "check_sp_bytes",
           "check_block_attention",
           "check_merge",
           "check_ring_attention",
           "check_zigzag_positions",
           "check_causal_work",
           "check_ring_time",
           "check_seq_to_heads",
           "check_heads_to_seq",
           "check_ulysses_attention",
           "check_ulysses_bytes",
           "check_route_topk",
           "check_capacity",
           "check_moe_stats",
           "check_aux_loss",
]
