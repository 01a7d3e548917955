"""The app's errors that more than one layer raises or catches."""


class ExportError(RuntimeError):
    """The export failed in one of its stages; the message names the stage."""


class InspectError(ValueError):
    """The folder is not an etkit export that ``etkit inspect`` can read; the message says why."""
