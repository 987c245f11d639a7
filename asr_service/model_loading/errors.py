class ModelLoadError(Exception):
    """A model could not be found or read. The message says what is accepted."""
