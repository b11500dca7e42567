"""Case sets: case files (``load``: JSONL validated on load, errors naming ``file:line``), BFCL
import (``bfcl``), the bundled default set and the paths of what ships in the package (``bundled``),
and the seeded generator of the default set with its vocabulary (``generate``, ``vocab/``).
"""
