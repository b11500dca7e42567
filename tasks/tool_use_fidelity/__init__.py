"""The tool_use_fidelity task: YAMLs plus the thin class module."""
