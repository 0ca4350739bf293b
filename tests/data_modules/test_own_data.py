"""Bring your own dataset (issue 20): the generic class-folder dataset with every prompt-reading method.

A generated class-folder dataset whose class names no prompt set knows ("blorp", "quux_gland",
"zentrix") runs FedCB, FedBM, FACMIC and FST-CBDG: once with the default prompts (the folder names as
concepts, generic templates, a notice) and once with a prompts file (concepts matched by class name);
the frozen classifier / text features must be exactly those of the expected prompts. A wrong prompts
file is one clear error before any image is decoded.
"""
from __future__ import annotations

import warnings

import pytest
import torch
from conftest import run_in_process
from official_layouts import write_class_tree

from bench.cli import main
from bench.core.errors import FedbenchError, FedbenchNotice
from lightning_modules.clip_feature_base import shared_clip
from lightning_modules.components import prompts as P
from lightning_modules.components import text_encoders as TE
from lightning_modules.components.concept_distributions import ConceptDistribution

pytestmark = pytest.mark.slow  # end-to-end (>= 6 s): make test-fast leaves this file out

CLASSES = ["blorp", "quux_gland", "zentrix"]  # sorted: the label order of class-folder
FILE_CONCEPTS = {"blorp": "a round red blob", "quux_gland": "a swollen gland", "zentrix": "a striped crystal"}
FILE_TEMPLATES = ["a microscope image of {}.", "the slide shows {}.", "{} under the microscope."]
CHEAP_GEN = {"gen_steps": 2, "gen_batch": 8, "gen_base_channels": 8, "g_batch": 5}


def write_prompts(path, concepts=None, templates=None, raw: str | None = None) -> str:
    import yaml

    if raw is None:
        body = {k: v for k, v in (("concepts", concepts), ("templates", templates)) if v is not None}
        raw = yaml.safe_dump(body, sort_keys=False)
    path.write_text(raw)
    return str(path)


@pytest.fixture
def own_data(tmp_path):
    root = tmp_path / "my_images"
    write_class_tree(root, CLASSES, 20, ext="png")  # flat layout: split 7:1:2 -> 42 / 6 / 12
    return root


@pytest.fixture
def own_cfg(tiny_cfg, own_data, tmp_path):
    def make(method: str, args: dict | None = None):
        args = dict(args or {})
        if method in ("fedcb", "fedbm"):
            args["text_cache_dir"] = str(tmp_path / "text")
        else:
            args["feature_cache_dir"] = str(tmp_path / "features")
        if method == "fedbm":  # the generator trains after both rounds, conditioned on the class concepts
            args.update(CHEAP_GEN, gen_start=1, gen_every=1)
        return tiny_cfg(**{"data.name": "class-folder", "data.root": str(own_data), "data.image_size": 8,
                           "method.name": method, "method.args": args, "partition.num_clients": 3,
                           "partition.args.min_size": 5, "fed.rounds": 2, "fed.sample_ratio": 1.0, "experiment": method})

    return make


def lkcc_expected(concepts: list[str], templates: list[str], cache: str) -> ConceptDistribution:
    grid = [[t.format(c) for t in templates] for c in concepts]
    return ConceptDistribution.from_embeddings(TE.class_prompt_embeddings("minilm", grid, cache).float())


# ---- FedCB / FedBM --------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["fedcb", "fedbm"])
def test_lkcc_methods_default_prompts_are_folder_names_and_generic_templates(method, own_cfg, captured, tmp_path):
    cfg = own_cfg(method)
    with pytest.warns(FedbenchNotice) as notices:
        record, _ = run_in_process(cfg)
    assert [str(n.message) for n in notices] == [
        (f"dataset 'class-folder' has no prompt set: {method} uses its class names as concepts ('blorp', "
        "'quux gland', 'zentrix') and 10 generic templates ('a photo of {}.', ...). To give your own, pass "
        "method.args.prompts: my_prompts.yaml (see docs/own-data.md).")]
    concepts = ["blorp", "quux gland", "zentrix"]  # underscores read as spaces
    assert record["class_names"] == CLASSES
    assert record["prompts"] == {"concepts": concepts, "templates": list(P.GENERIC_TEMPLATES),
                                 "concepts_from": "class names", "templates_from": "generic"}
    expected = lkcc_expected(concepts, list(P.GENERIC_TEMPLATES), str(tmp_path / "text"))
    head = captured["fed"].module.head
    assert torch.equal(head.mu, expected.mu) and torch.equal(head.sigma_diag, expected.sigma_diag)
    assert record["splits"] == {"train": 42, "val": 6, "test": 12}  # the flat layout's 7:1:2 of 60 images
    if method == "fedbm":
        module = captured["fed"].module
        assert [e["round"] for e in module.cgde.log] == [0, 1]
        assert torch.equal(module.condition_distribution().mu, expected.mu)


@pytest.mark.parametrize("method", ["fedcb", "fedbm"])
def test_lkcc_methods_read_the_prompts_file_by_class_name(method, own_cfg, captured, tmp_path):
    # the file lists the classes in another order than the labels: matched by name, not position
    path = write_prompts(tmp_path / "my_prompts.yaml", dict(reversed(list(FILE_CONCEPTS.items()))), FILE_TEMPLATES)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedbenchNotice)  # nothing was defaulted: no notice
        record, _ = run_in_process(own_cfg(method, {"prompts": path}))
    concepts = [FILE_CONCEPTS[c] for c in CLASSES]
    assert record["prompts"]["concepts"] == concepts and record["prompts"]["templates"] == FILE_TEMPLATES
    assert record["prompts"]["file"]["concepts"] == dict(reversed(list(FILE_CONCEPTS.items())))
    expected = lkcc_expected(concepts, FILE_TEMPLATES, str(tmp_path / "text"))
    assert torch.equal(captured["fed"].module.head.mu, expected.mu)
    default = lkcc_expected(["blorp", "quux gland", "zentrix"], list(P.GENERIC_TEMPLATES), str(tmp_path / "text"))
    assert not torch.allclose(expected.mu, default.mu, atol=1e-3)  # the file changed the classifier


def test_templates_only_file_keeps_the_folder_names(tmp_path):
    path = write_prompts(tmp_path / "t.yaml", templates=FILE_TEMPLATES)
    cp = P.class_prompts("class-folder", CLASSES, path)
    assert cp.concepts == ("blorp", "quux gland", "zentrix") and list(cp.templates) == FILE_TEMPLATES
    assert P.defaults_notice(cp, "class-folder", "fedcb", uses_templates=True).startswith(
        "dataset 'class-folder' has no prompt set: fedcb uses its class names as concepts")
    # a known dataset with a file of concepts: the file wins over the prompt set
    digits = {n: f"the numeral {i}" for i, n in enumerate(["zero", "one", "two", "three", "four", "five", "six",
                                                            "seven", "eight", "nine"])}
    cp = P.class_prompts("digits", list(digits), write_prompts(tmp_path / "d.yaml", digits))
    assert cp.concepts[3] == "the numeral 3" and cp.templates == P._PROMPT_SETS["digits"].templates


# ---- the CLIP methods ----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["facmic", "fst-cbdg"])
def test_clip_methods_on_own_classes(method, own_cfg, captured, tmp_path):
    clip = shared_clip("tiny-random")
    with pytest.warns(FedbenchNotice, match=f"{method} uses its class names as concepts"):
        record, _ = run_in_process(own_cfg(method))
    template = "a picture of a {}" if method == "facmic" else "a photo of a {}."  # the methods' own prompts
    assert record["prompts"]["concepts"] == ["blorp", "quux gland", "zentrix"]
    assert record["prompts"]["templates"] == [template]
    want = clip.encode_texts([template.format(c) for c in ["blorp", "quux gland", "zentrix"]]).float().cpu()
    assert torch.allclose(captured["fed"].module.text_features, want, atol=1e-6)

    path = write_prompts(tmp_path / "my_prompts.yaml", FILE_CONCEPTS, FILE_TEMPLATES)
    record, _ = run_in_process(own_cfg(method, {"prompts": path}))
    concepts = [FILE_CONCEPTS[c] for c in CLASSES]
    assert record["prompts"]["templates"] == [FILE_TEMPLATES[0]]  # a CLIP method reads one template: the first
    want = clip.encode_texts([FILE_TEMPLATES[0].format(c) for c in concepts]).float().cpu()
    assert torch.allclose(captured["fed"].module.text_features, want, atol=1e-6)
    # method.args.prompt still wins over the file's templates
    record, _ = run_in_process(own_cfg(method, {"prompts": path, "prompt": "a drawing of {}."}))
    assert record["prompts"]["templates"] == ["a drawing of {}."] and record["prompts"]["concepts"] == concepts


# ---- a wrong prompts file: one error, before any work ----------------------------------------------
WRONG_FILES = [  # (the file's YAML, or None for no file; what the error says)
    ("concepts: {blorp: x, quux_gland: y}", "no concept for class(es) ['zentrix']"),
    ("concepts: {blorp: x, quux_gland: y, zentriks: z}",
     ("no concept for class(es) ['zentrix']; concept(s) for 'zentriks' (did you mean 'zentrix'?), which is not a "
     "class. The classes are ['blorp', 'quux_gland', 'zentrix']")),
    ("concepts: {blorp: x, quux_gland: x, zentrix: z}", "concept(s) ['x'] are given to several classes"),
    ("templates: [a photo of a thing.]", "template 'a photo of a thing.' must be a string with exactly one {}"),
    ("template: ['a {}.']", "unknown key(s) ['template']; the keys are ['concepts', 'templates']"),
    ("concepts: [blorp, quux_gland\n", "not readable as YAML"),
    (None, "no such file (relative paths are read from the current folder"),
]


@pytest.mark.parametrize(("content", "message"), WRONG_FILES,
                         ids=["missing-class", "typo", "same-concept", "no-braces", "key-typo", "bad-yaml", "no-file"])
def test_wrong_prompts_file_is_one_error_before_any_work(content, message, own_data, tmp_path, capsys):
    path = tmp_path / "my_prompts.yaml"
    if content is not None:
        write_prompts(path, raw=content)
    argv = ["run", "--data.name", "class-folder", "--data.root", str(own_data), "--data.image_size", "8",
            "--data.cache_dir", str(tmp_path / "cache"), "--method.name", "fedcb", "--method.backbone", "simple-cnn",
            "--method.args", f'{{"prompts": "{path}", "text_cache_dir": "{tmp_path / "text"}"}}',
            "--output_dir", str(tmp_path / "runs"), "--threads", "1", "--progress", "false"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fedbench: error: method.args.prompts '{path}'"), err
    assert message in err[0]
    for folder in ("cache", "runs", "text"):  # nothing decoded, encoded or written
        assert not (tmp_path / folder).exists(), folder


def test_table_checks_the_prompts_file_of_every_row_before_the_first_run(own_data, tmp_path, capsys):
    import yaml

    bad = write_prompts(tmp_path / "bad.yaml", {"blorp": "x"})
    spec = {"table": "mine", "dataset": "own", "betas": [0.5], "seeds": [0],
            "base": {"data": {"name": "class-folder", "root": str(own_data), "cache_dir": str(tmp_path / "cache")},
                     "method": {"backbone": "simple-cnn"}},
            "rows": [{"label": "FedAvg", "method": {"name": "fedavg"}},
                     {"label": "FedCB", "method": {"name": "fedcb", "args": {"prompts": bad}}}]}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(spec))
    code = main(["table", "--config", str(tmp_path / "t.yaml"), "--output-dir", str(tmp_path / "runs"),
                 "--tables-dir", str(tmp_path / "tables")])
    assert code == 2
    err = capsys.readouterr().err
    assert "row 'FedCB' (beta 0.5, seed 0): method.args.prompts" in err and "['quux_gland', 'zentrix']" in err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "cache").exists()


def test_changed_prompts_file_makes_the_record_stale(own_cfg, tmp_path):
    from bench.scheduling.table_runner import record_status

    path = write_prompts(tmp_path / "my_prompts.yaml", FILE_CONCEPTS, FILE_TEMPLATES)
    cfg = own_cfg("fedcb", {"prompts": path})
    run_in_process(cfg)
    assert record_status(cfg)[1] == "up to date"
    write_prompts(tmp_path / "my_prompts.yaml", {**FILE_CONCEPTS, "zentrix": "a blue crystal"}, FILE_TEMPLATES)
    assert record_status(cfg)[1] == "prompts file changed"


def test_prompt_file_loader_rejects_non_mappings(tmp_path):
    for raw, what in (("", "holds nothing"), ("- a\n- b\n", "holds list"), ("concepts: [a, b]\n", "'concepts' must be")):
        with pytest.raises(FedbenchError, match=what):
            P.load_prompt_file(write_prompts(tmp_path / "p.yaml", raw=raw))
