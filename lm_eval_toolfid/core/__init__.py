"""The foundation every other layer builds on: typed records (``records``), bounded copies
(``jsonsafe``), JSON Schema validation (``schema``), statistics (``stats``), the one error type and
exit codes (``errors``), durable writes (``fsutil``). Imports nothing else of toolfid.
"""
