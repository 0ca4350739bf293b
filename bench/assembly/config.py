"""The options of one run, as dataclasses (jsonargparse turns them into --group.option flags)."""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from bench.core.paths import DEFAULT_CACHE_DIR

# field metadata of the options that say where/how a run executes, not what it computes: ignored
# when records and references are matched (result_config)
EXECUTION = {"execution": True}
# The precisions fedbench runs (RunConfig.precision lists Fabric's names; bench/assembly/validation.py rejects the
# others). Modules are moved with fabric.to_device, not wrapped by fabric.setup, so run_experiment applies
# the dtype itself: to the module's floating state and to the batches (64-true: machine-independent numbers).
# The dtypes by their torch names (``getattr(torch, name)``, bench/assembly/experiment.py): parsing a config imports no torch.
PRECISION_DTYPES = {"32-true": "float32", "64-true": "float64"}


@dataclass
class DataConfig:
    """Which dataset and how it is decoded."""

    name: str = "fashion-mnist"
    root: str | None = None  # default: the dataset's own default location
    image_size: int | None = None  # default: the dataset's default size
    max_train_samples: int | None = None  # class-stratified subset, for small budgets
    max_test_samples: int | None = None  # caps val and test alike
    val_fraction: float = 0.1  # carved from train when the dataset has no val split; 0: no validation split
    # (per-client protocol only, which never validates: clients then train on the whole train split)
    augment: Literal["none", "flip", "npr"] = "none"
    # a published client split (rsna-ich: FedNPR's ich_datasplit_10cl.npy): the train/test splits become the
    # file's, each sample's client its site (partition.scheme natural, fed.client_test site)
    client_split_file: str | None = None
    # transfer evaluation (FACMIC Table 5: trained on BT, tested on BT2): every image of ``test_dataset``
    # (its train, val and test splits) at ``test_root`` is the test set, the run's own test split becomes
    # the validation split (model selection); the classes must match (bench/assembly/run_data.setup_datamodule)
    test_dataset: str | None = None
    test_root: str | None = None
    # K-fold cross-validation (datamodules/folds.py): fold k (0..folds-1) of ``folds`` stratified folds over every
    # sample of the dataset is the test split, the other folds train (validation carved from them); None: the
    # dataset's own test split. Only for datasets without a fixed official test split, or that a paper cross-validates
    fold: int | None = None
    folds: int = 5
    cache_dir: str = field(default=DEFAULT_CACHE_DIR, metadata=EXECUTION)  # decoded datasets


@dataclass
class PartitionConfig:
    """How the training set is split into clients (datamodules/partition.py)."""

    # a scheme registered in datamodules/partitions/ (`fedbench list`): iid, dirichlet, dirichlet_missing, shards,
    # lda, proportions, natural, or one of your own (README, "Adding a partition scheme")
    scheme: str = "dirichlet"
    num_clients: int = 10
    # the scheme's own options, checked against it (`fedbench list` names them): dirichlet {beta, min_size},
    # dirichlet_missing {beta, min_size, missing_prob}, lda {beta (its alpha), min_size}, shards
    # {shards_per_client, shard_mode}, proportions {proportions}; iid and natural take none
    args: dict[str, Any] = field(default_factory=dict)

    def described_args(self) -> str:
        """The options given, for a title: ``beta=0.1 min_size=20`` ("" when none)."""
        return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.args.items())


# The partition options before they moved under partition.args (they were PartitionConfig's fields), at their
# defaults then. A run's name, result identity and result config are computed over this flat layout (result_config),
# so a record or reference made before the move keeps its name and compares equal to today's config; its
# identity too, unless its flat config carried an option its scheme does not read (a table's base shard_mode on
# its iid runs): such a run gets another identity, and its record is found under its bare name
# (bench/assembly/records.py find_record).
FLAT_PARTITION_DEFAULTS = {"beta": 0.5, "shards_per_client": 2, "min_size": 10, "missing_prob": 0.5,
                           "shard_mode": "sorted", "proportions": None}
# which of those options each built-in scheme reads (the flat layout carried the others along, unread: a table's
# base shard_mode reached its lda and iid runs too)
FLAT_OPTIONS_READ = {"iid": (), "natural": (), "dirichlet": ("beta", "min_size"), "lda": ("beta", "min_size"),
                     "dirichlet_missing": ("beta", "min_size", "missing_prob"), "proportions": ("proportions",),
                     "shards": ("shards_per_client", "shard_mode")}


def flat_partition(partition: dict[str, Any]) -> dict[str, Any]:
    """A partition mapping in the layout before ``partition.args``: scheme, num_clients and the old options at
    their old defaults with the args laid over them (a flat mapping, e.g. an old record's, is returned as is)."""
    if "args" not in partition:
        return dict(partition)
    rest = {k: v for k, v in partition.items() if k != "args"}
    args = partition["args"] if isinstance(partition["args"], dict) else {}
    # a whole number given for a float option (beta: 1) is the float the old field held (beta: 1.0)
    args = {k: float(v) if isinstance(FLAT_PARTITION_DEFAULTS.get(k), float) and type(v) is int else v
            for k, v in args.items()}
    return {**rest, **FLAT_PARTITION_DEFAULTS, **args}


def beta_text(beta: Any) -> str:
    """A concentration as names show it: ``0.05``, or one per class joined by ``-`` (``0.5-0.3-1``)."""
    return "-".join(f"{b:g}" for b in beta) if isinstance(beta, list | tuple) else f"{beta:g}"


def read_options_only(flat: dict[str, Any]) -> dict[str, Any]:
    """A flat partition mapping with the options its (built-in) scheme does not read at their old defaults: an
    old record whose iid run carried the table's ``shard_mode: per_class`` is the same run as today's, which
    carries no such option (a scheme of your own is returned as is)."""
    read = FLAT_OPTIONS_READ.get(flat.get("scheme"))
    if read is None:
        return flat
    return {k: FLAT_PARTITION_DEFAULTS[k] if k in FLAT_PARTITION_DEFAULTS and k not in read else v
            for k, v in flat.items()}


@dataclass
class FedConfig:
    """The federated protocol."""

    rounds: int = 10
    local_epochs: int = 1
    sample_ratio: float = 1.0  # share of clients sampled per round, in (0, 1]
    batch_size: int = 32
    lr_decay: float = 1.0  # lr multiplied by this every round (FedBM: 0.99)
    lr_milestones: list[int] = field(default_factory=list)  # rounds where lr is multiplied by lr_gamma
    lr_gamma: float = 0.1
    keep_optimizer_state: bool = False  # each client keeps its optimizer state (momentum) across rounds
    weighting: Literal["samples", "uniform"] = "samples"
    # per-client protocol: each client's own test split is "carved" (client_test_fraction of its training share,
    # stratified) or "site" (the dataset's test split samples of the client's site: natural partition, e.g.
    # FLamby's per-centre test folds of Fed-ISIC2019)
    client_test: Literal["carved", "site"] = "carved"
    client_test_fraction: float = 0.2
    eval_every: int = 1
    # which evaluated rounds also score the test set (global protocol): "all", or "val_improves": the
    # rounds whose validation metrics improve (by accuracy or FedBM's sum of five) and the final round,
    # which gives the same test metrics at the best-validation round and at the end, for less work
    test_rounds: Literal["all", "val_improves"] = "val_improves"
    # samples per evaluation batch; null: as many as fit 2M input values, 256..4096 (bench/engine/evaluation.py)
    eval_batch_size: int | None = field(default=None, metadata=EXECUTION)
    # what is evaluated (bench/tables/protocols.py): None = the method's own protocol; "global"
    # scores the global model (FedRep: averaged body + initial head; FedRoD: its generic head),
    # "per_client" each client's model on its own test split, "local_mean" each client's model on
    # the global test set
    protocol: Literal["global", "per_client", "local_mean"] | None = None


@dataclass
class MethodConfig:
    """The method and its local optimiser; ``args`` holds the method's own hyperparameters."""

    name: str = "fedavg"
    backbone: str = "resnet18"
    pretrained: bool = False
    optimizer: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    # how an ImageNet backbone takes 1-channel images: "sum" its stem's RGB kernels (a grey image replicated to
    # RGB gives the same activations), or "fresh": a newly initialised first conv of the same shape (PyTorch's
    # default init), as FedNPR's RSNA-ICH notebook does (lightning_modules/backbones.py)
    gray_stem: Literal["sum", "fresh"] = "sum"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunConfig:
    """One experiment: method x dataset x partition x seed."""

    data: DataConfig = field(default_factory=DataConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    fed: FedConfig = field(default_factory=FedConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    seed: int = 0
    experiment: str = "default"  # groups runs (a table), in records and W&B
    # ranks per node (torchrun's --nproc-per-node); "auto" (the CLI's default): one 1-thread rank per core on a
    # multi-core CPU (bench/assembly/workers.py)
    devices: int | Literal["auto"] = field(default=1, metadata=EXECUTION)
    num_nodes: int = field(default=1, metadata=EXECUTION)  # machines, launched by torchrun or SLURM (README)
    accelerator: Literal["auto", "cpu", "gpu", "cuda", "mps"] = field(default="auto", metadata=EXECUTION)
    precision: Literal["32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"] = "32-true"
    threads: int | None = field(default=None, metadata=EXECUTION)  # torch threads per rank (None: Lightning's)
    # CUDA float32: "strict" IEEE fp32 + deterministic cuDNN, "tf32" TF32 tensor cores + deterministic cuDNN,
    # or "fast" TF32 + cuDNN autotuning (bench/core/numerics.py; no effect on CPU numbers)
    gpu_math: Literal["strict", "tf32", "fast"] = "strict"
    # speed options (bench/assembly/speed_options.py): NHWC weights and image batches; torch.compile of the backbone.
    # Result options (not EXECUTION): both change the last bits (cuDNN/oneDNN pick other kernels for NHWC;
    # compile fuses kernels), so a run with either is its own result; at their defaults (off) they change
    # no identity, so records made before they counted keep theirs
    channels_last: bool = False
    compile: bool = False
    output_dir: str = field(default="results/runs", metadata=EXECUTION)
    checkpoint_dir: str = field(default="results/checkpoints", metadata=EXECUTION)
    checkpoint_every: int = field(default=0, metadata=EXECUTION)  # rounds; 0 = never
    # true: continue from the latest checkpoint of the same config; "force": despite a different one
    resume: bool | Literal["force"] = field(default=False, metadata=EXECUTION)
    # minutes a rank waits for the others at a round's collective before giving up
    timeout: float = field(default=10.0, metadata=EXECUTION)
    save_final_state: bool = field(default=False, metadata=EXECUTION)  # also write the final global state
    wandb: bool = field(default=False, metadata=EXECUTION)
    wandb_project: str = field(default="fedbench", metadata=EXECUTION)
    # per-round scalars also to TensorBoard (every run logs them to CSV; bench/assembly/run_outputs.py run_loggers)
    tensorboard: bool = field(default=False, metadata=EXECUTION)
    progress: bool = field(default=True, metadata=EXECUTION)

    def record_name(self) -> str:
        """The name of the run's record file: ``run_name`` and ``result_identity``, so that two
        configurations that differ in any result option (rounds, epochs, lr, sample caps, ...) never
        share a record. (``run_name``.json is a link to the latest record of that name.)"""
        return f"{self.run_name()}_{self.result_identity()}"

    def result_identity(self) -> str:
        """8 hex digits of the result options that differ from their defaults (execution options such
        as devices, threads or output paths do not count; an option added later at its default
        changes no identity)."""
        ours = json.loads(json.dumps(result_config(self.to_dict()), default=str))
        changed = json.dumps(non_default(ours, default_result_config()), sort_keys=True)
        return hashlib.sha1(changed.encode()).hexdigest()[:8]

    def run_name(self) -> str:
        """method[-options digest][@protocol]_data_partition_cN_sSEED[_foldKofN]: what the run is, at a glance
        (the budget is not in it: see ``record_name``)."""
        scheme, p = self.partition.scheme, flat_partition({"args": self.partition.args})
        beta = beta_text(p["beta"])
        part = {"dirichlet": f"dir{beta}", "dirichlet_missing": f"dirmiss{beta}", "lda": f"lda{beta}",
                "shards": f"shards{p['shards_per_client']}" + ("pc" if p["shard_mode"] == "per_class" else "")}
        if scheme == "proportions":
            shares = json.dumps(p["proportions"], default=str).encode()
            part["proportions"] = f"prop{hashlib.sha1(shares).hexdigest()[:6]}"
        method = self.method.name
        if self.method.args:  # rows of one method with different options must not share a record
            digest = hashlib.sha1(json.dumps(self.method.args, sort_keys=True, default=str).encode()).hexdigest()
            method += f"-{digest[:8]}"
        if self.fed.protocol:  # the same training scored another way is another record
            method += f"@{self.fed.protocol}"
        data = self.data.name + (f"-on-{self.data.test_dataset}" if self.data.test_dataset else "")
        fold = "" if self.data.fold is None else f"_fold{self.data.fold}of{self.data.folds}"
        return f"{method}_{data}_{part.get(scheme, scheme)}_c{self.partition.num_clients}_s{self.seed}{fold}"

    def scored_protocol(self, method_protocol: str, runs_centrally: bool) -> str:
        """What the run is scored on (the one rule; bench/tables/protocols.py explains the protocols): the
        global model for a method trained centrally; else ``fed.protocol`` when set, else the method's own."""
        return "global" if runs_centrally else self.fed.protocol or method_protocol

    def to_dict(self) -> dict[str, Any]:
        """``dataclasses.asdict(self)``, for the shape a RunConfig has (option groups of plain values), in a
        fraction of its time (a table plan computes thousands of record names)."""
        return {f.name: _plain(getattr(self, f.name)) for f in _FIELDS[RunConfig]}


def _plain(value: Any) -> Any:
    """What ``dataclasses.asdict`` makes of a field value: dataclasses as dicts, containers rebuilt."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in _FIELDS.get(type(value)) or dataclasses.fields(value)}
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_plain(v) for v in value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)


# RunConfig's option groups (--data.*, --partition.*, ...) and its top-level options, from the dataclasses
OPTION_GROUPS: dict[str, type] = {name: typ for name, typ in typing.get_type_hints(RunConfig).items()
                                  if dataclasses.is_dataclass(typ)}
TOP_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(RunConfig) if f.name not in OPTION_GROUPS)
_FIELDS = {cls: dataclasses.fields(cls) for cls in (RunConfig, *OPTION_GROUPS.values())}


@functools.cache
def execution_keys(cls: type) -> frozenset[str]:
    """The fields of a config dataclass marked with EXECUTION metadata (cached: result_config asks for them
    for every key of every planned run)."""
    return frozenset({f.name for f in dataclasses.fields(cls) if f.metadata.get("execution")})


def from_dict(d: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from nested dicts (records, tables); unknown keys are an error."""
    kwargs = {}
    for key, value in d.items():
        if key in OPTION_GROUPS:
            kwargs[key] = OPTION_GROUPS[key](**value)
        else:
            kwargs[key] = value
    return RunConfig(**kwargs)


def result_config(d: dict[str, Any]) -> dict[str, Any]:
    """The part of a config dict that determines a run's numbers: without the EXECUTION fields, except
    ``threads`` when it is neither unset nor 1 (torch threads per rank change the last bits of float
    sums, so a run with 2 threads is not the same result as one with 1; bench/assembly/workers.py rank_threads).
    The partition is in its flat layout (``flat_partition``): records, references and result identities made
    before ``partition.args`` hold it so, and ``min_size: 10`` given or left at its default is the same run;
    options its scheme does not read count at their defaults (``read_options_only``)."""
    out, execution = {}, execution_keys(RunConfig)
    for key, value in d.items():
        if key == "threads" and value not in (None, 1):
            out[key] = value
            continue
        if key in execution:
            continue
        if key in OPTION_GROUPS and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in execution_keys(OPTION_GROUPS[key])}
        out[key] = read_options_only(flat_partition(value)) if key == "partition" and isinstance(value, dict) else value
    return out


@functools.cache
def default_result_config() -> dict[str, Any]:
    """``result_config`` of the default RunConfig as JSON holds it (computed once; read, never changed)."""
    return json.loads(json.dumps(result_config(RunConfig().to_dict()), default=str))


def non_default(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``values`` that differ from ``defaults`` (nested dicts compared key by key)."""
    out = {}
    for key, value in values.items():
        default = defaults.get(key)
        if isinstance(value, dict) and isinstance(default, dict) and default:
            sub = non_default(value, default)
            if sub:
                out[key] = sub
        elif value != default or key not in defaults:
            out[key] = value
    return out


def canonical(obj: Any) -> Any:
    """``obj`` as a JSON file holds it (tuples as lists, keys as strings): configs compare equal to
    the ones read back from records and references (those through ``with_defaults``)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def with_defaults(config: Any) -> Any:
    """A config read back from a record or reference (its result-config or the whole of it), with the
    result options added to RunConfig since it was written at their defaults: a new option at its
    default changes no number; any other difference still counts. Non-mappings are returned as is."""
    if not isinstance(config, dict):
        return config

    def fill(defaults: dict, stored: dict) -> dict:
        out = dict(stored)
        for k, v in defaults.items():
            if k not in out:
                out[k] = v
            elif isinstance(v, dict) and isinstance(out[k], dict) and k != "args":
                out[k] = fill(v, out[k])
        return out

    return fill(result_config(RunConfig().to_dict()), config)
