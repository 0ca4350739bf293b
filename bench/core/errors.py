"""User-facing errors: one clear message saying what was wrong and how to fix it."""


class FedbenchError(Exception):
    """Base class for errors a user can cause (bad config, missing data, diverging run)."""


class DatasetNotFoundError(FedbenchError, FileNotFoundError):
    """The dataset's files are not where the loader looks; the message says what to download."""


class CorruptDataError(FedbenchError):
    """A file of the dataset could not be decoded."""


class PartitionError(FedbenchError, ValueError):
    """The requested partition cannot be built (beta <= 0, more clients than samples, empty client)."""


class FedbenchWarning(UserWarning):
    """Something was wrong but repaired (a corrupt cache rebuilt); the message says what."""


class FedbenchNotice(FedbenchWarning):
    """Nothing is wrong, but fedbench chose something for you (default prompts); the message says what."""
