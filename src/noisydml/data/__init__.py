"""Datasets: kinds (registry), the prepared on-disk form, the embedded generator."""


class DatasetError(ValueError):
    """A problem with a dataset's files; the message names the file."""
