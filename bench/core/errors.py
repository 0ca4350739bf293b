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


def first_line(err: BaseException | str, width: int = 200) -> str:
    """The first line of an error (or its type's name when it has no text), at most ``width`` characters,
    cut at the last word boundary with " …" (a quoted cause never ends mid-word; a single token longer than
    ``width``, such as a path, is cut where it must be)."""
    text = str(err).strip()
    line = " ".join((text.splitlines()[0] if text else type(err).__name__).split())
    if len(line) <= width:
        return line
    cut = line[: width - 2]
    boundary = cut.rfind(" ")
    return (cut[:boundary] if boundary > 0 else cut) + " …"
