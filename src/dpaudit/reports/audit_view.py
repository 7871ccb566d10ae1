"""Typed readers of the audit records a report reads: :class:`AuditView` (audit.json), the
evidence blocks (``claimed_curve``, ``comparison``, ``statistic``) and one-run records (one_run.json).

Loader layer, tolerant as :mod:`.inputs` says: a block absent, malformed or of the wrong type reads
as None; nothing here recomputes a bound. :meth:`AuditView.read` views what the one reader of audit
records (:func:`dpaudit.audits.engine.read_record`: old layouts) returns, foreign key names
(:data:`KEY_ALIASES`) read as today's, so no report module reads raw keys or guesses key names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..audits.engine import read_record
from ..claims import integer, number as num
from ..grouped import Grouped

#: Keys a complete audit record should carry (missing ones are listed in an info note).
EXPECTED_AUDIT_KEYS = tuple(
    "mechanism canary runs claimed_epsilon delta epsilon_lower_bound confidence method counts "
    "ceiling controls".split()
)
#: Today's key -> the names older or foreign writers used for it (first non-null wins).
KEY_ALIASES = {
    "runs": ("trials", "n_runs", "n_trials"),
    "task": ("target",),
    "claimed_epsilon": ("epsilon",),
    "epsilon_lower_bound": ("eps_lb", "epsilon_lb"),
    "auc": ("roc_auc",),
    "seeds": ("seed",),
    "release_path": ("release",),
}
#: Names a control may go by (dict key, or a list item's name / kind) -> today's control.
CONTROL_NAMES = {"no_noise": ("no-noise", "nonoise", "no-dp", "non-private"), "null": ("null",)}
COUNT_KEYS = ("tp", "fp", "tn", "fn")


def _aliases(rec: dict, aliases: dict[str, tuple[str, ...]] = KEY_ALIASES) -> dict:
    """Migration ``key-aliases``: every alias renamed to today's key (today's wins when set)."""
    out = dict(rec)
    for key, olds in aliases.items():
        if out.get(key) is None:
            out[key] = next((rec[k] for k in olds if rec.get(k) is not None), out.get(key))
    return out


def counts_of(value: Any) -> dict | None:
    """EVAL counts {tp, fp, tn, fn} as non-negative ints, else None (never half-read)."""
    if not isinstance(value, dict):
        return None
    out = {k: integer(value.get(k)) for k in COUNT_KEYS}
    return None if any(v is None or v < 0 or v > 10**12 for v in out.values()) else out


def name_of(value: Any) -> str | None:
    if isinstance(value, dict):
        named = [value[k] for k in ("name", "kind", "type", "id") if value.get(k) is not None]
        return str((named[0] if named else None) or "unnamed")
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or None
    return None if value is None else str(value)


def _pairs_as_dict(roc: Any) -> Any:
    """A list of [fpr, tpr] pairs as {fpr: [...], tpr: [...]}; anything else unchanged."""
    if (
        isinstance(roc, list)
        and roc
        and all(isinstance(p, (list, tuple)) and len(p) >= 2 for p in roc)
    ):
        return {"fpr": [p[0] for p in roc], "tpr": [p[1] for p in roc]}
    return roc


def _rates(roc: dict) -> dict | None:
    fpr, tpr = roc.get("fpr"), roc.get("tpr")
    if not (isinstance(fpr, list) and isinstance(tpr, list) and len(fpr) == len(tpr) and fpr):
        return None
    try:
        rates = {"fpr": [float(x) for x in fpr], "tpr": [float(x) for x in tpr]}
    except (TypeError, ValueError):
        return {}
    return rates | {"auc": num(roc.get("auc"))}


def roc_of(roc: Any) -> dict | None:
    """ROC points as {fpr: [...], tpr: [...], auc} from a dict (with fpr / tpr, or points) or a list of [fpr, tpr] pairs."""
    roc = _pairs_as_dict(roc)
    if not isinstance(roc, dict):
        return None
    rates = _rates(roc)
    if rates is not None:
        return rates or None  # {}: lists that are not numbers
    inner = roc_of(roc["points"]) if isinstance(roc.get("points"), list) else None
    if inner is None or inner["auc"] is not None:
        return inner
    return {**inner, "auc": num(roc.get("auc"))}


def _control_items(controls: Any) -> list[tuple[str, Any]]:
    if isinstance(controls, dict):
        return list(controls.items())
    if isinstance(controls, list):
        return [
            (str(c.get("name") or c.get("kind") or i), c)
            for i, c in enumerate(controls)
            if isinstance(c, dict)
        ]
    return []


def control_of(controls: Any, names: tuple[str, ...]) -> dict | None:
    """The view of the first control whose name contains one of ``names``; a bare number is its eps_LB."""
    for key, value in _control_items(controls):
        if any(n in str(key).lower().replace("_", "-") for n in names):
            if not isinstance(value, dict):
                value = {"epsilon_lower_bound": num(value)} if num(value) is not None else None
            return None if value is None else _control_view(_aliases(value))
    return None


def _control_view(c: dict) -> dict:
    return {
        "epsilon_lower_bound": num(c.get("epsilon_lower_bound")),
        "auc": _auc(c.get("auc"), _dict(c.get("roc"))),
        "counts": counts_of(c.get("counts")),
        "ceiling": num(c.get("ceiling")),
    }


def _trials(runs: Any, counts: dict | None, eval_size: Any) -> tuple[int | None, int | None]:
    """(trials, EVAL trials): ``runs`` as a number or {total, eval}; EVAL else from eval_size or the counts."""
    if isinstance(runs, dict):  # e.g. {"total": 2000, "select": 1000, "eval": 1000}
        r = _aliases(runs, {"total": ("n", "runs"), "eval": ("evaluation",)})
        trials, eval_trials = integer(r.get("total")) or None, integer(r.get("eval"))
    else:
        trials, eval_trials = integer(runs), None
    if eval_trials is None:
        eval_trials = integer(eval_size)
    if eval_trials is None and counts is not None:
        eval_trials = sum(counts.values())
    return trials, eval_trials


def _release_ref(rec: dict) -> tuple[str | None, str | None]:
    """(release id, release path) the record names; an embedded {id, path} reference is read too."""
    rid, path = _str(rec.get("release_id")), rec.get("release_path")
    if isinstance(path, dict):
        rid, path = rid or path.get("id"), path.get("path")
    return rid, _str(path)


def _gdp(gdp: Any) -> float | None:
    """The GDP estimate's epsilon: a number, or an {epsilon} (older: {value}) block."""
    if isinstance(gdp, dict):
        gdp = _aliases(gdp, {"epsilon": ("value",)}).get("epsilon")
    return num(gdp)


def _auc(auc: Any, roc: dict | None) -> float | None:
    """The recorded AUC, else the ROC's (a view's or a record's block)."""
    return num(auc) if num(auc) is not None or roc is None else num(roc.get("auc"))


def power_of(block: Any) -> dict | None:
    """The power block (audit.json, one_run.json) when it carries the numbers the report shows, else
    None (read as "power: not recorded"); the ceiling may be null (a one-run PLD claim's is not
    searched)."""
    if not isinstance(block, dict) or integer(block.get("trials")) is None:
        return None
    if block.get("ceiling") is not None and num(block.get("ceiling")) is None:
        return None
    return block


def _role(role: Any) -> str:
    return role if isinstance(role, str) else ("main" if role is None else "unknown")


@dataclass(frozen=True)
class AuditOrigin:
    """What an audit record says it audited, how to re-create it and under which plan."""

    task: str | None
    dataset: str | None
    dataset_info: dict  # the record's dataset object ({} when it names the dataset only)
    seeds: Any
    command: str | list | None
    release_id: str | None
    release_path: str | None
    plan_id: str | None  # the pre-registered plan it ran under (dpaudit.audit_plans)
    config: dict | None
    parameters: dict  # the recorded audit parameters (:data:`AUDIT_PARAMETERS`) as written
    dpaudit_version: Any
    git_commit: Any


@dataclass(frozen=True)
class AuditKind:
    """A role, noise flag or insertion flag of the wrong type marks the record as not a plain
    private audit: it then supports no verdict (fail closed, never "no evidence")."""

    role: str
    noise: bool
    canary_inserted: bool


@dataclass(frozen=True)
class AuditEvidence:
    """The statistics besides eps_LB a report shows, and the controls' views."""

    method: str | None
    ceiling_source: str | None
    gdp_estimate: float | None
    direction: str
    roc: dict | None
    auc: float | None
    no_noise: dict | None
    null: dict | None
    statistic: str  # the one that decided eps_LB (:func:`statistic_of`)
    clopper_pearson_epsilon: float | None  # old Clopper-Pearson records: their eps_LB
    threat_model: str
    comparison: dict | None  # :func:`comparison_view`
    claimed_curve: dict | None  # :func:`curve_view`
    claimed_curve_malformed: bool  # a claimed_curve block is there but cannot be drawn


#: The view's names (of a string, or of a named object: :func:`name_of`).
VIEW_NAMES = ("mechanism", "canary", "task", "dataset", "method")
#: The view's numbers, read as they are recorded (absent or not a number: None).
VIEW_NUMBERS = ("claimed_epsilon", "delta", "epsilon_lower_bound", "confidence", "ceiling")
#: The audit parameters a report lists when an audit records no command.
AUDIT_PARAMETERS = ("canary", "runs", "confidence", "delta", "claimed_epsilon", "select_fraction")
AUDIT_PARAMETERS += ("task", "dataset")


@dataclass(frozen=True)
class AuditView(Grouped):
    """The fields of one audit record a report reads (absent or ill-typed values are None); the
    grouped ones read as attributes too (``view.roc``)."""

    GROUPS = {"origin": AuditOrigin, "kind": AuditKind, "evidence": AuditEvidence}

    id: str
    mechanism: str | None
    canary: str | None
    trials: int | None
    eval_trials: int | None
    claimed_epsilon: float | None
    delta: float | None
    epsilon_lower_bound: float | None
    confidence: float | None
    counts: dict | None
    ceiling: float | None
    adjacency: str | None
    origin: AuditOrigin
    kind: AuditKind
    evidence: AuditEvidence
    missing: list[str]  # expected keys the record (before migration) lacks
    epsilon_lower_bound_note: str | None
    power: dict | None = None  # audit.json "power" (dpaudit.audits.power; None in older files)
    sequential: dict | None = None  # a sequential audit's stop (None: fixed N)

    @classmethod
    def read(cls, record: dict) -> tuple[dict, AuditView]:
        """An audit record read once (:func:`~dpaudit.audits.engine.read_record`: today's layout,
        what the verdict functions of :mod:`dpaudit.audits.verdicts` take) and its typed view.

        Args:
            record: an audit.json dict of any version or writer (foreign key names, wrong types).

        Returns:
            (the record in today's layout, its view); nothing raises on a malformed record: an
            unreadable value reads as None, so the verdict it would decide is INCONCLUSIVE.
        """
        today = read_record(record)
        rec = _aliases(today)
        counts = counts_of(rec.get("counts"))
        trials, eval_trials = _trials(rec.get("runs"), counts, rec.get("eval_size"))
        roc = roc_of(rec.get("roc"))
        view = cls.of(
            id=str(rec["id"]) if isinstance(rec.get("id"), (str, int)) else "",
            **{k: name_of(rec.get(k)) for k in VIEW_NAMES},
            trials=trials,
            eval_trials=eval_trials,
            **{k: num(rec.get(k)) for k in VIEW_NUMBERS},
            counts=counts,
            ceiling_source="audit" if num(rec.get("ceiling")) is not None else None,
            gdp_estimate=_gdp(rec.get("gdp_estimate")),
            role=_role(rec.get("role")),
            noise=rec.get("noise", True) is True,
            canary_inserted=rec.get("canary_inserted", True) is True,
            direction="less" if rec.get("direction") == "less" else "greater",
            adjacency=_str(rec.get("adjacency")),
            roc=roc,
            auc=_auc(rec.get("auc"), roc),
            missing=[k for k in EXPECTED_AUDIT_KEYS if k not in record],
            epsilon_lower_bound_note=rec.get("epsilon_lower_bound_note"),
            power=power_of(rec.get("power")),
            sequential=_dict(rec.get("sequential")),
            parameters={k: today[k] for k in AUDIT_PARAMETERS if k in today},  # as written
            **_origin(rec),
            **_evidence(rec),
        )
        return today, view


def _origin(rec: dict) -> dict:
    """The view's origin fields of ``rec`` (migrated)."""
    release_id, release_path = _release_ref(rec)
    plan = rec.get("plan")
    plan_id = plan.get("id") if isinstance(plan, dict) else rec.get("plan_id")
    return {
        "dataset_info": _dict(rec.get("dataset")) or {},
        **{k: rec.get(k) for k in ("seeds", "dpaudit_version", "git_commit")},  # as recorded
        "command": rec["command"] if isinstance(rec.get("command"), (str, list)) else None,
        "release_id": release_id,
        "release_path": release_path,
        "plan_id": _str(plan_id),
        "config": _dict(rec.get("config")),
    }


def _evidence(rec: dict) -> dict:
    """The view's evidence fields of ``rec`` (migrated) besides the ROC."""
    statistic = statistic_of(rec)
    cp = num(rec.get("clopper_pearson_epsilon"))
    if cp is None and statistic == "clopper-pearson":
        cp = num(rec.get("epsilon_lower_bound"))  # before the claimed curve: eps_LB is the CP one
    curve, threat = curve_view(rec.get("claimed_curve")), _str(rec.get("threat_model"))
    return {
        **{k: control_of(rec.get("controls"), names) for k, names in CONTROL_NAMES.items()},
        "statistic": statistic,
        "clopper_pearson_epsilon": cp,
        "threat_model": "final-model" if threat is None else threat,
        "comparison": comparison_view(rec.get("comparison")),
        "claimed_curve": curve,
        "claimed_curve_malformed": curve is None and rec.get("claimed_curve") is not None,
    }


#: The statistics an audit.json may name as the one that decided its eps_LB.
STATISTICS = ("claimed-curve", "clopper-pearson")


def _floats(xs: Any) -> list[float] | None:
    if not isinstance(xs, list):
        return None
    out = [num(x) for x in xs]
    return None if any(v is None or math.isnan(v) for v in out) else out


def _pairs(d: Any) -> dict | None:
    """{"fpr": [...], "fnr": [...]} with equal-length float lists, values in [0, 1], else None."""
    if not isinstance(d, dict):
        return None
    fpr, fnr = _floats(d.get("fpr")), _floats(d.get("fnr"))
    if fpr is None or fnr is None or len(fpr) != len(fnr) or not fpr:
        return None
    return {"fpr": fpr, "fnr": fnr} if all(map(_unit, fpr + fnr)) else None


def _typed(kind: type):
    """The reader of a value of type ``kind``: the value itself, else None."""
    return lambda v: v if isinstance(v, kind) else None


_str, _dict, _bool = _typed(str), _typed(dict), _typed(bool)


def _unit(v: float | None) -> bool:
    return v is not None and 0.0 <= v <= 1.0


def _point(p: Any) -> dict | None:
    """The chosen test's point: fpr_upper and fnr_upper in [0, 1] (else None); fpr / fnr outside [0, 1] read as None."""
    p = _dict(p) or {}
    point = {k: num(p.get(k)) for k in ("fpr", "fnr", "fpr_upper", "fnr_upper")}
    if not (_unit(point["fpr_upper"]) and _unit(point["fnr_upper"])):
        return None
    return {k: v if k.endswith("_upper") or _unit(v) else None for k, v in point.items()}


#: The readers of a claimed_curve block's labels (what was tested, at which level, which way).
CURVE_LABELS = {
    "accountant": _str,
    "adjacency": _str,
    "delta": num,
    "confidence": num,
    "event": _dict,
    "direction": lambda v: v if v in ("greater", "less") else None,
}
#: The readers of its claim family (the parameter, its claimed value and its ruled-out bound).
CURVE_FAMILY = {"parameter": _str, "claimed": num, "lower_bound": num}


def curve_view(block: Any) -> dict | None:
    """A validated, plain copy of an audit.json ``claimed_curve`` block, or None when it cannot be drawn
    (absent, or without ``curve`` and ``point`` in [0, 1] and a boolean ``violated``: the report says so in
    a note instead of drawing a guess); everything else is optional and read leniently."""
    if not isinstance(block, dict):
        return None
    curve, point = _pairs(block.get("curve")), _point(block.get("point"))
    if curve is None or not isinstance(block.get("violated"), bool) or point is None:
        return None
    fam = _dict(block.get("family")) or {}
    return {
        "statistic": str(block.get("statistic") or "claimed-curve"),
        "method": _str(block.get("method")),
        "violated": block["violated"],
        # the epsilon of the claim-family member ruled out (older files: epsilon_lower_bound)
        "family_epsilon": num(block.get("family_epsilon", block.get("epsilon_lower_bound"))),
        "scale_lower_bound": num(block.get("scale_lower_bound")),
        "family": _read(fam, CURVE_FAMILY),
        **_read(block, CURVE_LABELS),
        "point": point,
        "points": _pairs(block.get("points")),
        "curve": curve,
        "curve_at_lower_bound": _pairs(block.get("curve_at_lower_bound")),
        "select_size": integer(block.get("select_size")),
        "eval_size": integer(block.get("eval_size")),
    }


def _read(block: dict, fields: dict) -> dict:
    """{key: reader(block[key])} for the ``fields`` (key -> reader) of a block, in their order."""
    return {k: read(block.get(k)) for k, read in fields.items()}


def _maybe(fields: dict, block: Any) -> dict | None:
    return _read(block, fields) if isinstance(block, dict) else None


#: The readers of the blocks of a one_run.json (``steinke``, ``fdp``) and of audit.json's ``comparison``.
STEINKE = dict.fromkeys(("epsilon_lower_bound", "ceiling"), num)
STEINKE |= dict.fromkeys(("guesses", "correct", "k_pos", "k_neg"), integer) | {"method": _str}
FDP = {"epsilon_lower_bound": num, "violated": _bool, "guesses": integer, "correct": integer}
FDP |= {"ceiling": num, "method": _str}


#: The readers of a one_run.json's own fields.
ONE_RUN = {"kind": name_of, "canaries": integer, "included": integer}
ONE_RUN |= dict.fromkeys(("claimed_epsilon", "delta", "confidence"), num)


def one_run_view(record: Any) -> dict | None:
    """The numbers of a one_run.json dict a reviewer reads (lenient; None when it is not one)."""
    if not isinstance(record, dict):
        return None
    st, fd = _maybe(STEINKE, record.get("steinke")), _maybe(FDP, record.get("fdp"))
    if st is None and fd is None:
        return None
    info = _dict(record.get("info")) or {}
    return {
        "mechanism": name_of(record.get("mechanism") or info.get("mechanism") or info.get("model")),
        **_read(record, ONE_RUN),
        "steinke": st,
        "fdp": fd,
        "power": power_of(record.get("power")),
    }


def statistic_of(record: dict) -> str:
    """The statistic that decided ``record``'s top-level eps_LB: its ``statistic`` field; an
    audit.json written before claimed-curve audits existed has none and means Clopper-Pearson."""
    s = record.get("statistic")
    return s if s in STATISTICS else ("clopper-pearson" if s is None else f"unknown ({s})")


def _interval(iv: Any) -> list | None:
    return [num(x) for x in iv] if isinstance(iv, list) and len(iv) == 2 else None


#: The readers of one point of the comparison block's ``tpr_at_fpr`` list.
TPR_AT_FPR = {"fpr": num, "tpr": num, "tpr_interval": _interval}


def _tpr_at_fpr(ts: Any) -> list[dict]:
    """The points of a ``tpr_at_fpr`` list that name their FPR."""
    points = [t for t in ts or [] if isinstance(t, dict) and num(t.get("fpr")) is not None]
    return [_read(t, TPR_AT_FPR) for t in points]


#: audit.json's ``comparison`` parts: a block's fields (key -> reader), or the reader of a list.
COMPARISON = {
    "cp_bonferroni": {"epsilon_lower_bound": num, "thresholds_tested": integer, "method": _str},
    "tpr_at_fpr": _tpr_at_fpr,
    "auroc": {"auc": num, "interval": _interval, "bootstrap": integer, "confidence": num},
    "gdp_estimate": {
        "kind": lambda _: "estimate (not a bound)",
        "epsilon": num,
        "mu": num,
        "epsilon_interval": _interval,
    },
}


def comparison_view(block: Any) -> dict | None:
    """The cross-tool statistics of audit.json's ``comparison`` block (each part None when absent)."""
    if not isinstance(block, dict):
        return None
    return {
        k: _maybe(read, block.get(k)) if isinstance(read, dict) else read(block.get(k))
        for k, read in COMPARISON.items()
    }


#: The readers of a white_box.json's main bound (:meth:`dpaudit.audits.white_box.StepBound.to_dict`;
#: an infinite eps_LB is stored as null).
WHITE_BOX = dict.fromkeys(("epsilon_lb", "claimed_epsilon", "delta", "confidence"), num)
WHITE_BOX |= {"accountant": _str, "violation": _bool}
WHITE_BOX |= dict.fromkeys(
    ("noise_multiplier_upper", "sensitivity_lower", "sample_rate_lower"), num
)
WHITE_BOX |= {"steps": integer, "observations": integer}


def white_box_view(record: Any) -> dict | None:
    """The numbers of a white_box.json a reviewer reads (lenient; None without a main bound)."""
    bounds = _dict(record.get("bounds")) if isinstance(record, dict) else None
    main = _maybe(WHITE_BOX, (bounds or {}).get("main"))
    if main is None:
        return None
    run = _dict((_dict(record.get("runs")) or {}).get("main")) or {}
    controls = _dict(record.get("controls_ok")) or {}
    return {
        "mechanism": name_of(run.get("model")),
        "dataset": name_of(run.get("dataset")),
        "threat_model": _str(record.get("threat_model") or bounds["main"].get("threat_model")),
        "canaries": integer(run.get("canaries")),
        **main,
        "controls_ok": {k: v for k, v in controls.items() if isinstance(v, bool)},
        "power": power_of(record.get("power")),
    }
