"""One greedy decoding engine for base and adapter views: plain decoding, and verification of a draft.

A view hands :class:`GreedyEngine` its rows (prompt token ids, stop rules, optionally a *draft*: the
tokens the base generated for the same prompt). Every token the engine emits is the model's own
argmax; a draft only decides how many of them are computed in one parallel forward pass:

- **plain** (no draft): the prompt is processed in one forward pass, then one token per decode step;
- **verified** (a draft): the prompt pass is the same (so the first token is always plain decoding's:
  an adapter that departs from the base at once costs nothing extra); if the first token equals the
  draft's, the draft goes through the model in chunks (``first_chunk`` tokens, then the rest, a pass
  each), appended to the prompt's cache; draft token *j* is accepted while the model's argmax before
  it equals it and the row's stop rules have not ended it; at the first difference the argmax is the
  row's next token and the row continues by decode steps from the cache of the accepted prefix. A
  row whose whole answer is accepted up to its stop never decodes.

Scheduling (what "batched" means here): prompts that rows share are computed once per view
(:mod:`lm_eval_toolfid.engine.prefix_cache`: the branch points of the prompts' token trie, each computed on
top of its nearest shared ancestor; ``share_prefixes``), and each row's prompt pass computes only the rest of
its prompt on its shared prefix's KV; rows are then admitted sorted by prompt, so the rows of a prefix come
together and its KV is dropped once they have all had their pass (without shared prefixes: longest first).
Prompts (and drafts) are processed in forward passes of at most ``prefill_tokens`` padded tokens, rows of
similar length together; rows still generating join one decode batch of at most ``max_batch`` rows (left
padding, explicit attention mask and position ids); a row that stops leaves the batch at once and waiting
rows are admitted in its place (continuous batching). The lm_head runs only where a next token is read
(``logits_to_keep``). The decode batch's KV cache lives in preallocated per-layer buffers of fixed capacity
(slots × heads × columns × dim, :class:`SlotCache`): a decode step appends in place and runs on a view of
the live slots; a finished row's slot is taken by the last live row (one row copied, not the batch), and
columns no live row uses are dropped only once they are a quarter of the buffer.

Numerics: a verified token is read from a parallel pass over the draft, a decoded one from a
single-token step; the two differ by floating-point rounding, which can flip an argmax only where
the top two logits nearly tie. Every verified token records its top-two gap; gaps below
``near_tie`` (by the logits' dtype: 0.001 in float32, 0.25 in bfloat16) are counted per row
(:attr:`RowResult.near_ties`) and reported, never hidden. (A model
whose weights amplify rounding — e.g. a LoRA of large random weights — has no reproducible greedy
output at all: ``generate`` itself changes its answer with the batch's shape. Its first token is
still the plain path's; see docs/performance.md.) Tests compare verified against plain decoding,
and plain decoding against ``generate``, token for token.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence

log = logging.getLogger("lm_eval.toolfid")

NEAR_TIE = 1e-3
"""Top-two logit gap below which a verified token counts as a near tie, float32 logits (docs/performance.md)."""
NEAR_TIE_BY_DTYPE = {"bfloat16": 0.25, "float16": 0.03}
"""The same bound for half-precision models: their logits carry 8 (bfloat16) or 11 (float16) significant bits,
so at a top logit of 16-32 one unit in the last place is 0.125 (0.0156), and two schedules of one forward pass
(another batch, a shared prefix, a draft pass) differ by such units. Measured on the fixture model in
bfloat16 (CPU: <= 0.0625; an H200: <= 0.125): every token that differed between schedules did so at such a gap."""


def near_tie_for(dtype: Any) -> float:
    """The near-tie bound for a model whose logits come in ``dtype`` (a torch dtype or its name)."""
    return NEAR_TIE_BY_DTYPE.get(str(dtype).removeprefix("torch."), NEAR_TIE)


class Stopper(Protocol):
    def push(self, token: int) -> str | None: ...


@dataclass
class Row:
    """One sequence to generate: its prompt, its stop rules and (to verify) the base's tokens."""

    prompt: Sequence[int]
    stopper: Stopper
    max_new: int
    draft: Sequence[int] = ()
    run_on: Stopper | None = None
    """Keep generating after ``stopper`` ends the row, until this one does (EOS, ``until``, the budget): the
    row's answer is ``tokens[:stopped_at]``, the rest shows what generation without the early stop writes
    (``check_stops``). Costs decode steps only: no second prompt pass."""


@dataclass
class RowResult:
    """What one row generated, and how each token was obtained."""

    tokens: list[int] = field(default_factory=list)
    finish: str = ""
    """``eos``, ``stop`` (stop string or end of call), ``length``."""
    stopped_at: int | None = None
    """Where the row's stopper ended it; with :attr:`Row.run_on` the tokens after it are the run-on."""
    run_on_finish: str = ""
    """With :attr:`Row.run_on`: why the run-on ended."""
    draft_len: int = 0
    accepted: int = 0
    """Draft tokens accepted by verification (a prefix of the draft)."""
    verified: int = 0
    """Tokens read from a draft pass: the accepted ones after the first, and the token after them (the
    first token always comes from the prompt pass, as in plain decoding)."""
    near_ties: int = 0
    """Verified tokens whose top-two logit gap was below the engine's ``near_tie``."""
    shared: int = 0
    """Prompt tokens this row did not compute: its prompt started from a shared prefix's KV."""
    shared_near_ties: int = 0
    """Tokens of a row on a shared prefix (not verified ones) whose top-two gap was below ``near_tie``: the
    prefix's KV came from another pass than plain decoding's, so such a token could be picked otherwise."""
    gaps: list[float] = field(default_factory=list)
    """Top-two logit gap of every emitted token (only with ``record_gaps``)."""

    @property
    def answer(self) -> list[int]:
        """The row's tokens up to where its stopper ended it (all of them without a run-on)."""
        return self.tokens if self.stopped_at is None else self.tokens[:self.stopped_at]

    @property
    def decoded(self) -> int:
        """Tokens computed by decode steps (the first token comes from the prompt pass; verified ones
        from draft passes)."""
        return max(0, len(self.tokens) - 1 - self.verified)


@dataclass
class EngineStats:
    """What one engine run computed (benchmarks compare it with the hardware's limits)."""

    forward_passes: int = 0
    prompt_tokens: int = 0
    """Tokens of prompt (+ draft) passes, padding excluded."""
    padded_tokens: int = 0
    """Tokens of prompt (+ draft) passes, padding included."""
    logit_rows: int = 0
    """Positions the lm_head ran on."""
    step_rows: list[int] = field(default_factory=list)
    """Rows in each decode step."""
    prompt_tokens_total: int = 0
    """Prompt tokens of every row (what the prompt passes compute without shared prefixes)."""
    shared_tokens: int = 0
    """Prompt tokens not computed: rows started from a shared prefix computed once."""
    prefix_nodes: int = 0
    prefix_peak_tokens: int = 0
    """Most shared-prefix tokens whose KV was held at once."""


@dataclass(frozen=True)
class EngineConfig:
    max_batch: int = 16
    """Rows decoding at once."""
    prefill_tokens: int = 4096
    """Padded tokens per prompt/verification forward pass (a row longer than this goes alone)."""
    max_padding: float = 0.1
    """Share of a prompt pass's tokens that may be padding (rows of unlike length go to other passes)."""
    first_chunk: int = 16
    """Draft tokens verified in the first pass; the rest follow only if all of those are accepted."""
    near_tie: float | None = None
    """Top-two logit gap below which a token read from another schedule counts as a near tie (None: by the
    model's dtype, :func:`near_tie_for`)."""
    verify_logits: int = 64 * 1024 * 1024
    """Logit floats per verification pass after the first (bounds its memory: rows x chunk x vocab)."""
    record_gaps: bool = False
    refill: int = 0
    """Admit waiting rows once this many decode slots are free (0: max_batch // 8, at least 1)."""
    share_prefixes: bool = True
    """Compute prompt prefixes that rows share once per view (:mod:`lm_eval_toolfid.engine.prefix_cache`)."""
    min_shared: int = 16
    """Shortest shared prefix worth a pass of its own."""
    fold_gqa: bool = True
    """CPU: grouped-query attention over the unexpanded KV cache (:mod:`lm_eval_toolfid.engine.attention`)."""


class EngineUnsupported(Exception):
    """The model's cache or forward does not fit this engine (callers fall back to ``generate``)."""


# --- the KV cache: preallocated per-layer buffers, appended in place -----------------------------

def _cache_classes() -> tuple[type, type]:
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    class SlotLayer(DynamicLayer):
        """A layer's keys/values in a ``[batch, heads, capacity, dim]`` buffer; ``length`` columns used."""

        def __init__(self, capacity: int, keys: Any = None, values: Any = None, length: int = 0) -> None:
            super().__init__()
            self.capacity = capacity
            self.length = length
            self.kbuf, self.vbuf = keys, values
            if keys is not None:
                self.dtype, self.device = keys.dtype, keys.device
                self.is_initialized = True
                self.keys, self.values = keys[:, :, :length], values[:, :, :length]

        def lazy_initialization(self, key_states: Any, value_states: Any) -> None:
            b, h, _, d = key_states.shape
            self.dtype, self.device = key_states.dtype, key_states.device
            self.kbuf = key_states.new_zeros(b, h, self.capacity, d)
            self.vbuf = value_states.new_zeros(b, value_states.shape[1], self.capacity, value_states.shape[3])
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:  # only if a caller under-sized it
                self.reserve(max(end, 2 * self.capacity))
            self.kbuf[:, :, self.length:end] = key_states
            self.vbuf[:, :, self.length:end] = value_states
            self.length = end
            self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
            return self.keys, self.values

        def reserve(self, capacity: int) -> None:
            """Make room for ``capacity`` columns (copies only when the buffer is smaller)."""
            if capacity > self.capacity:
                import torch

                grow = capacity - self.capacity
                pad = lambda t: torch.cat([t, t.new_zeros(*t.shape[:2], grow, t.shape[3])], dim=2)  # noqa: E731
                self.kbuf, self.vbuf = pad(self.kbuf), pad(self.vbuf)
                self.capacity = capacity
                self.keys, self.values = self.kbuf[:, :, :self.length], self.vbuf[:, :, :self.length]

        def get_seq_length(self) -> int:
            return self.length

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.length + query_length, 0

        def crop(self, tokens_to_remove: int) -> None:  # pragma: no cover - not used by the engine
            raise NotImplementedError

    class SlotCache(DynamicCache):
        def __init__(self, layers: list[Any]) -> None:
            Cache.__init__(self, layers=layers)

    return SlotLayer, SlotCache


# --- the engine ----------------------------------------------------------------------------------

@dataclass
class _Live:
    """A row being generated: its result so far and where its cache is."""

    index: int
    result: RowResult
    max_new: int
    length: int = 0  # valid cache columns (prompt + tokens already fed)
    pending: int = -1  # the token to feed next (already emitted)


class GreedyEngine:
    """Batched greedy decoding of :class:`Row` s on one Hugging Face causal LM (plain or verified)."""

    def __init__(self, model: Any, pad_id: int | None, config: EngineConfig = EngineConfig(),
                 autocast: Callable[[], Any] | None = None) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.pad_id = int(pad_id) if pad_id is not None else 0
        self.config = config
        self.autocast = autocast or contextlib.nullcontext
        first = next(model.parameters())
        self.device = first.device
        self.near_tie = config.near_tie if config.near_tie is not None else near_tie_for(first.dtype)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        params = inspect.signature(base.forward).parameters
        # transformers 5.24 renamed forward's past_key_values to cache (the old name deprecated until 5.40)
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        if "position_ids" not in params or self.cache_arg not in params:
            raise EngineUnsupported(f"{type(base).__name__}.forward takes no position_ids/past_key_values")
        self.keep_logits = "logits_to_keep" in params
        text_config = base.config.get_text_config(decoder=True) if hasattr(base.config, "get_text_config") else base.config
        layer_types = getattr(text_config, "layer_types", None)
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise EngineUnsupported(f"{type(base).__name__} has {sorted(set(layer_types) - {'full_attention'})} layers")
        if getattr(text_config, "sliding_window", None) and getattr(text_config, "use_sliding_window", True):
            raise EngineUnsupported(f"{type(base).__name__} uses a sliding window")
        self.n_layers = int(getattr(text_config, "num_hidden_layers"))
        self.vocab = int(getattr(text_config, "vocab_size", 0) or 0) or 32000
        self.SlotLayer, self.SlotCache = _cache_classes()
        self.stats = EngineStats()
        if self.device.type == "cpu" and config.fold_gqa:
            from lm_eval_toolfid.engine.attention import folded_gqa_attention

            self.attention: Callable[[], Any] = folded_gqa_attention
        else:
            self.attention = contextlib.nullcontext

    # -- public ------------------------------------------------------------------------------

    def run(self, rows: Sequence[Row], on_done: Callable[[int, RowResult], None] | None = None) -> list[RowResult]:
        """Generate every row; results in the order of ``rows``. ``on_done(index, result)`` is called as
        each row finishes (for progress displays)."""
        results: list[RowResult | None] = [None] * len(rows)
        for i, row in enumerate(rows):
            if row.max_new <= 0 or not row.prompt:
                results[i] = RowResult(draft_len=len(row.draft), finish="length")
        todo = [i for i in range(len(rows)) if results[i] is None]
        self.stats.prompt_tokens_total += sum(len(rows[i].prompt) for i in todo)
        plan = None
        if self.config.share_prefixes and len(todo) > 1:
            from lm_eval_toolfid.engine.prefix_cache import PrefixPlan

            plan = PrefixPlan.build([r.prompt for r in rows], todo, self.config.min_shared)
            if not plan.nodes:
                plan = None
        if plan is not None:  # sorted by prompt: the rows of a shared prefix are admitted together
            order = plan.order
            self.stats.prefix_nodes += len(plan.nodes)
        else:
            order = sorted(todo, key=lambda i: -(len(rows[i].prompt) + len(rows[i].draft)))
        waiting = deque(order)
        batch = _Batch(self, plan)
        refill = self.config.refill or max(1, self.config.max_batch // 8)
        with self.torch.inference_mode(), self.autocast():
            while waiting or batch.rows:
                free = self.config.max_batch - len(batch.rows)
                if waiting and (not batch.rows or free >= min(refill, len(waiting))):
                    take = [waiting.popleft() for _ in range(min(free, len(waiting)))]
                    batch.waiting = len(waiting)
                    finished = batch.admit([(i, rows[i]) for i in take])
                else:
                    finished = batch.step(rows)
                for done in finished:
                    results[done.index] = done.result
                    if on_done is not None:
                        on_done(done.index, done.result)
        if batch.prefixes is not None:
            self.stats.prefix_peak_tokens = max(self.stats.prefix_peak_tokens, batch.prefixes.peak_tokens)
        return [r if r is not None else RowResult() for r in results]

    # -- helpers used by _Batch ----------------------------------------------------------------

    def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, cache: Any, keep: int,
                step: bool = False) -> Any:
        """Logits of the last ``keep`` positions, [batch, keep, vocab] (float32)."""
        stats = self.stats
        stats.forward_passes += 1
        if step:
            stats.step_rows.append(int(input_ids.shape[0]))
        else:
            stats.prompt_tokens += int(attention_mask[:, -input_ids.shape[1]:].sum())
            stats.padded_tokens += int(input_ids.numel())
        stats.logit_rows += int(input_ids.shape[0]) * keep
        kwargs: dict[str, Any] = {"logits_to_keep": keep} if self.keep_logits else {}
        kwargs[self.cache_arg] = cache
        with self.attention():
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=True, **kwargs)
        logits = out.logits
        if logits.shape[1] > keep:
            logits = logits[:, -keep:]
        return logits.float()

    def pick(self, logits: Any, with_gaps: bool = True) -> tuple[list[list[int]], list[list[float]]]:
        """Argmax and (``with_gaps``) top-two gap of every position: ([rows][positions], same)."""
        best = logits.argmax(dim=-1)  # the same tie-breaking as generate's greedy argmax
        if not with_gaps:
            return best.tolist(), []
        top = self.torch.topk(logits, 2, dim=-1)
        return best.tolist(), (top.values[..., 0] - top.values[..., 1]).tolist()


def _emit(res: RowResult, row: Row, token: int, gap: float, record: bool) -> bool:
    """Append one token to a row's result (and its top-two gap when recorded); True when the row stops
    there: its stopper says so (EOS, ``until``, the end of the call) or its budget is spent — or, for a row
    that runs on, when its run-on stopper says so."""
    res.tokens.append(token)
    if record:
        res.gaps.append(gap)
    n = len(res.tokens)
    if res.stopped_at is None:
        reason = row.stopper.push(token)
        if reason is None and n >= row.max_new:
            reason = "length"
        if reason is not None:
            res.finish, res.stopped_at = reason, n
    if row.run_on is None:
        return res.stopped_at is not None
    over = row.run_on.push(token) or ("length" if n >= row.max_new else None)
    if over is not None:
        res.run_on_finish = over
    return over is not None


def _copy_spans(k: Any, v: Any, j: int, first: int, layer: Any, r: int, spans: list[tuple[int, int]]) -> None:
    """Row ``r``'s KV pieces (``spans`` of ``layer``'s buffers, in order) into row ``j`` of ``k``/``v``, one
    after another from column ``first``."""
    col = first
    for a, n in spans:
        k[j, :, col:col + n] = layer.kbuf[r, :, a:a + n]
        v[j, :, col:col + n] = layer.vbuf[r, :, a:a + n]
        col += n


class _Batch:
    """The decode batch: live rows and their KV cache, right-aligned at column ``T`` (left padding)."""

    def __init__(self, engine: GreedyEngine, plan: Any = None) -> None:
        self.e = engine
        self.torch = engine.torch
        self.rows: list[_Live] = []
        """Live rows; row b's cache is slot b of the buffers."""
        self.T = 0
        self.mask: Any = None  # [slots, capacity] long
        self.kv: list[tuple[Any, Any]] = []
        """Per layer: keys and values, ``[slots, heads, capacity, dim]``, every live row ending at column ``T``."""
        self.cap = 0
        self.waiting = 0
        """Rows not yet admitted (set by the engine: how many slots a new buffer should have)."""
        self.plan = plan
        self.prefixes: Any = None
        if plan is not None:
            from lm_eval_toolfid.engine.prefix_cache import PrefixStore

            self.prefixes = PrefixStore(plan)

    # -- admission: prompt (+ draft) forward passes --------------------------------------------

    def admit(self, rows: list[tuple[int, Row]]) -> list[_Live]:
        """Prompt passes for ``rows`` (groups of like length; a row whose prompt starts with a shared prefix
        computes only the rest, on the prefix's KV), then draft passes for every row whose first token
        matched its draft (all of them together), then the survivors join the decode batch."""
        finished: list[_Live] = []
        joining: list[tuple[_Live, Any, int, list[tuple[int, int]]]] = []  # live row, layers, row in them, spans
        drafting: list[tuple[_Live, Row, Any, int, list[tuple[int, int]]]] = []
        items = [(i, row, self.plan.row_node[i] if self.plan is not None else None) for i, row in rows]
        if self.plan is not None:
            self._compute_nodes({node for _, _, node in items if node is not None})
            # longest suffix first (the order without shared prefixes is longest prompt first already)
            items.sort(key=lambda it: -(len(it[1].prompt) - self.plan.depth(it[2])))
        for group in self._groups(items, lambda it: len(it[1].prompt) - self._depth(it[2])):
            self._prompt_pass(group, finished, joining, drafting)
        # drafts in passes of rows of like prompt length, within the padded-token budget: a verification pass
        # reads every row's KV up to its longest prompt (under grouped-query attention, expanded per query head),
        # so one pass for all rows admitted together — sorted by prompt, not by length, when prefixes are
        # shared — made each draft chunk cost the longest row's columns for every row
        drafting.sort(key=lambda d: -len(d[1].prompt))
        for group in self._groups(drafting, lambda d: len(d[1].prompt)):
            self._draft_passes(group, finished, joining)
        if joining:
            self._merge(joining)
        return finished

    def _depth(self, node: int | None) -> int:
        return self.plan.depth(node) if self.plan is not None else 0

    def _groups(self, items: list[Any], length: Callable[[Any], int]) -> Iterator[list[Any]]:
        """Consecutive items (longest first) per pass: at most ``prefill_tokens`` padded tokens, and at most
        ``max_padding`` of them padding."""
        budget, share = self.e.config.prefill_tokens, self.e.config.max_padding
        group: list[Any] = []
        longest = real = 0
        for item in items:  # already longest first
            n = length(item)
            top = max(longest, n)
            padded = top * (len(group) + 1)
            if group and (padded > budget or padded - real - n > share * padded):
                yield group
                group, longest, real, top = [], 0, 0, n
            group.append(item)
            longest, real = top, real + n
        if group:
            yield group

    def _pass(self, entries: list[tuple[Any, int, Sequence[int]]], keep: int = 1) -> tuple[Any, Any, list[Any]]:
        """One forward pass of ``entries`` — (prefix KV per layer or None, its length, the tokens to compute
        after it) — in one batch: each prefix right-aligned at column P (left padding), the tokens after it
        left-padded to width S, explicit mask and positions. Without prefixes this is exactly the plain
        prompt pass. Returns (logits of the last ``keep`` columns, the cache layers, each entry's spans:
        ``(first column, length)`` pieces of its KV in order)."""
        torch, e = self.torch, self.e
        P = max(p for _, p, _ in entries)
        S = max(len(t) for *_, t in entries)
        B = len(entries)
        ids = torch.full((B, S), e.pad_id, dtype=torch.long)
        mask = torch.zeros((B, P + S), dtype=torch.long)
        positions = torch.zeros((B, S), dtype=torch.long)
        spans: list[list[tuple[int, int]]] = []
        for r, (_, p, tokens) in enumerate(entries):
            n = len(tokens)
            ids[r, S - n:] = torch.tensor(list(tokens), dtype=torch.long)
            mask[r, P - p:P] = 1
            mask[r, P + S - n:] = 1
            positions[r, S - n:] = torch.arange(p, p + n)
            spans.append(([(P - p, p)] if p else []) + [(P + S - n, n)])
        if P == 0:
            cache = e.SlotCache([e.SlotLayer(S) for _ in range(e.n_layers)])
        else:
            ref = next(kv for kv, p, _ in entries if p)
            layers = []
            for li in range(e.n_layers):
                k0, v0 = ref[li]
                k = k0.new_zeros(B, k0.shape[1], P + S, k0.shape[3])
                v = v0.new_zeros(B, v0.shape[1], P + S, v0.shape[3])
                for r, (kv, p, _) in enumerate(entries):
                    if p:
                        k[r, :, P - p:P] = kv[li][0][0]
                        v[r, :, P - p:P] = kv[li][1][0]
                layers.append(e.SlotLayer(P + S, k, v, length=P))
            cache = e.SlotCache(layers)
        logits = e.forward(ids.to(e.device), mask.to(e.device), positions.to(e.device), cache, keep)
        return logits, cache.layers, spans

    def _compute_nodes(self, needed: set[int]) -> None:
        """The shared prefixes these rows start from (and their ancestors), each computed once, on top of its
        nearest computed ancestor: nodes whose parent is ready go together, in length-matched passes."""
        plan, store = self.plan, self.prefixes
        todo: list[int] = []
        for node in sorted(needed):  # the node and its ancestors up to the first one already computed
            chain: list[int] = []
            while node is not None and node not in store:
                chain.append(node)
                node = plan.nodes[node].parent
            todo += chain[::-1]
        todo = list(dict.fromkeys(todo))
        while todo:
            ready = [n for n in todo if plan.nodes[n].parent is None or plan.nodes[n].parent in store]
            ready.sort(key=lambda n: -(plan.nodes[n].depth - plan.depth(plan.nodes[n].parent)))
            for group in self._groups(ready, lambda n: plan.nodes[n].depth - plan.depth(plan.nodes[n].parent)):
                entries = []
                for n in group:
                    node = plan.nodes[n]
                    parent = node.parent
                    prompt = self._prompt_of(node.row)
                    p = plan.depth(parent)
                    entries.append((store.get(parent) if parent is not None else None, p, prompt[p:node.depth]))
                _, layers, spans = self._pass(entries)
                for r, n in enumerate(group):
                    store.put(n, [(self._gather(layer.kbuf, r, spans[r]), self._gather(layer.vbuf, r, spans[r]))
                                  for layer in layers])
            todo = [n for n in todo if n not in store]

    def _prompt_of(self, index: int) -> Sequence[int]:
        return self.plan.prompts[index]

    def _gather(self, buf: Any, r: int, spans: list[tuple[int, int]]) -> Any:
        parts = [buf[r:r + 1, :, a:a + n] for a, n in spans]
        return parts[0].clone() if len(parts) == 1 else self.torch.cat(parts, dim=2)

    def _prompt_pass(self, group: list[tuple[int, Row, int | None]], finished: list[_Live],
                     joining: list[tuple[_Live, Any, int, list[tuple[int, int]]]],
                     drafting: list[tuple[_Live, Row, Any, int, list[tuple[int, int]]]]) -> None:
        """The group's prompts in one pass — exactly the plain path's prompt pass, so every row's first
        token is plain decoding's (a row on a shared prefix computes only the rest of its prompt, on the
        prefix's KV). Rows go to ``finished``, ``joining`` (decode from here) or ``drafting`` (the first
        token matched the draft: check the rest), with where their cache is."""
        e, store = self.e, self.prefixes
        entries = []
        for _, row, node in group:
            p = self._depth(node)
            entries.append((store.get(node) if node is not None else None, p, row.prompt[p:]))
        logits, layers, spans = self._pass(entries)
        shared = any(node is not None for *_, node in group)
        best, gaps = e.pick(logits, with_gaps=e.config.record_gaps or shared)
        del logits
        for r, (i, row, node) in enumerate(group):
            live = _Live(index=i, result=RowResult(draft_len=len(row.draft), shared=self._depth(node)), max_new=row.max_new)
            state = self._verify(live, row, [(best[r][0], gaps[r][0] if gaps else 0.0)], verified=False)
            where = (layers, r, spans[r])
            if state == "done":
                finished.append(live)
            elif state == "more":
                drafting.append((live, row, *where))
            else:
                live.length = len(row.prompt)
                joining.append((live, *where))
            if node is not None:
                e.stats.shared_tokens += self._depth(node)
                store.release(node)

    def _draft_passes(self, drafting: list[tuple[_Live, Row, Any, int, list[tuple[int, int]]]], finished: list[_Live],
                      joining: list[tuple[_Live, Any, int, list[tuple[int, int]]]]) -> None:
        """The drafts of every row whose tokens have all matched so far, a chunk per pass (a first
        ``first_chunk`` probe, then the rest within the logits budget), on one cache that holds each
        row's prompt right-aligned (copied from its prompt pass)."""
        torch, e = self.torch, self.e
        lives = [d[0] for d in drafting]
        rows = [d[1] for d in drafting]
        T = max(len(row.prompt) for row in rows)
        cap = T + min(max(len(row.draft) for row in rows), e.config.first_chunk)
        layers = []
        for li in range(e.n_layers):
            src = drafting[0][2][li]
            k = src.kbuf.new_zeros(len(rows), src.kbuf.shape[1], cap, src.kbuf.shape[3])
            v = src.vbuf.new_zeros(len(rows), src.vbuf.shape[1], cap, src.vbuf.shape[3])
            for j, (_, row, group_layers, r, spans) in enumerate(drafting):
                _copy_spans(k, v, j, T - len(row.prompt), group_layers[li], r, spans)
            layers.append(e.SlotLayer(cap, k, v, length=T))
        mask = torch.zeros((len(rows), T), dtype=torch.long)
        for j, row in enumerate(rows):
            mask[j, T - len(row.prompt):] = 1
        starts = [T - len(row.prompt) for row in rows]
        fed = [0] * len(rows)  # draft tokens in the cache
        members, again = list(range(len(rows))), list(range(len(rows)))
        chunk = e.config.first_chunk
        while again:
            sel = [members.index(r) for r in again]
            layers, mask = self._select(layers, mask, sel)
            members, todo, again = again, again, []
            C = min(max(len(rows[r].draft) - fed[r] for r in todo), chunk)
            chunk = self._chunk(len(todo))  # the first chunk probes; the next ones take the rest
            width = mask.shape[1]
            ids = torch.full((len(todo), C), e.pad_id, dtype=torch.long)
            cmask = torch.zeros((len(todo), C), dtype=torch.long)
            for j, r in enumerate(todo):
                c = list(rows[r].draft[fed[r]:fed[r] + C])
                ids[j, :len(c)] = torch.tensor(c, dtype=torch.long)
                cmask[j, :len(c)] = 1
            mask = torch.cat([mask, cmask], dim=1)
            start = torch.tensor([len(rows[r].prompt) + fed[r] for r in todo], dtype=torch.long)
            positions = start[:, None] + torch.arange(C)[None, :]
            for layer in layers:  # room for this chunk
                layer.reserve(width + C)
            cache = e.SlotCache(layers)
            logits = e.forward(ids.to(e.device), mask.to(e.device), positions.to(e.device), cache, C)
            best, gaps = e.pick(logits)
            del logits
            for j, r in enumerate(todo):
                n = int(cmask[j].sum())
                fed[r] += n
                live, row = lives[r], rows[r]
                state = self._verify(live, row, list(zip(best[j][:n], gaps[j][:n])), verified=True)
                if state == "done":
                    finished.append(live)
                elif state == "more":
                    again.append(r)
                else:
                    live.length = len(row.prompt) + live.result.accepted
                    joining.append((live, layers, j, [(starts[r], live.length)]))

    def _chunk(self, rows: int) -> int:
        """Draft tokens per verification pass after the first: logits stay within ``verify_logits``."""
        return max(8, self.e.config.verify_logits // max(1, rows * self.e.vocab))

    def _select(self, layers: list[Any], mask: Any, sel: list[int]) -> tuple[list[Any], Any]:
        if sel == list(range(mask.shape[0])):
            return layers, mask
        dsel = self.torch.tensor(sel, dtype=self.torch.long, device=self.e.device)
        return ([self.e.SlotLayer(layer.capacity, layer.kbuf.index_select(0, dsel), layer.vbuf.index_select(0, dsel),
                                  length=layer.length) for layer in layers],
                mask.index_select(0, self.torch.tensor(sel, dtype=self.torch.long)))

    def _verify(self, live: _Live, row: Row, preds: list[tuple[int, float]], verified: bool) -> str:
        """Walk the predictions for the row's next generated positions (from ``len(tokens)`` on);
        ``verified``: they come from a draft pass (else from the prompt pass, as in plain decoding).

        Returns ``done`` (the row stopped), ``more`` (every draft token so far accepted and the draft
        goes on beyond this pass) or ``decode`` (the row continues by decode steps from ``pending``)."""
        res, tol, record = live.result, self.e.near_tie, self.e.config.record_gaps
        draft = row.draft
        for j, (token, gap) in enumerate(preds, start=len(res.tokens)):
            if j < len(draft) and j == len(res.tokens) and token == draft[j] and j == res.accepted:
                res.accepted += 1
            if verified:  # read from a draft pass, not computed the way plain decoding computes it
                res.verified += 1
                if gap < tol:
                    res.near_ties += 1
            elif res.shared and gap < tol:  # computed on a shared prefix's KV
                res.shared_near_ties += 1
            if _emit(res, row, token, gap, record):
                return "done"
            if res.accepted < len(res.tokens):  # diverged here: this token is the model's own choice
                live.pending = token
                return "decode"
        # every prediction matched a draft token, and the draft goes on beyond this pass
        assert res.accepted == len(res.tokens) <= len(draft)
        return "more"

    # -- the decode batch --------------------------------------------------------------------

    def _merge(self, joining: list[tuple[_Live, Any, int, list[tuple[int, int]]]]) -> None:
        """Put the joining rows into free slots of the decode buffers, right-aligned at column ``T``.

        The buffers (``[slots, heads, capacity, dim]`` per layer) are reused while the rows fit: enough free
        slots, and room for every row's remaining budget. Otherwise (or when a joining row is longer than
        ``T``) they are allocated again, the live rows copied in: once per admission at most, never per step."""
        torch, e = self.torch, self.e
        lengths = [live.length for live, *_ in joining]
        n, m = len(self.rows), len(joining)
        T = max([self.T, *lengths])
        # each row appends at most (budget - emitted) more columns
        need = max(live.max_new - len(live.result.tokens) for live in [*self.rows, *(j[0] for j in joining)]) + 1
        fits = bool(self.kv) and n + m <= self.kv[0][0].shape[0] and T + need <= self.cap
        if fits and T > self.T and n:  # a longer row joins: the live rows move right, in place
            shift = T - self.T
            for k, v in self.kv:
                k[:n, :, shift:T] = k[:n, :, :self.T].clone()
                v[:n, :, shift:T] = v[:n, :, :self.T].clone()
            self.mask[:n, shift:T] = self.mask[:n, :self.T].clone()
            self.mask[:n, :shift] = 0
        elif not fits:
            src = joining[0][1][0]
            slots = max(n + m, min(e.config.max_batch, n + m + self.waiting))
            # CPU: room for rows that join later without moving the others (auto caps the batch at 64 rows, memory
            # is plentiful); CUDA: exactly what auto's memory estimate counted (the whole view is usually one batch)
            cap = T + need + (T // 4 if e.device.type == "cpu" else 0)
            kv = []
            for li in range(e.n_layers):
                k = src.kbuf.new_zeros(slots, src.kbuf.shape[1], cap, src.kbuf.shape[3])
                v = src.vbuf.new_zeros(slots, src.vbuf.shape[1], cap, src.vbuf.shape[3])
                if n:
                    k[:n, :, T - self.T:T] = self.kv[li][0][:n, :, :self.T]
                    v[:n, :, T - self.T:T] = self.kv[li][1][:n, :, :self.T]
                kv.append((k, v))
            mask = torch.zeros((slots, cap), dtype=torch.long)
            if n:
                mask[:n, T - self.T:T] = self.mask[:n, :self.T]
            self.kv, self.mask, self.cap = kv, mask, cap
        for li, (k, v) in enumerate(self.kv):
            for j, (live, layers, r, spans) in enumerate(joining):
                _copy_spans(k, v, n + j, T - live.length, layers[li], r, spans)
        for j, length in enumerate(lengths):
            self.mask[n + j] = 0
            self.mask[n + j, T - length:T] = 1
        self.T = T
        self.rows.extend(live for live, *_ in joining)

    def step(self, rows: Sequence[Row]) -> list[_Live]:
        """One decode step for every live row (slots ``0..n-1`` of the buffers: views, no copy); rows that
        stop leave their slot to the last live row."""
        torch, e = self.torch, self.e
        T, n = self.T, len(self.rows)
        ids = torch.tensor([[live.pending] for live in self.rows], dtype=torch.long)
        positions = torch.tensor([[len(rows[live.index].prompt) + len(live.result.tokens) - 1]
                                  for live in self.rows], dtype=torch.long)
        self.mask[:n, T] = 1
        cache = e.SlotCache([e.SlotLayer(self.cap, k[:n], v[:n], length=T) for k, v in self.kv])
        logits = e.forward(ids.to(e.device), self.mask[:n, :T + 1].to(e.device), positions.to(e.device), cache, 1,
                           step=True)
        self.T = T + 1
        record = e.config.record_gaps
        best, gaps = e.pick(logits, with_gaps=record or any(live.result.shared for live in self.rows))
        finished, done = [], []
        tol = e.near_tie
        for b, live in enumerate(self.rows):
            token = best[b][0]
            live.length += 1
            if live.result.shared and gaps[b][0] < tol:
                live.result.shared_near_ties += 1
            if _emit(live.result, rows[live.index], token, gaps[b][0] if gaps else 0.0, record):
                finished.append(live)
                done.append(b)
            else:
                live.pending = token
        if done:
            self._release(done)
        return finished

    def _release(self, done: list[int]) -> None:
        """Free the slots of finished rows: the last live row moves into each (one row copied, not the
        batch); columns no live row uses are dropped only once they are a quarter of the buffer."""
        T = self.T
        for b in sorted(done, reverse=True):
            last = len(self.rows) - 1
            if b != last:
                first = T - self.rows[last].length
                for k, v in self.kv:
                    k[b, :, first:T] = k[last, :, first:T]
                    v[b, :, first:T] = v[last, :, first:T]
                self.mask[b] = self.mask[last]
                self.rows[b] = self.rows[last]
            self.rows.pop()
        n = len(self.rows)
        if not n:
            self.T = 0
            return
        first = T - max(live.length for live in self.rows)
        if first > max(64, T // 4):
            for k, v in self.kv:
                k[:n, :, :T - first] = k[:n, :, first:T].clone()
                v[:n, :, :T - first] = v[:n, :, first:T].clone()
            self.mask[:n, :T - first] = self.mask[:n, first:T].clone()
            self.mask[:n, T - first:] = 0
            self.T = T - first
