"""lm-eval task folder shipped inside the package (``toolfid tasks-path`` prints where)."""
