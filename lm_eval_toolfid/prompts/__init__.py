"""Prompt styles: ``plain`` (instruction, demonstrations, tools, request), ``chat`` (the model's own
chat template with the case's tools), ``raw`` (the bare request). :class:`prompter.Prompter` is the
one entry point; ``settings`` holds what is part of a run's identity; ``history`` renders a case's
conversation (earlier calls, tool results) in each style.
"""
