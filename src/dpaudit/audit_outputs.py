"""What an audit may publish, and what stays with the operator.

An audit runs the mechanism many times on the private data, so everything it computes is a function of that data, and the
release's DP claim covers none of it. As a release does with ``local.json`` (:mod:`dpaudit.records`), an audit therefore writes
two files:

- ``audit.json`` / ``one_run.json`` (shareable): the claim, the statistic, the counts and rates (TP/FP/TN/FN, Clopper-Pearson
  bounds, ROC and empirical (FPR, FNR) points: ranks, never score values), the bounds and the ceiling, the verdict inputs and the
  public configuration;
- ``audit_local.json`` / ``one_run_local.json`` (NOT for publication), beside ``scores.npz``: every value in score units
  (thresholds), the data-derived canary choices (a head weight on an input feature that is zero in every training record, how many
  such features there are, labels and features of held-out records, the data's input box, DP-MixMin's canary direction), the
  non-private reference optimum (DP-MixMin's ``reference_weights``), a reproducible noise seed and the exact timings (the
  published ones are rounded as a release's are).

The split is a rule on keys (:func:`split_audit`, :func:`split_one_run`): canary descriptions and one-run ``info`` keep only the
keys listed as public here (an unknown key stays local: fail closed); everything else is removed at the listed paths. Reports read
only the shareable part, and :func:`shareable_audit` / :func:`shareable_one_run` strip the private keys from an old file that
still carries them (the report never re-publishes them). Module without heavy imports: the reports use it."""

from __future__ import annotations

import copy

from .records import round_timings

AUDIT_LOCAL_FILE = "audit_local.json"
ONE_RUN_LOCAL_FILE = "one_run_local.json"
NOT_FOR_PUBLICATION = (
    "local facts of this audit: functions of the private data (scores, data-derived canary choices, reference "
    "optima, exact timings) outside every DP guarantee; never publish this file or scores.npz"
)
#: The sentence every report carries beside audit results.
NOT_COVERED = (
    "Audit results are computed on the private data (every trial trains on it) and are not covered by the release's "
    "privacy claim; only the shareable audit.json / one_run.json is read here."
)

#: Canary description keys that are public (fixed by the public seed and public sizes): kind, norm, privacy unit and record count,
#: indices drawn from the public seed, and fixed wording.
PUBLIC_CANARY_KEYS = tuple(
    "kind norm unit records test_index holdout_index replaced_test_index user_contribution".split()
)
#: Paths (tuples of keys) of an audit record (and of each control) that are private.
LOCAL_AUDIT_PATHS = (
    ("threshold",),
    ("claimed_curve", "threshold"),
    ("comparison", "cp_bonferroni", "threshold"),
    ("config", "reference_weights"),
    ("seeds", "noise", "seed"),
    ("scores_file",),
    # the private training counts (records, users, D_mix): the public reference size N0 stands for them
    *(("config", key) for key in ("n_train", "n_users", "n_mix")),
    # a user-level audit's user counts (users, records, records per user)
    ("config", "users"),
)
#: One-run ``info`` keys that are public; the others (coordinates found from the data, counts of dead features, labels of held-out
#: records, the exact training count ``n_train`` and unit count ``n_units``) stay local.
PUBLIC_ONE_RUN_INFO = tuple(
    """model dataset reference_size canaries unit sample_rate steps normalizer clipping_norm
    noise_multiplier noise noise_on seed canary score kind dp_sgd tensors choice quiet_rule
    records rows test_indices steps_executed integration max_grad_norm injection""".split()
)


def _pop_path(d: dict, path: tuple, local: dict) -> None:
    """Move ``d[path]`` (if present) to the same path in ``local``. Each dict on the way is replaced
    in its parent by a shallow copy first: the dicts ``d`` shares with the caller's record stay as
    they are."""
    node = d
    for k in path[:-1]:
        if not isinstance(node.get(k), dict):
            return
        node[k] = node = dict(node[k])
    if path[-1] not in node:
        return
    value = node.pop(path[-1])
    dst = local
    for k in path[:-1]:
        dst = dst.setdefault(k, {})
    dst[path[-1]] = value


def _keep(d: dict, key: str, public: tuple, local: dict) -> None:
    """Keep only the ``public`` keys of the dict ``d[key]``; the rest goes to ``local[key]``."""
    block = d.get(key)
    if not isinstance(block, dict):
        return
    private = {k: v for k, v in block.items() if k not in public}
    if private:
        d[key] = {k: v for k, v in block.items() if k in public}
        local[key] = private


def split_audit(record: dict) -> tuple[dict, dict]:
    """(shareable, local) parts of an audit.json dict (controls split the same way, under
    ``controls`` in both). ``record`` is not changed. Only the dicts on the paths split off are
    copied, so the parts share the other values with ``record`` (a 100,000-trial record is never
    deep-copied): treat all three as read-only below their top level."""
    public, local = _split(record, LOCAL_AUDIT_PATHS, "canary_info", PUBLIC_CANARY_KEYS)
    controls = public.get("controls")
    if isinstance(controls, dict):
        public["controls"] = dict(controls)
        # a malformed record is split as far as it goes (reports stay tolerant)
        for role, ctl in controls.items():
            if isinstance(ctl, dict):
                public["controls"][role], ctl_local = split_audit(ctl)
                if ctl_local:
                    local.setdefault("controls", {})[role] = ctl_local
    return public, local


def split_one_run(record: dict) -> tuple[dict, dict]:
    """(shareable, local) parts of a one_run.json dict; ``record`` is not changed (values shared
    with it as in :func:`split_audit`)."""
    return _split(record, (), "info", PUBLIC_ONE_RUN_INFO)


def _split(record: dict, local_paths: tuple, described: str, public_keys: tuple) -> tuple:
    """(shareable, local) of one record (not its controls): the ``local_paths`` moved off, the
    ``described`` block kept to its ``public_keys``, the timings rounded."""
    public, local = dict(record), {}
    for path in local_paths:
        _pop_path(public, path, local)
    _keep(public, described, public_keys, local)
    if isinstance(public.get("timings"), dict) and public["timings"]:
        local["timings"] = public["timings"]
        public["timings"] = round_timings(public["timings"])
    return public, local


def shareable_audit(record: dict) -> dict:
    """An audit record with every private key removed (old files may still carry them)."""
    return split_audit(record)[0]


def shareable_one_run(record: dict) -> dict:
    return split_one_run(record)[0]


def merge_local(public: dict, local: dict) -> dict:
    """The full record: ``public`` with the ``local`` parts put back (recursively)."""
    out = copy.deepcopy(public)
    for k, v in (local or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_local(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def local_document(record_id, local: dict, *, key: str = "audit_id") -> dict:
    """What is written to the local file: the record's id, the warning, the private parts."""
    return {key: record_id, "not_for_publication": NOT_FOR_PUBLICATION, **local}


# ------------------------------------------------------------------------------ what may depend on the private data

#: Files every command writes for the operator only (never shareable); every other file it writes is shareable.
LOCAL_FILES = ("local.json", AUDIT_LOCAL_FILE, ONE_RUN_LOCAL_FILE, "scores.npz", "plan.local.json")
#: Shareable document kind of each file name (anything else: its name).
DOCUMENT_KINDS = {f"{kind}.json": kind for kind in ("release", "audit", "plan", "bundle", "report")}
DOCUMENT_KINDS.update({"one_run.json": "one-run", "ledger.json": "ledger-export"})
#: Per shareable document kind, the field paths (``*``: any key or position) that are the mechanism's output: the only
#: fields whose value may depend on the private data (tests/test_neighbour_diff.py diffs every shareable file of every
#: command on neighbouring datasets against this). A release publishes its noisy model and what is computed from it on
#: public data; an audit's results are computed on the private data by design (:data:`NOT_COVERED`) and are declared here
#: so that nothing else of it may be.
#: Rounded timings (0.1 s) are declared too: wall-clock readings of the run, mostly machine load, but also of the realised
#: batches, so of the data; they are outside the DP claim, published rounded only, and exact in the local files.
#: An audit's results: statistics of its trials' scores (counts, bounds, curves, estimates).
_RESULT_KEYS = """epsilon_lower_bound epsilon_lower_bound_note clopper_pearson_epsilon
    select_epsilon direction counts fpr_upper fnr_upper ceiling underpowered roc auc gdp_estimate
    general_bound comparison""".split()
AUDIT_RESULTS: tuple[tuple, ...] = (
    *((key,) for key in _RESULT_KEYS),
    ("claimed_curve", "counts"),
    ("claimed_curve", "point"),
    ("claimed_curve", "points"),
    *(
        ("claim_family_bound", k)
        for k in ("ruled_out_from", "scale_lower_bound", "family_epsilon", "violated", "statement")
    ),
)
MECHANISM_OUTPUT: dict[str, tuple[tuple, ...]] = {
    "release": (("metrics",), ("timings",)),
    "audit": (("timings",), *AUDIT_RESULTS, *(("controls", "*", *p) for p in AUDIT_RESULTS)),
    "one-run": (("timings",),),
    "tradeoff.png": ((),),  # the plot of an audit's results
    "artefact": ((),),  # the files a release lists under ``artefacts``: the noisy model itself
}


def document_kind(relative_path: str) -> str:
    name = relative_path.rsplit("/", 1)[-1]
    return DOCUMENT_KINDS.get(name, name)


def _matches(pattern: tuple, path: tuple) -> bool:
    return len(path) >= len(pattern) and all(p == "*" or p == k for p, k in zip(pattern, path))


def is_mechanism_output(kind: str, path: tuple) -> bool:
    """Whether the field at ``path`` of a ``kind`` document is declared mechanism output (or lies under one)."""
    return any(_matches(p, tuple(path)) for p in MECHANISM_OUTPUT.get(kind, ()))
