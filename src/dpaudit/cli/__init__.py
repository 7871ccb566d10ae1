"""The `dpaudit` command line: parse, call the library, render with rich. No logic lives here.

Start-up: typer turns every command function into a click command (signature inspection, string
annotations evaluated) before it parses anything: ~70 commands cost ~0.2 s. The light commands
(``--help``, ``--version``, ``account``, ``calibrate``, ``schedule``, ``ledger summary``) must start
in well under a second, so the root app is lazy (:class:`_RootTyper`): every command family is
imported at the top (the library behind them binds numpy, scipy and torch with
:func:`dpaudit.lazy.lazy_import`: none runs), but ``app(...)`` / ``dpaudit`` registers a family and
converts a command only when the command line names it (``--help`` converts the top-level commands only;
``ledger summary`` converts one ledger command). Anything that asks typer for the whole app
(``typer.main.get_command(app)``, ``CliRunner().invoke(app, ...)``, ``app.registered_commands``)
gets every family registered, exactly as before. tests/cli/test_cli_startup.py checks that both
paths expose the same commands, in the same order, with the same help.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import Any, Callable

from ..progress import heartbeat_from_launch


def _launch_heartbeat(argv: list[str]):
    """The ``dpaudit`` process's heartbeat, started before the imports below (1-3 s on a loaded
    machine), so that a long command's first line comes within 2 s of launch; None for
    ``--help`` / ``--version`` and where the command line is imported, not run: a test, a worker
    process (it runs the ``dpaudit`` script as ``__mp_main__``, with the coordinator's argv)."""
    words = argv[1:]
    script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    if os.path.basename(script) != "dpaudit" or not words or {"--help", "--version"} & set(words):
        return None
    return heartbeat_from_launch(f"dpaudit {words[0]}")


_LAUNCH_BEAT = _launch_heartbeat(sys.argv)

# after the heartbeat: typer and the command families take seconds to import
import typer  # noqa: E402

from .. import __version__  # noqa: E402
from . import accounting, audit, bundle, ledger, mixmin, report, sweep, train  # noqa: E402
from .common import LazyCommands, _fast_options, light_rich_help, new_app  # noqa: E402

#: Top-level command name -> the module of :mod:`dpaudit.cli` whose ``register(app)`` adds it, in
#: the order typer lists them (commands in registration order, then the groups). Every family
#: module is in here; the lazy root knows only these names, and tests/cli/test_cli_startup.py
#: fails while a family registers a name missing from it.
COMMAND_FAMILIES: dict[str, str] = {
    "account": "accounting",
    "calibrate": "accounting",
    "schedule": "accounting",
    "audit": "audit",
    "bundle": "bundle",
    "verify": "bundle",
    "report": "report",
    "sweep": "sweep",
    "train": "train",
    "ledger": "ledger",
    "mixmin": "mixmin",
}
#: The family modules in the order they register (the order of the commands in ``dpaudit --help``).
FAMILIES = {
    m.__name__.rsplit(".", 1)[1]: m
    for m in (accounting, train, ledger, audit, bundle, report, sweep, mixmin)
}
FAMILY_ORDER = tuple(FAMILIES)


def _command_name(info) -> str:
    return info.name or typer.main.get_command_name(info.callback.__name__)


def _lazy_group(group_info, **conv) -> Any:
    """The click group of a sub-app (``add_typer``) whose commands are converted on first use."""
    inst = group_info.typer_instance
    # sub-apps are added by name, never unnamed (typer would merge one into its parent):
    # tests/cli/test_cli_unrun_paths.py compares every lazy group with typer's own
    commands, groups = inst.registered_commands, inst.registered_groups
    inst.registered_commands, inst.registered_groups = [], []
    try:
        # the group itself: callback, help, options
        group = typer.main.get_group_from_info(group_info, **conv)
    finally:
        inst.registered_commands, inst.registered_groups = commands, groups
    group.commands = LazyCommands(_builders(commands, groups, **conv))
    return group


def _builders(commands, groups, **conv) -> dict[str, Callable[[], Any]]:
    """name -> zero-argument builder of its click command, in typer's order (commands, then groups;
    a later registration of a name replaces an earlier one, as in typer)."""
    out: dict[str, Callable[[], Any]] = {}
    for info in commands:
        out[_command_name(info)] = lambda info=info: typer.main.get_command_from_info(
            info,
            pretty_exceptions_short=conv["pretty_exceptions_short"],
            rich_markup_mode=conv["rich_markup_mode"],
        )
    for info in groups:
        out[typer.main.solve_typer_info_defaults(info).name] = lambda info=info: _lazy_group(
            info, **conv
        )
    return out


class _RootTyper(typer.Typer):
    """The root app; its command families register on first need (see the module docstring).

    ``registered_commands`` / ``registered_groups`` are what typer reads to build the whole app:
    reading them registers every family first, so the eager path is unchanged.
    """

    def __init__(self, *args, **kwargs) -> None:
        self._raw: dict[str, list] = {"registered_commands": [], "registered_groups": []}
        self._loaded: set[str] = set()
        self._registering = 0
        #: top-level name -> the family that registered it (checked against COMMAND_FAMILIES by the tests)
        self.registered_by: dict[str, str] = {}
        super().__init__(*args, **kwargs)

    def _lists(name: str):  # noqa: N805 - a property factory used in the class body
        def get(self):
            if not self._registering:
                self._load(FAMILY_ORDER)
            return self._raw[name]

        def set_(self, value) -> None:
            self._raw[name] = value

        return property(get, set_)

    registered_commands = _lists("registered_commands")
    registered_groups = _lists("registered_groups")
    del _lists

    def _load(self, families) -> None:
        """Register ``families`` (module names under dpaudit.cli) not yet registered, in FAMILY_ORDER."""
        for family in sorted(set(families) - self._loaded, key=FAMILY_ORDER.index):
            module = FAMILIES[family]
            before = {k: len(v) for k, v in self._raw.items()}
            self._registering += 1
            try:
                module.register(self)
            finally:
                self._registering -= 1
            self._loaded.add(family)
            for info in self._raw["registered_commands"][before["registered_commands"] :]:
                self.registered_by[_command_name(info)] = family
            for info in self._raw["registered_groups"][before["registered_groups"] :]:
                self.registered_by[typer.main.solve_typer_info_defaults(info).name] = family

    def _builders(self) -> dict[str, Callable[[], Any]]:
        """Builders of every command registered so far, with this app's conversion settings."""
        conv = {
            "pretty_exceptions_short": self.pretty_exceptions_short,
            "rich_markup_mode": self.rich_markup_mode,
            "suggest_commands": self.suggest_commands,
        }
        return _builders(self._raw["registered_commands"], self._raw["registered_groups"], **conv)

    def _build(self, name: str):
        self._load([COMMAND_FAMILIES[name]])
        return self._builders()[name]()

    def lazy_command(self):
        """The root click group; each top-level command is converted when it is first looked up."""
        shell = typer.Typer.__new__(typer.Typer)
        shell.__dict__.update(self.__dict__)
        # the callback (--version) and the group's settings only
        shell.registered_commands, shell.registered_groups = [], []
        group = _fast_options(typer.main.get_command(shell))
        group.commands = LazyCommands(
            {name: (lambda name=name: self._build(name)) for name in COMMAND_FAMILIES}
        )
        return group

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        argv = kwargs.get("args", args[0] if args else None)
        argv = sys.argv[1:] if argv is None else list(argv)
        if not argv or "--help" in argv:
            light_rich_help()  # help is rendered by typer's rich renderer: import it without its unused parts
        return self.lazy_command()(*args, **kwargs)


app = new_app(
    "dpaudit: train differentially private models, account for every release, audit them.",
    root=_RootTyper,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"dpaudit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Show the version and exit."
    ),
) -> None:
    """dpaudit: train DP models, keep a budget ledger, audit releases, write reviewer reports."""


def main() -> None:
    """The ``dpaudit`` entry point. After a command that ran torch or NumPy the process ends without the
    interpreter's teardown, which spends ~0.65 s in torch's finalisers and ~0.05 s freeing a training run's arrays
    (BENCHMARKS.md, whole command): every file and ledger write is committed before a command returns, so what
    remains are the exit handlers and the streams, run here."""
    try:
        app()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        if _LAUNCH_BEAT is not None:
            _LAUNCH_BEAT.end()  # a usage error ends before the command's heartbeat takes it over
    heavy = "torch._C" in sys.modules or "numpy" in sys.modules
    if not heavy or threading.active_count() > 1 or not isinstance(code, (int, type(None))):
        sys.exit(code)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)
