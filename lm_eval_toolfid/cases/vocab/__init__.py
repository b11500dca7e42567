"""The default case set's vocabulary: data files only (``common.json``, one ``<domain>.json`` per
domain; ``README.md`` here describes them). Read by :mod:`lm_eval_toolfid.cases.generate`."""
