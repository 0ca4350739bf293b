"""Prompt templates and class concepts per dataset, for the language-model classifier (LKCC) and the
CLIP methods' class prompts.

Each dataset has K class concepts (in label order) and M templates; ``prompts`` returns the
K x M contextualised descriptions fed to the text encoder. The medical templates follow the
patterns of the FedCB/FedBM prompt sets (see shared/notes/reference-implementations.md).

A dataset without a prompt set here (the generic ``class-folder`` dataset, your own data) gets its
class names as concepts (underscores read as spaces) and ``GENERIC_TEMPLATES``, with a notice; a
prompts file (``method.args.prompts: my_prompts.yaml``, read by ``load_prompt_file``) gives concepts
per class name and/or templates for any dataset::

    concepts:            # class name (the folder name for class-folder) -> what the text encoder reads
      bcc: basal cell carcinoma
      mel: melanoma
    templates:           # each with one {} for the concept
      - a dermoscopic image of {}.
      - the photo shows {}.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.utilities.rank_zero import rank_zero_warn

from bench.core.errors import FedbenchError, FedbenchNotice

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
            "Give concepts and templates with method.args.prompts: my_prompts.yaml."
        ) from None


def _keep(all_templates: tuple[str, ...], prompt_fraction: float) -> list[str]:
    """The first round(prompt_fraction * M) templates (at least one)."""
    if not 0.0 < prompt_fraction <= 1.0:
        raise FedbenchError(f"prompt_fraction must be in (0, 1], got {prompt_fraction}.")
    return list(all_templates[:max(1, round(prompt_fraction * len(all_templates)))])


def templates(dataset: str, prompt_fraction: float = 1.0) -> list[str]:
    """The first round(prompt_fraction * M) templates of ``dataset`` (at least one)."""
    return _keep(_prompt_set(dataset).templates, prompt_fraction)


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


# ---- your own data -----------------------------------------------------------------------------------
# Templates for a dataset without a prompt set: no article before the concept (it may be a plural, a
# mass noun or start with a vowel) and no modality, so they read for any class name.
GENERIC_TEMPLATES = (
    "a photo of {}.", "an image of {}.", "a picture of {}.", "this is a photo of {}.",
    "this is an image of {}.", "the image shows {}.", "a close-up photo of {}.", "a cropped image of {}.",
    "{} shown in a photo.", "an example of {}.",
)
PROMPT_FILE_KEYS = ("concepts", "templates")
PROMPT_FILE_HELP = ("A prompts file is YAML with 'concepts:' (a mapping from every class name, the folder "
                    "name for class-folder, to the words the text encoder reads) and/or 'templates:' (a "
                    "list of sentences, each with one {} for the concept).")


def concept_from_name(name: str) -> str:
    """A class (folder) name read as a concept: underscores as spaces, surrounding blanks dropped."""
    return " ".join(str(name).replace("_", " ").split())


@dataclass(frozen=True)
class PromptFile:
    """A prompts file as written: concepts per class name (may be empty) and templates (may be empty)."""

    path: str
    concepts: dict[str, str] = field(default_factory=dict)
    templates: tuple[str, ...] = ()

    def content(self) -> dict[str, Any]:
        """What the file says, as plain data (a record keeps it; a changed file makes the record stale)."""
        return {"concepts": dict(self.concepts), "templates": list(self.templates)}


def _file_error(path: str, what: str) -> FedbenchError:
    return FedbenchError(f"method.args.prompts {path!r}: {what} {PROMPT_FILE_HELP}")


def check_template(template: Any, where: str) -> str:
    """A template is a string with exactly one {} (and no other format field)."""
    if not isinstance(template, str) or template.count("{}") != 1:
        raise FedbenchError(f"{where}: template {template!r} must be a string with exactly one {{}} for the "
                            "concept.")
    try:
        template.format("x")
    except (IndexError, KeyError, ValueError) as err:
        raise FedbenchError(f"{where}: template {template!r} is not a valid format string ({err}); write a "
                            "literal brace as {{ or }}.") from None
    return template


def load_prompt_file(path: str) -> PromptFile:
    """Read and check a prompts file (the format is in the module docstring); relative paths are read
    from the current folder, like data.root. Every problem is one FedbenchError naming the file."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise _file_error(path, f"no such file (relative paths are read from the current folder "
                                f"{str(Path.cwd())!r}).")
    try:
        raw = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise _file_error(path, f"not readable as YAML ({' '.join(str(err).split())}).") from None
    if not isinstance(raw, dict) or not raw:
        raise _file_error(path, f"holds {type(raw).__name__ if raw is not None else 'nothing'}, not a mapping.")
    unknown = sorted(set(map(str, raw)) - set(PROMPT_FILE_KEYS))
    if unknown:
        raise _file_error(path, f"unknown key(s) {unknown}; the keys are {list(PROMPT_FILE_KEYS)}.")
    given = raw.get("concepts") or {}
    if not isinstance(given, dict):
        raise _file_error(path, f"'concepts' must be a mapping class name -> concept, got {type(given).__name__}.")
    concept_map: dict[str, str] = {}
    for name, concept in given.items():
        if not isinstance(concept, str) or not concept.strip():
            raise _file_error(path, f"the concept of class {name!r} must be non-empty text, got {concept!r}.")
        concept_map[str(name)] = concept.strip()
    listed = raw.get("templates") or []
    if not isinstance(listed, list):
        raise _file_error(path, f"'templates' must be a list of sentences, got {type(listed).__name__}.")
    kept = tuple(check_template(t, f"method.args.prompts {path!r}") for t in listed)
    if len(set(kept)) != len(kept):
        raise _file_error(path, f"repeats template(s) {sorted({t for t in kept if kept.count(t) > 1})}.")
    if not concept_map and not kept:
        raise _file_error(path, "gives neither concepts nor templates.")
    return PromptFile(str(path), concept_map, kept)


def match_concepts(file: PromptFile, dataset: str, class_names: list[str]) -> list[str]:
    """The file's concepts in label order: every class name needs one and every key must be a class."""
    names = [str(n) for n in class_names]
    missing = [n for n in names if n not in file.concepts]
    unknown = [k for k in file.concepts if k not in names]
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"no concept for class(es) {missing}")
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, names, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            parts.append(f"concept(s) for {', '.join(hints)}, which {'is' if len(unknown) == 1 else 'are'} "
                         "not a class")
        raise FedbenchError(
            f"method.args.prompts {file.path!r} does not match the classes of dataset {dataset!r}: "
            f"{'; '.join(parts)}. The classes are {names}; 'concepts:' needs exactly one entry per class, keyed "
            "by its name (the folder name for class-folder).")
    out = [file.concepts[n] for n in names]
    repeated = sorted({c for c in out if out.count(c) > 1})
    if repeated:
        raise FedbenchError(f"method.args.prompts {file.path!r}: concept(s) {repeated} are given to several "
                            "classes, which the text encoder could then not tell apart.")
    return out


@dataclass(frozen=True)
class ClassPrompts:
    """The concepts (label order) and templates a run uses, and where each came from."""

    concepts: tuple[str, ...]
    templates: tuple[str, ...]
    concepts_from: str  # "prompt set 'kvasir'", "file 'p.yaml'", "class names"
    templates_from: str  # "prompt set 'kvasir'", "file 'p.yaml'", "generic"
    file: PromptFile | None = None

    def grid(self, prompt_fraction: float = 1.0) -> list[list[str]]:
        """K x M prompts: row k holds every kept template filled with concept k."""
        kept = _keep(self.templates, prompt_fraction)
        return [[t.format(c) for t in kept] for c in self.concepts]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"concepts": list(self.concepts), "templates": list(self.templates),
                               "concepts_from": self.concepts_from, "templates_from": self.templates_from}
        if self.file is not None:
            out["file"] = {"path": self.file.path, **self.file.content()}
        return out


def class_prompts(dataset: str | None, class_names: list[str], prompts_file: str | None = None) -> ClassPrompts:
    """The concepts and templates for ``dataset``'s classes.

    Concepts: the prompts file's (matched by class name), else the dataset's prompt set (checked against
    the class names), else the class names themselves. Templates: the file's, else the prompt set's, else
    ``GENERIC_TEMPLATES``."""
    names = [str(n) for n in class_names]
    file = load_prompt_file(prompts_file) if prompts_file else None
    known = _PROMPT_SETS.get(dataset or "")
    if file is not None and file.concepts:
        concept_list, concepts_from = match_concepts(file, str(dataset), names), f"file {file.path!r}"
    elif known is not None:
        _check_class_names(str(dataset), known, names)
        concept_list, concepts_from = list(known.concepts), f"prompt set {dataset!r}"
    else:
        concept_list, concepts_from = [concept_from_name(n) for n in names], "class names"
    if file is not None and file.templates:
        template_list, templates_from = list(file.templates), f"file {file.path!r}"
    elif known is not None:
        template_list, templates_from = list(known.templates), f"prompt set {dataset!r}"
    else:
        template_list, templates_from = list(GENERIC_TEMPLATES), "generic"
    return ClassPrompts(tuple(concept_list), tuple(template_list), concepts_from, templates_from, file)


def prompts(dataset: str, class_names: list[str] | None = None, prompt_fraction: float = 1.0,
            prompts_file: str | None = None) -> list[list[str]]:
    """K x M prompts of ``dataset``'s prompt set (or of ``prompts_file``): row k holds every kept
    template filled with concept k.

    Without a prompts file, ``class_names`` (from the datamodule) is only checked against the prompt
    set's concepts (same count; not a reordering of its concepts or label codes): the concepts come
    from the prompt set, which spells out abbreviations such as OCT's "AMD"."""
    if class_names is None:
        known = _prompt_set(dataset)
        return [[t.format(c) for t in _keep(known.templates, prompt_fraction)] for c in known.concepts]
    return class_prompts(dataset, list(class_names), prompts_file).grid(prompt_fraction)


def defaults_notice(cp: ClassPrompts, dataset: str | None, method: str, uses_templates: bool) -> str | None:
    """The notice that a run uses default concepts (and templates), or None when nothing was defaulted."""
    defaulted = []
    if cp.concepts_from == "class names":
        shown = ", ".join(repr(c) for c in cp.concepts[:4]) + (", ..." if len(cp.concepts) > 4 else "")
        defaulted.append(f"its class names as concepts ({shown})")
    if uses_templates and cp.templates_from == "generic":
        defaulted.append(f"{len(cp.templates)} generic templates ({cp.templates[0]!r}, ...)")
    if not defaulted:
        return None
    return (f"dataset {dataset!r} has no prompt set: {method} uses {' and '.join(defaulted)}. To give your own, "
            "pass method.args.prompts: my_prompts.yaml (see docs/own-data.md).")


def announce_defaults(cp: ClassPrompts, dataset: str | None, method: str, uses_templates: bool) -> None:
    """Say once, on rank 0, what was defaulted (``defaults_notice``)."""
    message = defaults_notice(cp, dataset, method, uses_templates)
    if message:
        rank_zero_warn(message, category=FedbenchNotice)
