"""The attention mask a forward pass hands the model, prepared so that nothing in the forward reads a value back to
the host (:func:`prepared_mask`).

Given a 2D padding mask, transformers' mask preparation asks whether it has any padding (``padding_mask.all()`` in
``_ignore_causal_mask_sdpa``: a host round trip, a blocking copy on a GPU, and a data-dependent branch no CUDA graph
can hold). The engine knows the answer from the rows' lengths, on the host, before the pass: so it makes the same
decision itself and hands the model either nothing (no padding: transformers' own skip, SDPA's ``is_causal``) or
the 4D mask transformers would have built (its own mask function, called with the skip turned off). The model
returns a 4D mask as it is given; the tokens and logits are exactly those of transformers' own preparation.
"""

from __future__ import annotations

from typing import Any

PREPARED = ("sdpa", "eager")
"""Attention implementations whose 4D mask is prepared here (others get the 2D mask, prepared by transformers)."""


def prepared_mask(config: Any, mask: Any, q: int, padded: bool, dtype: Any) -> Any:
    """The mask to hand the model for a pass of ``q`` new tokens per row over ``mask`` (``[rows, cached + q]``, 1 on
    the columns a row attends to). ``padded``: whether any row has a 0 in ``mask`` (known from the rows' lengths; a
    captured step says True: it always carries its mask). ``dtype``: the model's (an eager mask's values)."""
    impl = getattr(config, "_attn_implementation", None)
    if impl not in PREPARED:
        return mask
    kv = int(mask.shape[1])
    if impl == "sdpa" and not padded and (q == 1 or q == kv):
        return None  # transformers' own skip (no padding: no mask, or SDPA's is_causal), decided on the host
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function

    return ALL_MASK_ATTENTION_FUNCTIONS[impl](
        batch_size=int(mask.shape[0]), q_length=q, kv_length=kv, q_offset=kv - q, kv_offset=0,
        mask_function=causal_mask_function, attention_mask=mask.bool(), allow_is_causal_skip=False, dtype=dtype,
        config=config, use_vmap=False, device=mask.device)
