"""Developer scripts: setting up, preparing real models from PyPI (``real_models``), building fixtures.
Not shipped in the wheel; tests and benchmarks import ``scripts.real_models`` from the checkout."""
