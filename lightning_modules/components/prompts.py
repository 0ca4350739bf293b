"""Prompt templates and class concepts per dataset, for the language-model classifier (LKCC).

Each dataset has K class concepts (in label order) and M templates; ``prompts`` returns the
K x M contextualised descriptions fed to the text encoder. The medical templates follow the
patterns of the FedCB/FedBM prompt sets (see shared/notes/reference-implementations.md).
"""
from __future__ import annotations

from dataclasses import dataclass

from bench.core.errors import FedbenchError

# Six sentence patterns shared by the medical prompt sets; "{m}" is the modality phrase.
_PATTERNS = (
    "{a} {m} of {{}}.",
    "this is {a} {m} of {{}}.",
    "{{}} presented in {m}.",
    "the {m} shows {{}}.",
    "the {m} shows the presence of {{}}.",
    "the presence of {{}} in {m}.",
)


def _article(phrase: str) -> str:
    """English indefinite article for ``phrase`` (OCT is read "oh-see-tee")."""
    return "an" if phrase[0].lower() in "aeio" or phrase.startswith("OCT") else "a"


def _expand(modalities: tuple[str, ...]) -> list[str]:
    """Every pattern with every modality phrase, pattern-major (so a prefix covers few patterns)."""
    return [p.format(a=_article(m), m=m) for p in _PATTERNS for m in modalities]


def _medical(kind: str) -> list[str]:
    """24 templates: the six patterns x {image, photo, <kind> image, <kind> photo}."""
    return _expand(("image", "photo", f"{kind} image", f"{kind} photo"))


_OCT_SCAN = [
    "an OCT scan of {}.",
    "this is an OCT scan of {}.",
    "the OCT scan shows {}.",
    "the OCT scan shows the presence of {}.",
]


@dataclass(frozen=True)
class PromptSet:
    """Concepts (label order), the short label codes a datamodule may use instead, and templates."""

    concepts: tuple[str, ...]
    templates: tuple[str, ...]
    codes: tuple[str, ...] = ()


_FEMNIST_CONCEPTS = tuple(
    [f"the digit {d}" for d in "0123456789"]
    + [f"the uppercase letter {c}" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    + [f"the lowercase letter {c}" for c in "abcdefghijklmnopqrstuvwxyz"]
)

_PROMPT_SETS: dict[str, PromptSet] = {
    "kvasir": PromptSet(
        concepts=("dyed lifted polyp", "dyed resection margin", "esophagitis", "cecum", "pylorus",
                  "Z-line", "polyps", "ulcerative colitis"),
        codes=("dyed-lifted-polyps", "dyed-resection-margins", "esophagitis", "normal-cecum",
               "normal-pylorus", "normal-z-line", "polyps", "ulcerative-colitis"),
        templates=tuple(_medical("endoscopic")),
    ),
    "oct-c8": PromptSet(
        concepts=("Age-related macular degeneration", "Choroidal neovascularization",
                  "Central serous retinopathy", "Diabetic macular edema", "Diabetic retinopathy",
                  "Choroidal drusen", "Macular hole", "Normal retina"),
        codes=("AMD", "CNV", "CSR", "DME", "DR", "DRUSEN", "MH", "NORMAL"),
        templates=tuple(_expand(("image", "photo", "OCT image", "OCT photo")) + _OCT_SCAN),
    ),
    "ham10000": PromptSet(
        concepts=("actinic keratoses or intraepithelial carcinoma", "basal cell carcinoma",
                  "benign keratosis-like lesions", "dermatofibroma", "melanoma",
                  "melanocytic nevi", "vascular lesions"),
        codes=("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc"),
        templates=tuple(_medical("dermoscopic")),
    ),
    "pbc": PromptSet(
        concepts=("basophil", "eosinophil", "erythroblast", "immature granulocyte", "lymphocyte",
                  "monocyte", "neutrophil", "platelet"),
        codes=("basophil", "eosinophil", "erythroblast", "ig", "lymphocyte", "monocyte",
               "neutrophil", "platelet"),
        templates=tuple(_medical("microscopic")),
    ),
    "femnist": PromptSet(
        concepts=_FEMNIST_CONCEPTS,
        codes=tuple("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"),
        templates=(
            "an image of {}.", "a photo of {}.", "a handwritten image of {}.",
            "a handwritten photo of {}.", "a grayscale image of {}.", "a scanned image of {}.",
            "this is an image of {}.", "this is a handwritten image of {}.", "the image shows {}.",
            "the handwritten image shows {}.", "{} presented in image.", "{} written by hand.",
        ),
    ),
    "fashion-mnist": PromptSet(
        concepts=("T-shirt or top", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
                  "sneaker", "bag", "ankle boot"),
        templates=(
            "a photo of a {}.", "a grayscale photo of a {}.", "a product photo of a {}.",
            "a low resolution photo of a {}.", "a black and white photo of a {}.",
            "a photo of the {}.", "a centered photo of a {}.", "a cropped photo of a {}.",
            "an image of a {}.", "a small photo of a {}.", "a catalogue photo of a {}.",
            "a fashion photo of a {}.", "a picture of a {}.", "this is a photo of a {}.",
            "the image shows a {}.", "a pixelated photo of a {}.",
        ),
    ),
    "digits": PromptSet(
        concepts=("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
        codes=tuple("0123456789"),
        templates=(
            "a photo of the number {}.", "an image of the digit {}.", "a handwritten digit {}.",
            "a grayscale image of the number {}.", "the digit {}.",
            "a picture of the handwritten number {}.",
        ),
    ),
}


def known_datasets() -> list[str]:
    """Names of the datasets that have a prompt set."""
    return sorted(_PROMPT_SETS)


def _prompt_set(dataset: str) -> PromptSet:
    try:
        return _PROMPT_SETS[dataset]
    except KeyError:
        raise FedbenchError(
            f"No prompt set for dataset {dataset!r}. Known datasets: {', '.join(known_datasets())}. "
            "Add its concepts and templates to lightning_modules/components/prompts.py."
        ) from None


def templates(dataset: str, prompt_fraction: float = 1.0) -> list[str]:
    """The first round(prompt_fraction * M) templates of ``dataset`` (at least one)."""
    if not 0.0 < prompt_fraction <= 1.0:
        raise FedbenchError(f"prompt_fraction must be in (0, 1], got {prompt_fraction}.")
    all_templates = _prompt_set(dataset).templates
    keep = max(1, round(prompt_fraction * len(all_templates)))
    return list(all_templates[:keep])


def concepts(dataset: str) -> list[str]:
    """The class concepts of ``dataset`` in label order."""
    return list(_prompt_set(dataset).concepts)


def _check_class_names(dataset: str, known: PromptSet, class_names: list[str]) -> None:
    """The datamodule's class names must match the concepts in count and, if recognisable, order."""
    if len(class_names) != len(known.concepts):
        raise FedbenchError(
            f"Dataset {dataset!r} has {len(class_names)} class names from its datamodule but "
            f"{len(known.concepts)} concepts in the prompt set: {list(known.concepts)}."
        )
    given = [c.lower() for c in class_names]
    for reference in (known.concepts, known.codes):
        ref = [c.lower() for c in reference]
        if ref and sorted(given) == sorted(ref) and given != ref:
            raise FedbenchError(
                f"Dataset {dataset!r}: the datamodule's class names {class_names} are the prompt "
                f"set's labels in a different order {list(reference)}; concepts would be attached "
                "to the wrong labels."
            )


def prompts(
    dataset: str, class_names: list[str] | None = None, prompt_fraction: float = 1.0
) -> list[list[str]]:
    """K x M prompts: row k holds every kept template filled with concept k.

    ``class_names`` (from the datamodule) is only checked against the prompt set's concepts
    (same count; not a reordering of its concepts or label codes): the concepts come from the
    prompt set, which spells out abbreviations such as OCT's "AMD".
    """
    known = _prompt_set(dataset)
    if class_names is not None:
        _check_class_names(dataset, known, list(class_names))
    kept = templates(dataset, prompt_fraction)
    return [[t.format(c) for t in kept] for c in known.concepts]
