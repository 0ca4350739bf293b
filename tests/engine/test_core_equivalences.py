"""FedAvg with one client equals Central; a resumed run equals an uninterrupted one (issue 2, 2-3)."""

from conftest import kill_and_resume, max_state_diff, run_in_process


def test_fedavg_one_client_equals_central(tiny_cfg):
    common = {"partition.scheme": "iid", "partition.num_clients": 1, "fed.sample_ratio": 1.0, "fed.rounds": 1,
              "fed.local_epochs": 1}
    fed_rec, fed_state = run_in_process(tiny_cfg(**common, **{"method.name": "fedavg", "experiment": "fed"}))
    cen_rec, cen_state = run_in_process(tiny_cfg(**common, **{"method.name": "central", "experiment": "central"}))
    assert max_state_diff(fed_state, cen_state) == 0.0
    assert fed_rec["best"]["test/accuracy"] == cen_rec["best"]["test/accuracy"]
    # and the model did train (one epoch moves every conv weight)
    n, bs = fed_rec["splits"]["train"], 32
    assert fed_rec["history"][0]["samples_trained"] == n - (1 if n % bs == 1 else 0)


def test_resume_after_kill_equals_uninterrupted(tiny_cfg):
    base = {"fed.rounds": 4, "checkpoint_every": 1, "fed.keep_optimizer_state": True}
    resumed_rec, _ = kill_and_resume(tiny_cfg, base)  # stopped after round 2 of 4
    assert [h["round"] for h in resumed_rec["history"]] == [0, 1, 2, 3]
