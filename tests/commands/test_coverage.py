"""`fedbench coverage`, partition columns and like-with-like protocols (issue 15, items 1-3).

A fixture paper and fixture table configs in tmp_path: coverage counts, every kind of reason, and
agreement with what the renderer prints (the same lookup). Then the columns of every partition the
papers print, the round rules on a known history, and that a row measured one way never gets a
number measured another way.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from bench.assembly.records import record_path
from bench.commands.coverage import coverage, format_report
from bench.core.atomic_io import write_json
from bench.core.errors import FedbenchError
from bench.reporting.paper_numbers import load_paper_numbers
from bench.reporting.tables import render_table
from bench.scheduling.table_runner import plan_runs
from bench.tables.columns import beta_column, parse_column, table_columns
from bench.tables.protocols import RowProtocol, metric_at, protocol_difference, select_round
from bench.tables.table_spec import TableSpec

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


def cell(dataset, partition, method, metric, mean, setting=None):
    return {"dataset": dataset, "partition": partition, "method": method, "metric": metric, "mean": mean,
            "std": 1.0, "setting": setting}


DEMO = {
    "paper": "demo", "title": "A fixture paper", "source": "nowhere.txt",
    "tables": [
        {"id": "T1", "kind": "comparison", "caption": "comparison",
         "protocol": {"eval": "global", "round": "best-val-sum5"},
         "method_protocols": {"Proto": {"eval": "unknown", "note": "not said"},
                              "Central": {"model": ["central"], "model_note": "the pooled model"}},
         "cells": [
             cell("digits", "dirichlet-0.1", "FedAvg", "accuracy", 50.0),  # covered
             cell("digits", "iid", "FedAvg", "accuracy", 60.0),  # covered
             cell("digits", "dirichlet-0.1", "FedAvg", "f1", 40.0),  # metric not in the config
             cell("digits", "dirichlet-0.1", "Rep", "accuracy", 45.0),  # per-client row vs global paper
             cell("digits", "dirichlet-0.1", "Proto", "accuracy", 30.0),  # paper does not state eval
             cell("digits", "none", "Central", "accuracy", 90.0),  # covered (partition-independent row)
             cell("digits", "shards-2", "FedAvg", "accuracy", 33.0),  # no such column
             cell("digits", "dirichlet-0.1", "FedNope", "accuracy", 20.0),  # no row
             cell("kvasir", "dirichlet-0.1", "FedAvg", "accuracy", 55.0),  # no config with that data
         ]},
        {"id": "T2", "kind": "ablation", "caption": "ablation",
         "protocol": {"eval": "global", "round": "best-val-sum5"},
         "cells": [
             cell("digits", "dirichlet-0.1", "FedAvg", "accuracy", 51.0, "lr=0.1"),  # another setting
             cell("digits", "dirichlet-0.1", "Mystery", "accuracy", 70.0),  # reason given in the config
         ]},
    ],
}
CONFIG = {
    "table": "demo", "dataset": "digits", "paper": "demo", "round_rule": "best-val-sum5",
    "columns": ["dirichlet-0.1", "iid"], "seeds": [0, 1, 2], "metrics": ["accuracy"],
    "base": {"data": {"name": "digits"}, "partition": {"num_clients": 4}, "fed": {"rounds": 3}},
    "uncovered": [{"paper": "demo", "table": "T2", "method": "Mystery", "reason": "the paper does not state X"}],
    "rows": [
        {"label": "FedAvg", "method": {"name": "fedavg"}},
        {"label": "Rep (per-client)", "method": {"name": "fedrep"}, "paper_method": "Rep"},
        {"label": "Proto (client models)", "method": {"name": "fedproto"}, "fed": {"protocol": "local_mean"},
         "paper_method": "Proto"},
        {"label": "Central", "method": {"name": "central"}, "partition_independent": True},
    ],
}
EXPECTED = {  # (table, partition, method, metric) -> covered or the start of the reason
    ("T1", "dirichlet-0.1", "FedAvg", "accuracy"): True,
    ("T1", "iid", "FedAvg", "accuracy"): True,
    ("T1", "none", "Central", "accuracy"): True,
    ("T1", "dirichlet-0.1", "FedAvg", "f1"): "metric f1 is not in demo_digits.yaml",
    ("T1", "dirichlet-0.1", "Rep", "accuracy"):
        "protocol differs: evaluation (ours: per_client, paper: global); round (ours: final, paper: best-val-sum5)",
    ("T1", "dirichlet-0.1", "Proto", "accuracy"): "protocol differs: the paper does not state what it evaluates",
    ("T1", "shards-2", "FedAvg", "accuracy"): "no shards-2 column for digits in demo_digits.yaml",
    ("T1", "dirichlet-0.1", "FedNope", "accuracy"): "no row for FedNope (demo) in demo_digits.yaml",
    ("T2", "dirichlet-0.1", "FedAvg", "accuracy"): "row 'FedAvg' of demo_digits.yaml looks up another FedAvg cell",
    ("T2", "dirichlet-0.1", "Mystery", "accuracy"): "the paper does not state X (demo_digits.yaml)",
}


@pytest.fixture
def demo(tmp_path):
    papers, configs = tmp_path / "paper", tmp_path / "configs"
    papers.mkdir()
    configs.mkdir()
    (papers / "demo.json").write_text(json.dumps(DEMO))
    (configs / "demo_digits.yaml").write_text(yaml.safe_dump(CONFIG))
    (configs / "other_kvasir.yaml").write_text(yaml.safe_dump(  # compares with no paper
        {**CONFIG, "paper": [], "uncovered": [], "dataset": "kvasir", "base": {"data": {"name": "kvasir"}}}))
    return papers, configs


def test_coverage_counts_and_reasons(demo):
    papers, configs = demo
    result = coverage(str(configs), str(papers))
    assert result["errors"] == []
    assert result["summary"]["demo"]["covered"] == 3 and result["summary"]["demo"]["total"] == 11
    assert result["summary"]["demo"]["tables"] == {"T1": {"covered": 3, "total": 9, "inferred": 0},
                                                   "T2": {"covered": 0, "total": 2, "inferred": 0}}
    got = {(e["table"], e["partition"], e["method"], e["metric"], e["dataset"]): e for e in result["cells"]}
    for (table, part, method, metric), want in EXPECTED.items():
        e = got[(table, part, method, metric, "digits")]
        if want is True:
            assert e["covered"] and e["reason"] is None, e
        else:
            assert not e["covered"] and e["reason"].startswith(want), (e["reason"], want)
    kvasir = got[("T1", "dirichlet-0.1", "FedAvg", "accuracy", "kvasir")]
    assert kvasir["reason"] == "no table config with demo has kvasir data"
    by = got[("T1", "iid", "FedAvg", "accuracy", "digits")]["by"]
    assert by == [{"config": str(configs / "demo_digits.yaml"), "row": "FedAvg", "column": "iid",
                   "metric": "accuracy", "differs": None, "inferred": False}]
    central = got[("T1", "none", "Central", "accuracy", "digits")]["by"]
    assert sorted(b["column"] for b in central) == ["dirichlet-0.1", "iid"]  # shown in both columns
    text = format_report(result)
    assert "  demo: 3/11 (27.3%)" in text and "    Table T2: 0/2" in text
    assert "demo T1 | digits iid | FedAvg | accuracy = 60: demo_digits.yaml row 'FedAvg' column iid" in text


def test_coverage_is_what_the_renderer_prints(demo, tmp_path):
    """Every covered (cell, config row, column) is a rendered cell with the paper's number and a delta;
    every rendered cell with a number is one of them; protocol differences print no number."""
    papers, configs = demo
    result = coverage(str(configs), str(papers))
    spec = TableSpec.parse(yaml.safe_load((configs / "demo_digits.yaml").read_text()), "demo_digits.yaml")
    runs = plan_runs(spec, str(tmp_path / "runs"))
    for run in runs:
        history = [{"round": r, "metrics": {f"{s}/{m}": 10.0 * (r + 1) + run.seed for s in ("val", "test")
                                           for m in ("accuracy", "precision", "f1", "auc", "balanced_accuracy")}}
                   for r in range(3)]
        write_json(record_path(run.cfg.output_dir, run.cfg.experiment, run.cfg.run_name()),
                   {"config": run.cfg.to_dict(), "history": history, "dataset": "digits", "backbone": "cnn",
                    "splits": {"train": 1, "val": 1, "test": 1}, "class_names": ["a"],
                    "partition": {"counts": [[1], [1], [1], [1]]}})
    paths = render_table(spec, runs, str(tmp_path / "tables"), papers_root=str(papers))
    rendered = json.loads(Path(paths["json"]).read_text())["cells"]
    with_number = {(c["method"], c["column"], c["metric"], c["paper_mean"]) for c in rendered
                   if c["paper_mean"] is not None}
    covered = {(b["row"], b["column"], b["metric"], e["mean"]) for e in result["cells"] if e["covered"]
               for b in e["by"] if b["config"].endswith("demo_digits.yaml")}
    assert with_number == covered and len(covered) == 4  # Central's one cell is printed in both columns
    fedavg = next(c for c in rendered if (c["method"], c["column"]) == ("FedAvg", "dirichlet-0.1"))
    assert fedavg["mean"] == pytest.approx(31.0) and fedavg["delta"] == pytest.approx(31.0 - 50.0)  # round 3
    rep = next(c for c in rendered if (c["method"], c["column"]) == ("Rep (per-client)", "dirichlet-0.1"))
    assert rep["paper_mean"] is None and rep["delta"] is None and rep["p_value"] is None
    assert rep["protocol_differs"].startswith("evaluation (ours: per_client, paper: global)")
    md = Path(paths["md"]).read_text()
    assert "| Rep (per-client) | 31.00 ± 1.00 | — | protocol differs: evaluation, round [1] | — | — |" in md


def test_cli_json(demo, capsys):
    from bench.cli import main

    papers, configs = demo
    assert main(["coverage", "--configs", str(configs), "--papers-root", str(papers), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["summary"]["demo"]["covered"] == 3 and len(out["cells"]) == 11


# ---- columns -----------------------------------------------------------------------------------
def test_every_partition_the_papers_print_is_a_column():
    parts = {c["partition"] for c in load_paper_numbers()}
    assert {"dirichlet-classwise", "natural", "none", "iid", "average", "lda-0.1", "shards-10"} <= parts
    for p in parts:
        assert parse_column(p).paper_partition == p
    assert parse_column("lda-0.3").partition == {"scheme": "lda", "args": {"beta": 0.3}}  # FedNTD's LDA
    assert parse_column("shards-5").partition == {"scheme": "shards", "args": {"shards_per_client": 5}}
    assert parse_column("dirichlet-classwise-0.5").partition == {"scheme": "dirichlet_missing", "args": {"beta": 0.5}}
    assert parse_column("average").derived and parse_column("natural").partition == {"scheme": "natural"}
    with pytest.raises(FedbenchError, match="Unknown column 'dirichlet'"):
        parse_column("dirichlet")


def table(raw: dict) -> TableSpec:
    return TableSpec.parse(raw, "t.yaml")


def test_betas_are_sugar_for_dirichlet_columns():
    spec = {"table": "t", "dataset": "d", "betas": [0.05, 0.1], "base": {"partition": {"scheme": "dirichlet"}},
            "seeds": [0], "rows": [{"label": "A", "method": {"name": "fedavg"}}]}
    cols = table_columns(TableSpec.parse(spec, "t.yaml"))
    assert [(c.id, c.paper_partition, c.label, c.partition) for c in cols] == [
        ("dirichlet-0.05", "dirichlet-0.05", "β=0.05", {"args": {"beta": 0.05}}),
        ("dirichlet-0.1", "dirichlet-0.1", "β=0.1", {"args": {"beta": 0.1}})]
    assert beta_column(0.5, "dirichlet_missing").paper_partition == "dirichlet-classwise"
    assert beta_column(1.0, "natural").paper_partition == "natural"
    with pytest.raises(FedbenchError, match="either 'columns' or 'betas'"):
        table_columns(TableSpec.parse({**spec, "columns": ["iid"]}, "t.yaml"))
    # a column's partition lands in its runs; the row's own partition comes last; the base's args reach the
    # columns whose scheme takes them (min_size: lda; shard_mode: shards), nothing else
    base = {"partition": {"scheme": "lda", "args": {"min_size": 4, "shard_mode": "per_class"}}}
    runs = plan_runs(table({"table": "t", "dataset": "digits", "columns": ["lda-0.3", "shards-5", "iid"], "seeds": [0],
                            "base": base,
                            "rows": [{"label": "A", "method": {"name": "fedavg"}},
                                     {"label": "B", "method": {"name": "fedavg"}, "partition": {"num_clients": 3}}]}))
    got = {(r.label, r.columns[0]): (r.cfg.partition.scheme, r.cfg.partition.args, r.cfg.partition.num_clients)
           for r in runs}
    assert got[("A", "lda-0.3")] == ("lda", {"beta": 0.3, "min_size": 4}, 10)
    assert got[("A", "shards-5")] == ("shards", {"shards_per_client": 5, "shard_mode": "per_class"}, 10)
    assert got[("B", "iid")] == ("iid", {}, 3)
    with pytest.raises(FedbenchError, match=r"base partition.args \['min_szie'\] is taken by none of the table's "
                                            r"partition schemes \(iid, lda, shards\)"):
        plan_runs(table({"table": "t", "dataset": "digits", "columns": ["lda-0.3", "shards-5", "iid"], "seeds": [0],
                         "base": {"partition": {"args": {"min_szie": 4}}},
                         "rows": [{"label": "A", "method": {"name": "fedavg"}}]}))


def test_identical_rows_share_one_run_and_rows_that_differ_get_their_own():
    from bench.scheduling.table_runner import distinct_runs

    rows = [{"label": "FedBM (VI)", "method": {"name": "fedavg"}}, {"label": "FedBM (IX)", "method": {"name": "fedavg"}}]
    runs = plan_runs(table({"table": "t", "dataset": "digits", "betas": [0.1], "seeds": [0, 1], "rows": rows}))
    assert len(runs) == 4 and len(distinct_runs(runs)) == 2
    rows[1]["fed"] = {"rounds": 7}  # differs in a result option only: its own record (issue 27), in one table
    runs = plan_runs(table({"table": "t", "dataset": "digits", "betas": [0.1], "seeds": [0], "rows": rows}))
    assert len(distinct_runs(runs)) == 2 and len({r.cfg.record_name() for r in runs}) == 2


# ---- round rules -------------------------------------------------------------------------------
HISTORY = [  # round 1 has the best val accuracy; round 2 the best val sum; round 3 the best test accuracy
    {"round": 0, "metrics": {"val/accuracy": 50, "val/precision": 50, "val/f1": 50, "val/auc": 50,
                             "test/accuracy": 40, "test/balanced_accuracy": 45}},
    {"round": 1, "metrics": {"val/accuracy": 70, "val/precision": 40, "val/f1": 40, "val/auc": 60,
                             "test/accuracy": 60, "test/balanced_accuracy": 50}},
    {"round": 2, "metrics": {"val/accuracy": 69, "val/precision": 69, "val/f1": 69, "val/auc": 80,
                             "test/accuracy": 55, "test/balanced_accuracy": 70}},
    {"round": 3, "metrics": {}},  # not evaluated
    {"round": 4, "metrics": {"val/accuracy": 20, "val/precision": 20, "val/f1": 20, "val/auc": 50,
                             "test/accuracy": 65, "test/balanced_accuracy": 30}},
]


@pytest.mark.parametrize("rule, round_, acc", [("best-val-acc", 1, 60), ("best-val-sum5", 2, 55),
                                               ("max-test-acc", 4, 65), ("max-test-bacc", 2, 55), ("final", 4, 65)])
def test_round_rules(rule, round_, acc):
    assert select_round(HISTORY, rule)["round"] == round_
    assert metric_at({"history": HISTORY}, "accuracy", rule) == acc


def test_round_rule_ties_and_missing_validation():
    tied = [{"round": r, "metrics": {"val/accuracy": 50, "test/accuracy": r}} for r in range(3)]
    assert select_round(tied, "best-val-acc")["round"] == 0  # the first best round, as FedBM's '>'
    per_client = [{"round": r, "metrics": {"test/accuracy": r}} for r in range(3)]
    assert select_round(per_client, "best-val-acc")["round"] == 2  # the record's own rule: final
    assert select_round(per_client, "best-val-sum5") is None  # never silently another rule
    with pytest.raises(FedbenchError, match="Unknown round rule"):
        select_round(HISTORY, "best")


# ---- like with like ----------------------------------------------------------------------------
PAPER_GLOBAL = {"eval": "global", "round": "best-val-sum5"}
PAPER_PER_CLIENT = {"eval": "per_client", "round": "max-test-bacc"}


@pytest.mark.parametrize("eval_", ["per_client", "local_mean"])
@pytest.mark.parametrize("rule", ["final", "max-test-bacc", "best-val-sum5"])
def test_a_client_row_never_gets_a_global_number(eval_, rule):
    assert protocol_difference(RowProtocol(eval_, rule, "fedrep"), PAPER_GLOBAL).startswith(
        f"evaluation (ours: {eval_}, paper: global)")


@pytest.mark.parametrize("eval_", ["global", "local_mean"])
def test_a_global_row_never_gets_a_per_client_number(eval_):
    assert protocol_difference(RowProtocol(eval_, "max-test-bacc", "fedavg"), PAPER_PER_CLIENT) \
        == f"evaluation (ours: {eval_}, paper: per_client)"


def test_round_and_model_facets():
    assert protocol_difference(RowProtocol("global", "best-val-sum5", "fedavg"), PAPER_GLOBAL) is None
    assert protocol_difference(RowProtocol("global", "best-val-acc", "fedavg"), PAPER_GLOBAL) \
        == "round (ours: best-val-acc, paper: best-val-sum5)"
    centralized = {"eval": "global", "round": "max-test-acc", "model": [], "model_note": "full CLIP fine-tuning"}
    assert protocol_difference(RowProtocol("global", "max-test-acc", "facmic"), centralized) \
        == "model (ours: facmic, paper: full CLIP fine-tuning)"
    assert protocol_difference(RowProtocol("global", "final", "clip-zs"), {"eval": "global", "round": "any"}) is None


def test_paper_configs_give_per_client_rows_no_global_number():
    """In every shipped config, a per-client or client-mean row never prints a number of a paper that
    scored a global model, and a global row never prints a per-client one."""
    from bench.reporting.paper_compare import match_table, row_protocols
    from bench.scheduling.table_runner import load_table_config
    from bench.tables.columns import table_columns

    checked = 0
    for path in sorted((REPO / "configs" / "tables").glob("*.yaml")):
        spec = load_table_config(str(path))
        runs = plan_runs(spec)
        protocols = row_protocols(spec, runs)
        for (label, _, _), matches in match_table(spec, runs, table_columns(spec)).items():
            for m in matches:
                if m.comparable:
                    assert m.cell["protocol"]["eval"] == protocols[label].eval, (path.name, label, m.source)
                    checked += 1
    assert checked > 300


# ---- fed.protocol: scoring a method another way ------------------------------------------------
def test_protocol_override_scores_the_global_model(tiny_cfg):
    """fed.protocol global: FedRep's global model is the averaged body with the initial head (FedETF's
    central model), FedRoD's is its generic head alone; such runs get their own record names."""
    import torch
    from conftest import run_in_process

    from bench.assembly.run_outputs import RunObserver
    from bench.engine.metrics import classification_metrics

    seen: dict = {}

    class Scored(RunObserver):  # what the module scored: as the round's evaluation left it
        def federation_built(self, federation) -> None:
            self.fed = federation

        def round_done(self, r: int) -> None:
            fed, m = self.fed, self.fed.module
            if fed.protocol != "global":
                return
            x, y = fed.test.to_float(torch.arange(len(fed.test.labels)))
            m.eval()
            with torch.no_grad():
                f = m.features(x)
                seen[m.registry_name] = {"state": {k: v.clone() for k, v in m.state_dict().items()},
                                         "scored": m.global_logits(x), "y": y, "head": m.head(f),
                                         "personal": m.eval_logits(x)}

    small = {"partition.num_clients": 4, "fed.rounds": 2, "fed.sample_ratio": 1.0}
    rep = tiny_cfg(**small, **{"method.name": "fedrep", "method.args": {"head_epochs": 1}, "fed.protocol": "global"})
    rec, final = run_in_process(rep, Scored())
    got = seen["fedrep"]
    assert rec["protocol"] == "global" and "@global" in rep.run_name()
    for k, v in final.items():  # the final state is the averaged body with the initial head
        assert torch.equal(got["state"][k], v), k
    scored = classification_metrics(torch.softmax(got["scored"], 1), got["y"], 10)
    assert rec["history"][-1]["metrics"]["test/accuracy"] == pytest.approx(scored["accuracy"])
    assert "val/accuracy" in rec["history"][-1]["metrics"]  # the global protocol validates too

    rec, _ = run_in_process(tiny_cfg(**small, **{"method.name": "fedrod", "fed.protocol": "global"}), Scored())
    got = seen["fedrod"]
    assert torch.equal(got["scored"], got["head"])  # the generic head alone
    assert not torch.allclose(got["scored"], got["personal"], atol=1e-3)  # not generic + personal
    scored = classification_metrics(torch.softmax(got["scored"], 1), got["y"], 10)
    assert rec["history"][-1]["metrics"]["test/accuracy"] == pytest.approx(scored["accuracy"])


def test_protocol_override_client_models_on_the_global_test_set(tiny_cfg):
    """fed.protocol local_mean on FedRep: each client's model (its own head) on the global test set. The
    scoring changes nothing in the training: the same final state as under fed.protocol global."""
    from conftest import max_state_diff, run_in_process

    small = {"partition.num_clients": 4, "fed.rounds": 2, "fed.sample_ratio": 1.0, "method.name": "fedrep",
             "method.args": {"head_epochs": 1}}
    per_client, _ = run_in_process(tiny_cfg(**small))
    mean, mean_state = run_in_process(tiny_cfg(**small, **{"fed.protocol": "local_mean"}))
    glob, glob_state = run_in_process(tiny_cfg(**small, **{"fed.protocol": "global"}))
    assert (per_client["protocol"], mean["protocol"], glob["protocol"]) == ("per_client", "local_mean", "global")
    last = mean["history"][-1]["metrics"]
    assert last["clients_evaluated"] == 4 and "val/accuracy" in last and "test/accuracy" in last
    assert "val/accuracy" not in per_client["history"][-1]["metrics"]  # own splits, no validation
    assert max_state_diff(mean_state, glob_state) == 0.0
    assert last["test/accuracy"] != glob["history"][-1]["metrics"]["test/accuracy"]


def test_protocol_per_client_scores_a_global_model_method_per_client(tiny_cfg, captured):
    """fed.protocol per_client on a global-model method (FedNPR's Table 3 protocol for FedAvg, FedProx,
    ...): each client's model right after its local training, on that client's own test split, mean
    over clients. Local's client models are its personal states, so its per-client score can be
    recomputed from them; in round 0 FedAvg's client models are Local's (same start, same batches),
    so their scores are equal; from round 1 FedAvg's clients start from the average and differ."""
    import torch
    from conftest import run_in_process

    from bench.engine.evaluation import predict_probs
    from bench.engine.federation import copy_into
    from bench.engine.metrics import classification_metrics

    small = {"partition.num_clients": 4, "fed.rounds": 2, "fed.sample_ratio": 1.0, "fed.protocol": "per_client"}
    local, _ = run_in_process(tiny_cfg(**small, **{"method.name": "local"}))
    fed = captured["fed"]
    want = []
    for c, split in enumerate(fed.clients):
        copy_into(fed.model_state, fed.client_states[c]["personal"])  # client c after its last local update
        probs = predict_probs(fed.module, fed.data, split.test, fed.fabric)
        want.append(classification_metrics(probs, fed.data.labels[split.test], 10)["balanced_accuracy"])
        assert not set(split.test.tolist()) & set(split.train.tolist())  # its own held-out samples
    last = local["history"][-1]["metrics"]
    assert last["clients_evaluated"] == 4 and "val/accuracy" not in last
    assert last["test/balanced_accuracy"] == pytest.approx(sum(want) / 4, abs=1e-9)

    avg, _ = run_in_process(tiny_cfg(**small, **{"method.name": "fedavg"}))
    assert avg["protocol"] == "per_client" and avg["run_name"].startswith("fedavg@per_client_")
    r0, r1 = (h["metrics"] for h in avg["history"])
    assert r0 == local["history"][0]["metrics"]  # round 0: the same client models
    assert r1["test/balanced_accuracy"] != last["test/balanced_accuracy"]  # round 1: started from the average
    assert torch.isfinite(torch.tensor(r1["test/auc"]))
