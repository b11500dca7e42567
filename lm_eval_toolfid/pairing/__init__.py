"""Pairing an adapter run with its base run.

A base run stores a *reference*: for every case it scored, the request hash and the raw
generation. An adapter run looks references up by a key built from everything that changes what
the base generates — base identity (path or hub id pinned to a commit, a content fingerprint of
local folders, every model argument except the few known not to change outputs, the backend),
case set, prompt settings, generation settings and lm-eval's own request settings (chat
template, system instruction) — and checks every case's request hash. Request hashes are
computed by toolfid from the rendered prompt, never from what lm-eval happened to construct (so
``--cache_requests`` cannot empty them). A reference that does not match is never used.

A partial base run (``--limit``/``--samples``) writes a *subset* reference, keyed by its subset;
an adapter run pairs only when references of its key cover every case it scores.

References are re-scored from their stored text with the current scoring core, so a fix to
scoring never leaves a stale outcome behind.

Modules: ``identity`` (base identity, adapter detection, :class:`RunKey`), ``references`` (the
reference store), ``samples`` (lm-eval samples files, ``base_samples``).
"""
