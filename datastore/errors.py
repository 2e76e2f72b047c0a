"""The project's exception types (each also subclasses the builtin a caller would expect), and `shown`,
which every name from the data goes through on its way into their messages."""


class DStoreError(Exception):
    """Base of every error this project raises on purpose. Its text is `shown`: a file name with a
    newline or a terminal escape in it cannot forge a line in a library user's log either (the CLI
    prints the same text)."""

    def __str__(self) -> str:
        return shown(super().__str__())


class ConfigError(DStoreError, ValueError):
    """A parameter has a value that is not allowed; the message names it, its value and what is allowed."""


class FormatError(DStoreError, ValueError):
    """A container is malformed: missing array, wrong dtype, inconsistent offsets, unknown version."""


class IncompleteContainerError(FormatError):
    """A container has no completion marker: it was never finished (or is still being written)."""


class ChecksumError(FormatError):
    """A sample's bytes do not match its stored checksum.

    Attributes:
        samples: the indices of the samples that did not match (as the raiser counts them), where known.
    """

    def __init__(self, message: str, samples=()):
        super().__init__(message)
        self.samples = tuple(int(i) for i in samples)


class ContainerChangedError(FormatError):
    """A container's files changed (another file, size or modification time) after a job opened it."""


class ContainerNotFoundError(DStoreError, FileNotFoundError):
    """Nothing is at the path given as a container."""


class SampleError(DStoreError, ValueError):
    """One source sample cannot be ingested or decoded; the message names the file and the reason."""


class MemoryBudgetError(DStoreError, MemoryError):
    """A rank's share of the data set does not fit its memory budget."""


class OutputError(DStoreError, OSError):
    """The output cannot be written (read-only file system, no permission, no space); the message
    names the path and the system's reason."""


def shown(text: str) -> str:
    """`text` as printed in a report or an error: every character that is not printable (newlines,
    terminal escape sequences, other control characters) written as a Python escape, so that a
    sample's or a class's name cannot end a line or forge another (``a\nOK`` prints as ``a\\nOK``)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
