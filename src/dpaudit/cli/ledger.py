"""`dpaudit ledger ...`: read and extend the privacy budget ledger (thin: the ledger package computes, this prints)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from ..claims import verify_claim
from ..data import DATASETS
from ..errors import UsageError
from ..ledger import book, integrity, result_cache, signing, store_pg, text
from ..ledger.fingerprint import write_secret
from ..mechanisms.mixmin.tasks import TASKS, declared_rows
from ..records import read_release
from ..validation import open_unit, positive_finite
from . import options
from .common import console, emit_json, new_app, new_file, note, print_message, print_table

ledger_app = new_app("The privacy budget ledger: what each dataset has spent, by which releases.")
OWNER_HELP = "Key id (or public key) the ledger's owner must have; entries after its registration must be signed (default $DPAUDIT_LEDGER_OWNER)."


def _say(json_out: bool, obj, text: str) -> None:
    """``obj`` as JSON with ``--json``, else ``text`` (plain) for people."""
    if json_out:
        return emit_json(obj)
    print_message(text)


def _cap_rows(led, dataset: str, data_dir: Optional[Path]):
    """The rows a cap on ``dataset`` declares: a built-in dataset's or task's, read from its files
    (default split); None for another name with recorded entries (the ledger declares the rows they
    read). A name whose rows cannot be known is refused: its cap could not reach its people under
    other names."""
    if dataset in DATASETS or dataset in TASKS:
        return declared_rows(dataset, data_dir=data_dir)
    if not any(e.kind in ("release", "reservation", "audit") for e in led.entries(dataset=dataset)):
        raise UsageError(
            f"dataset must be a built-in dataset or task, or a name with entries in ledger "
            f"{led.path} (whose rows the cap then declares), got {dataset!r}: its rows cannot "
            "be known, so the cap could not cover its people under other names."
        )
    return None


def _sweep_of(entry) -> Optional[str]:
    """The sweep a release entry was recorded under (None: none)."""
    return (entry.payload.get("sweep") or {}).get("name")


def register(app: typer.Typer) -> None:
    @ledger_app.command("summary")
    def summary(
        dataset: Optional[str] = options.optional("--dataset", "Only this dataset."),
        sweep: Optional[str] = options.optional(
            "--sweep", "Compose only the releases recorded under this sweep."
        ),
        owner: Optional[str] = options.optional("--owner", OWNER_HELP),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Per dataset and partition: releases, composed epsilon (rdp, prv) at the cap's delta, naive sum, cap, remaining."""
        # prv answers of unchanged totals come from the on-disk cache (ledger/result_cache.py)
        with book.open_ledger(ledger, create=False, owner=owner) as led, result_cache.enabled():
            rows = led.summary(dataset, sweep=sweep, progress=not json_out)
            sealed = led.seal_status()
            path = str(led.path)
        if json_out:
            return emit_json({"ledger": path, "sweep": sweep, "rows": rows, "seal": sealed})
        if not rows:
            console.print(f"ledger {path}: no releases recorded.")
            return
        by_sweep = "" if sweep is None else f" by sweep {sweep}"
        t = Table(title=f"privacy budget spent{by_sweep} ({path})")
        for col in text.SUMMARY_COLUMNS:
            t.add_column(col, justify="left" if col == "partition" else "right", no_wrap=True)
        for cells in text.summary_table(rows):
            t.add_row(*cells)
        print_table(t)
        for line in text.summary_notes(rows) + text.seal_notes(sealed):
            print_message(line)
        console.print(text.SUMMARY_LEGEND, style="dim", highlight=False)

    @ledger_app.command("list")
    def list_(
        dataset: Optional[str] = options.optional("--dataset", "Only this dataset."),
        sweep: Optional[str] = options.optional(
            "--sweep", "Only the releases recorded under this sweep."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Every entry in append order (releases, voids, caps, partitions, reservations, data versions)."""
        with book.open_ledger(ledger, create=False) as led:
            es = led.entries(dataset=dataset)
            path = str(led.path)
            if sweep is not None:
                led.require_sweep(sweep)
                es = [e for e in es if e.kind == "release" and _sweep_of(e) == sweep]
        if json_out:
            return emit_json({"ledger": path, "entries": [e.to_dict() for e in es]})
        t = Table("#", "id", "time (UTC)", "kind", "what", title=f"ledger {path}")
        for e in es:
            t.add_row(str(e.seq), e.id[:12], e.created_at[:19], e.kind, escape(text.describe(e)))
        print_table(t)

    @ledger_app.command("show")
    def show(
        entry_id: str = typer.Argument(
            ..., metavar="ID", help="Entry id (or a unique prefix of >= 6 characters)."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """One entry with everything recorded about it."""
        with book.open_ledger(ledger, create=False) as led:
            d = led.get(entry_id).to_dict()
        if json_out:
            return emit_json(d)
        t = Table("field", "value", show_header=False)
        for k, v in d.items():
            t.add_row(k, escape(str(v)))
        console.print(t)

    @ledger_app.command("cap")
    def cap(
        dataset: str = options.required("--dataset", "Dataset name (as in release.json)."),
        eps: float = options.required("--eps", "Cap on the dataset's composed epsilon (> 0)."),
        delta: float = options.required("--delta", "The delta at which the cap holds, in (0, 1)."),
        include_audits: bool = typer.Option(
            True,
            "--include-audits/--exclude-audits",
            help="Count the audits that train on the dataset's private data too (default); --exclude-audits (recorded) counts releases only.",
        ),
        data_dir: Optional[Path] = options.optional(
            "--data-dir",
            "Where the dataset's files are (default $DPAUDIT_DATA_DIR). The cap declares the rows the "
            "dataset reads (another name: the rows its entries read), so it covers their people under "
            "every name.",
        ),
        key: Optional[str] = options.optional(
            "--key", "Your signing key (a signed ledger's caps are signed by its owner)."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Set a dataset's budget cap; later releases and audits that would exceed it are refused
        before they run (--exclude-audits: releases only)."""
        # checked before the dataset's rows are read (slow); Ledger.cap checks them again
        eps, delta = positive_finite("epsilon", eps), open_unit("delta", delta)
        with book.open_ledger(ledger, signing_key=key) as led:
            rows = _cap_rows(led, dataset, data_dir)
            eid = led.cap(dataset, eps, delta, include_audits=include_audits, data_rows=rows)
            audits = led.entries(dataset=dataset, kind="audit")
        unbounded = text.unbounded_audits(audits) if include_audits else []
        counts = (
            "releases and audits"
            if include_audits
            else "releases only (--exclude-audits: audits are shown, not counted)"
        )
        line = f"cap of {dataset}: epsilon {eps:g} at delta {delta:g}, counting {counts} (entry {eid})."
        if unbounded:
            line += (
                f" Its releases + audits total is already infinite: {unbounded[0]}; "
                "nothing is left under this cap until that audit is voided."
            )
        obj = dict(id=eid, dataset=dataset, epsilon=eps, delta=delta, include_audits=include_audits)
        _say(json_out, {**obj, "unbounded_audits": unbounded}, line)

    @ledger_app.command("seal")
    def seal(
        key: Optional[str] = options.optional("--key", "The owner's signing key (name or path)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Owner only: sign a checkpoint of the head, so any rewrite of the entries before it fails
        verify (publish the printed hash too)."""
        with book.open_ledger(ledger, signing_key=key, create=False) as led:
            out = led.seal()
        _say(
            json_out,
            {"ledger": str(led.path), **out},
            f"ledger {led.path} sealed through entry #{out['sealed_through']} "
            f"(seal entry #{out['seq']}, {out['id']}); "
            f"publish its hash to detect a truncation too: {out['hash']}",
        )

    @ledger_app.command("verify")
    def verify(
        anchor: Optional[str] = options.optional(
            "--anchor",
            "A head hash published earlier (`ledger head`): the chain must still contain it.",
        ),
        owner: Optional[str] = options.optional("--owner", OWNER_HELP),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Check the hash chain and every signature; names each edited, deleted, reordered or forged entry. Exit 1 if any."""
        with book.open_ledger(ledger, create=False) as led:
            rep = led.verify(anchor=anchor, owner=owner)
        if json_out:
            emit_json(rep.to_dict())
        elif rep.ok:
            print_message(str(rep))
        else:
            console.print(
                f"[bold red]ledger {escape(rep.path)} FAILED verification ({len(rep.problems)} problem(s)):[/]",
                highlight=False,
            )
            for p in rep.problems:
                print_message(f"  - {p.message}")
        if not rep.ok:
            raise typer.Exit(1)

    @ledger_app.command("void")
    def void(
        entry_id: str = typer.Argument(
            ..., metavar="ID", help="Release, or open reservation of a killed run, to withdraw."
        ),
        reason: str = options.required("--reason", "Why it is withdrawn (recorded)."),
        published: Optional[bool] = options.optional(
            "--published/--never-published",
            "Required: were the artefacts ever published? Published ones stay counted.",
        ),
        key: Optional[str] = options.optional(
            "--key", "Your signing key (a signed ledger's voids are signed by its owner)."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Withdraw a release recorded by mistake, or free the budget an interrupted run still holds
        (appends a void entry; nothing is deleted). Only never-published artefacts stop counting."""
        if published is None:
            raise UsageError(
                "void must state whether the artefacts were ever published, got neither --published nor --never-published."
            )
        with book.open_ledger(ledger, signing_key=key) as led:
            vid = led.void(entry_id, reason, published=published)
            target = led.get(vid).payload["target"]
            kind = led.get(target).kind
        counted = "its budget stays spent (published)" if published else "no longer counted"
        _say(
            json_out,
            dict(id=vid, target=target, kind=kind, reason=reason, artefacts_published=published),
            f"{kind} {target} voided (entry {vid}; {counted}).",
        )

    @ledger_app.command("declare-version")
    def declare_version(
        dataset: str = typer.Argument(
            ..., metavar="DATASET", help="Dataset name (as in release.json)."
        ),
        fingerprint: str = options.required(
            "--fingerprint", "The new data's keyed fingerprint, as printed by the refusal (64 hex)."
        ),
        reason: str = options.required(
            "--reason", "Why the data changed (recorded), e.g. 'new split seed 7'."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Accept other data under DATASET as a new version; releases on the versions compose sequentially."""
        with book.open_ledger(ledger) as led:
            eid = led.declare_version(dataset, fingerprint, reason)
            previous = led.get(eid).payload.get("previous", [])
        declared = dict(id=eid, dataset=dataset, fingerprint=fingerprint.strip().lower())
        _say(
            json_out,
            {**declared, "previous": previous, "reason": reason},
            f"{dataset}: data fingerprint {fingerprint.strip()[:12]} declared a new version (entry {eid}); "
            "its releases compose sequentially with the earlier versions'.",
        )

    @ledger_app.command("declare-partition")
    def declare_partition(
        dataset: str = options.required("--dataset", "Dataset name."),
        parent: str = options.required("--parent", "Partition being split, e.g. train."),
        child: List[str] = options.required(
            "--child", "A disjoint part (repeat), e.g. --child train/mix --child train/ft."
        ),
        declared_by: str = options.required(
            "--declared-by", "Mechanism or person that made the split disjoint."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Declare PARENT as the disjoint union of CHILDREN: releases on the children compose in parallel."""
        with book.open_ledger(ledger) as led:
            eid = led.declare_partition(dataset, parent, child, declared_by)
        _say(
            json_out,
            dict(id=eid, dataset=dataset, parent=parent, children=child, declared_by=declared_by),
            f"{dataset}:{parent} = "
            + " + ".join(f"{dataset}:{c}" for c in child)
            + f" (declared by {declared_by}; entry {eid}).",
        )

    @ledger_app.command("record")
    def record(
        release_path: Path = typer.Argument(
            ..., metavar="RELEASE", help="release.json (or the directory holding it)."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Append an existing release.json to the ledger (training commands do this themselves).

        Its claim is re-checked first (dpaudit.claims.verify_claim, the check `dpaudit report`
        shows): a claim that does not check out is named on stderr. The release is recorded all
        the same (it exists, so it spent budget); the ledger composes its stored events, not its
        claimed epsilon, and one whose steps differ from its accounted steps is recorded as
        uncertified (its dataset's budget is unbounded until the entry is voided)."""
        rel = read_release(release_path)
        art = release_path if release_path.is_dir() else release_path.parent
        check = verify_claim(rel)
        with book.open_ledger(ledger) as led:
            eid = led.record(rel, artefact_path=str(art.resolve()))
        if check.status == "mismatch":
            then = (
                "recorded as uncertified: its dataset's budget is unbounded until the entry is voided"
                if check.steps_reason
                else "recorded: the ledger composes its stored events, not its claimed epsilon"
            )
            note(f"warning: release {rel.id}: ACCOUNTING MISMATCH: {check.reason}; {then}.")
        elif check.status == "unverified":
            note(f"warning: release {rel.id}: claim not verified: {check.reason}.")
        _say(
            json_out,
            {"id": eid, "dataset": rel.dataset.get("name"), "partition": rel.partition},
            f"recorded release {eid} on {rel.dataset.get('name')}:{rel.partition}.",
        )

    @ledger_app.command("keygen")
    def keygen(
        name: str = typer.Option(
            "default",
            "--name",
            help="Key name: the private key becomes NAME.key in the key directory.",
        ),
        json_out: bool = options.json_out(),
    ):
        """Create your Ed25519 signing key pair (private key 0600 in $XDG_CONFIG_HOME/dpaudit/keys; never overwritten)."""
        k = signing.keygen(name)
        if json_out:
            public = dict(name=k.name, key_id=k.key_id, public_key=k.public_text)
            return emit_json({**public, "private_key_path": str(k.path)})
        lines = (
            f"signing key {k.name} created: {k.path} (mode 0600; keep it private).",
            f"key id {k.key_id}; public key (give it to the ledger's owner to register):",
        )
        for line in lines:
            console.print(line, highlight=False)
        console.print(k.public_text, highlight=False, soft_wrap=True)

    @ledger_app.command("head")
    def head(
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Print the current head hash to publish (check it later with `ledger verify --anchor HASH`)."""
        with book.open_ledger(ledger, create=False) as led:
            h = led.head()
        _say(json_out, h, h["hash"])

    @ledger_app.command("register-key")
    def register_key(
        public_key: Optional[str] = options.optional(
            "--public-key",
            "ed25519:BASE64 (printed by keygen) or a .pub file; default: your own key (the first one registered becomes the owner).",
        ),
        name: str = typer.Option("", "--name", help="Who the key belongs to (recorded)."),
        key: Optional[str] = options.optional(
            "--key", "Your signing key (name or path; default $DPAUDIT_SIGNING_KEY or 'default')."
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Register a public key in the ledger, in an entry signed by your (already registered) key."""
        with book.open_ledger(ledger, signing_key=key) as led:
            eid = led.register_key(public_key, name)
            ring = led.key_ring()
        k = next(k for k in ring.keys.values() if k.entry_id == eid)
        _say(
            json_out,
            dict(id=eid, key_id=k.key_id, name=k.name, role=k.role, registered_by=k.registered_by),
            f"key {k.key_id} ({k.name}) registered as {k.role} (entry {eid}).",
        )

    @ledger_app.command("require-signatures")
    def require_signatures(
        key: Optional[str] = options.optional("--key", "Your signing key (name or path)."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """From now on refuse unsigned writes (a signed policy entry; cannot be undone)."""
        with book.open_ledger(ledger, signing_key=key) as led:
            eid = led.require_signatures()
        _say(
            json_out,
            {"id": eid, "require_signatures": True},
            f"ledger now requires signed entries (policy entry {eid}).",
        )

    @ledger_app.command("grant")
    def grant(
        role: str = options.required(
            "--role",
            "PostgreSQL role (an analyst or a group) that may write: INSERT and SELECT only.",
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """PostgreSQL ledgers: let ROLE append and read (run as the ledger's owner role)."""
        with book.open_ledger(ledger) as led:
            if led.backend != "postgresql":
                raise UsageError(
                    f"ledger must be a postgresql:// ledger for grant, got {led.path}."
                )
            stmts = store_pg.grant_writer_sql(led.store.schema, role)
            for stmt in stmts:
                led.store.execute(stmt)
        _say(
            json_out,
            {"role": role, "granted": stmts},
            f"role {role} may now append to and read ledger {led.path} (no UPDATE, DELETE or DDL).",
        )

    @ledger_app.command("export")
    def export(
        out: Path = options.required(
            "--out",
            "JSON file to write (every entry verbatim, hashes, signatures; keep it private).",
        ),
        include_key: bool = typer.Option(
            False,
            "--include-key",
            help="Also write the fingerprint key (whoever holds it can test a candidate dataset against the ledger).",
        ),
        shareable: bool = typer.Option(
            False,
            "--shareable",
            help="Write the publishable form: no key, row sets withheld (their count is the private training count); `verify` checks its chain, `import` refuses it.",
        ),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Write the whole ledger to a file, to import it into another backend (verify must pass first)."""
        if shareable and include_key:
            raise UsageError("--shareable must be given without --include-key, got both.")
        new_file(out)  # an earlier export is never replaced
        with book.open_ledger(ledger, create=False) as led:
            dump = led.export_rows(include_key=include_key)
            dump = integrity.withhold_row_sets(dump) if shareable else dump
            src = str(led.path)
        # private data's history (and maybe the key): mode 0600 from its creation
        write_secret(out, json.dumps(dump).encode())
        keyed = "with" if include_key else "without (--include-key to carry it)"
        written = dict(ledger=src, out=str(out), entries=len(dump["rows"]))
        _say(
            json_out,
            {**written, "head_hash": dump["head_hash"], "fingerprint_key": include_key},
            f"exported {len(dump['rows'])} entries of {src} to {out} {keyed} the fingerprint key "
            f"(head {dump['head_hash'][:16]}).",
        )

    @ledger_app.command("import")
    def import_(
        source: Path = options.required("--from", "A file written by `ledger export`."),
        ledger: options.OptionalPath = options.ledger(),
        json_out: bool = options.json_out(),
    ):
        """Rebuild an exported ledger in an empty ledger (either backend); entries, hashes and signatures stay identical."""
        try:
            dump = json.loads(Path(source).read_text())
        except (OSError, ValueError) as e:
            raise UsageError(
                f"--from must be a file written by `dpaudit ledger export`, got {str(source)!r} ({e})."
            ) from None
        with book.open_ledger(ledger) as led:
            n = led.import_rows(dump)
            rep = led.verify()
        if json_out:
            emit_json({"ledger": rep.path, "entries": n, "head_hash": rep.head_hash, "ok": rep.ok})
        else:
            console.print(
                f"imported {n} entries into {rep.path}; verify: {'ok' if rep.ok else 'FAILED'} (head {rep.head_hash[:16]}).",
                highlight=False,
            )
            if not dump.get("fingerprint_key"):
                console.print(
                    "the export carries no fingerprint key: new releases will not match the stored data fingerprints "
                    "(export with --include-key to move it).",
                    highlight=False,
                )
        if not rep.ok:
            raise typer.Exit(1)

    app.add_typer(ledger_app, name="ledger")
