"""Case sets: case files (``load``: JSONL validated on load, errors naming ``file:line``), BFCL
import (``bfcl``), the bundled default set and the paths of what ships in the package (``bundled``),
and the seeded generator of the default set (``generate``) with its vocabulary (``vocab/``, read by
``vocabulary``), the recipe language it is written in (``recipes``), where gold values can be read
(``grounding``) and the set's statistics (``set_stats``).
"""
