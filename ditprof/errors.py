"""The one exception type the CLI turns into a one-line message."""


class DitprofError(Exception):
    """Bad input or an unmet requirement; the message is one line that names the problem."""
