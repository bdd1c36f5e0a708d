"""The one error type of the dataset layer (its own module so that every other module of
``engine.data`` can import it without importing each other)."""


class DataError(Exception):
    """A dataset cannot be loaded. The message is meant to be shown to the user as is:
    it names the missing or bad file, the folder where it is expected and what to do."""
