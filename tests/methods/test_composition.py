"""Methods compose instead of inheriting twice (issue 29.1): an algorithm takes its extra objective
terms (NPR) as parts, so no registered method has two project base classes, and a composed entry keeps
its host's federated shape and adds its terms' options and client state."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.assembly.validation import method_signature
from lightning_modules.base import METHODS, FederatedModule, compose
from lightning_modules.fedbabu import FedBABU
from lightning_modules.fednpr import NPRegulariser
from lightning_modules.fedrep import FedRep


def project_bases(cls: type) -> list[type]:
    return [b for b in cls.__bases__ if issubclass(b, FederatedModule)]


@pytest.mark.parametrize("name", METHODS.names())
def test_no_method_has_two_project_base_classes(name):
    cls = METHODS.get(name)
    for klass in cls.__mro__:
        if isinstance(klass, type) and issubclass(klass, FederatedModule):
            assert len(project_bases(klass)) <= 1, (name, klass, project_bases(klass))


def test_the_check_would_see_a_double_inheritance():
    class Twice(FedRep, FedBABU):
        pass

    assert project_bases(Twice) == [FedRep, FedBABU]


def test_a_composed_entry_is_its_algorithm_with_the_terms_options_and_state():
    cls = METHODS.get("fedrep-npr")
    assert cls.__bases__ == (FedRep,) and cls.objective_terms == (NPRegulariser,)
    assert cls.keeps_client_state and not FedRep.keeps_client_state  # NPR's prototypes live in ctx.state
    assert cls.personal_prefixes == ("head",) and cls.protocol == "per_client"
    assert {"head_epochs", "lam", "num_subclusters", "npr_variant"} <= set(method_signature(cls))
    assert method_signature(cls)["lam"].default == 0.1
    with pytest.raises(TypeError, match="lamda"):
        cls(num_classes=3, in_channels=1, backbone="simple-cnn", lamda=0.5)


def test_compose_adds_the_terms_to_the_algorithms_feature_loss():
    """A new pairing is one line: FedBABU + NPR built here equals the registered fedbabu-npr's loss."""
    mine = compose("MyBabuNPR", FedBABU, terms=(NPRegulariser,))
    torch.manual_seed(0)
    a = mine(num_classes=3, in_channels=1, backbone="simple-cnn", lam=0.0)
    assert a.terms["npr"].lam == 0.0 and a.terms["npr"].for_client(a, None) is None  # lam 0: term off
    assert mine.__doc__ == FedBABU.__doc__ and mine.__mro__[1] is FedBABU
    x, y = torch.randn(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    objective = a.feature_objective(None, a.feature_loss(None))
    assert torch.equal(objective((x, y)), F.cross_entropy(a(x), y))
