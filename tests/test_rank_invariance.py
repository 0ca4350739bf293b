"""A run's result must not depend on how many ranks simulate it (issue 2, done-when 1)."""
import pytest
from conftest import load_final_state, max_state_diff, run_in_process, run_subprocess

pytestmark = pytest.mark.slow  # end-to-end: make test-fast leaves this file out


@pytest.mark.ddp
@pytest.mark.parametrize("method,args,backbone", [("fedavg", {}, "resnet18"), ("fedprox", {"mu": 0.01}, "simple-cnn")])
def test_two_ranks_equal_one_rank(tiny_cfg, method, args, backbone):
    """FedAvg on timm's ResNet-18 (the paper backbone); FedProx on the small CNN."""
    common = {"method.name": method, "method.args": args, "method.backbone": backbone}
    one = tiny_cfg(**common, experiment="one")
    two = tiny_cfg(**common, experiment="two", devices=2)
    record, state1 = run_in_process(one)
    run_subprocess(two)
    state2 = load_final_state(two)
    diff = max_state_diff(state1, state2)
    assert diff <= 1e-6, f"{method}: 1 vs 2 ranks differ by {diff}"
    # the run really trained: the global model moved away from its initialisation and learned something
    assert record["history"][-1]["metrics"]["test/accuracy"] > 30.0
    assert len(record["history"]) == 3 and all(len(h["clients"]) == 3 for h in record["history"])
