"""The one exception type user-facing entry points turn into a one-line error."""


class ToolfidError(Exception):
    """A problem with the user's input or environment, explained in one line."""
