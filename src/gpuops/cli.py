"""The `gpuops` command line: argument parsing only.

Each subcommand lives in its own module under ``gpuops.commands`` and is imported only when it is
invoked, so ``gpuops --help`` and ``gpuops inspect`` do not pay for fabric, jinja2, matplotlib, ...
"""

from __future__ import annotations

import importlib
import sys

import click

from gpuops import process_gc

# name -> (module:attribute of the click command, one-line help shown by `gpuops --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("gpuops.commands.inspect:inspect", "Facts and capability gates of every host."),
    "apply": ("gpuops.commands.apply:apply", "Run a role: plan, diff, change, restart, verify."),
    "rollback": ("gpuops.commands.apply:rollback", "Undo the most recent (or a named) apply run."),
    "history": ("gpuops.commands.apply:history", "List apply runs from the hosts' journals."),
    "bench": ("gpuops.commands.bench:bench", "Benchmark on the host and bring the results home."),
    "results": ("gpuops.commands.bench:results", "List, show and compare stored results."),
    "report": ("gpuops.commands.bench:report", "Write an HTML report with plots of results."),
    "profile": ("gpuops.commands.profile:profile", "Where a forward pass's time goes, from SGLang's own profiler."),
    "advise": ("gpuops.commands.advise:advise", "Rank the ways to cut each host's all-reduce cost, with evidence."),
    "tune": ("gpuops.commands.tune:tune", "Sweep NCCL variants safely, benchmark and rank them."),
    "lab": ("gpuops.commands.lab:lab", "Throwaway simulated GPU hosts on loopback to rehearse on."),
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module_name, attr = target[0].split(":")
        with process_gc.loading_modules(module_name):
            module = importlib.import_module(module_name)
        return getattr(module, attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Show the short help without importing every command module.
        with formatter.section("Commands"):
            formatter.write_dl([(name, short) for name, (_, short) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]},
             epilog="User guide: README.md and its pages in docs/ (installed as gpuops/data/docs/).")
@click.version_option(package_name="gpuops")
def cli() -> None:
    """gpuops: inspect, tune and benchmark GPU inference hosts that serve models with SGLang.

    Hosts come from an Ansible-compatible inventory (-i); with none, the local machine.
    """
    from gpuops.output import guard_standard_streams

    guard_standard_streams()  # whatever prints, a host's text never reaches the terminal raw


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line on stderr and exit status 2; SIGTERM and
    SIGHUP end it as Ctrl-C does (``termination.py``)."""
    from gpuops import termination

    process_gc.for_this_command()
    previous = termination.install()
    try:
        _main(argv)
    finally:
        termination.restore(previous)
        _freeze_objects()


def _main(argv: list[str] | None) -> None:
    from gpuops import termination
    from gpuops.errors import GpuopsError

    try:
        cli.main(args=argv, prog_name="gpuops", standalone_mode=False)
    except click.exceptions.Abort:
        _say_open_runs()
        _say("gpuops: aborted" if termination.received() is None else termination.ending_line())
        sys.exit(termination.exit_status())
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except GpuopsError as exc:
        click.echo(f"gpuops: error: {exc}", err=True)
        sys.exit(exc.exit_status)
    except KeyboardInterrupt:
        _say_open_runs()
        _say(termination.ending_line())
        sys.exit(termination.exit_status())
    except SystemExit as exc:
        if termination.received() is not None:  # the command wrapped up after SIGTERM/SIGHUP (tune, bench)
            _say(termination.ending_line())
            sys.exit(termination.exit_status())
        raise exc
    else:
        sys.exit(termination.exit_status() if termination.received() is not None else 0)


def _freeze_objects() -> None:
    """Let the interpreter's shutdown skip the cycle collector's walks over every object the
    command imported (fabric, paramiko, cryptography, jinja2: ~45k): measured ~0.2 s of CPU per
    command, a fifth of a lab `apply`. Streams are still flushed and atexit handlers still run."""
    import gc

    gc.freeze()


def _say_open_runs() -> None:
    """On Ctrl-C (or SIGTERM, SIGHUP) during apply/rollback: per host, its run, what it does now, how
    to check. A second one while these lines print ends the process at once, printing them again."""
    inflight = sys.modules.get("gpuops.apply.inflight")  # loaded only by a command that opened a run
    if inflight is None:
        return
    from gpuops import termination

    lines = inflight.interrupt_lines()
    try:
        for line in lines:
            _say(line)
    except KeyboardInterrupt:
        for line in lines:
            _say(line)
        _say(termination.ending_line())
        sys.exit(termination.exit_status())


def _say(line: str) -> None:
    """A last line on stderr; a terminal already closed (SIGHUP) cannot take it, and that ends nothing."""
    try:
        click.echo(line, err=True)
    except OSError:
        pass


if __name__ == "__main__":
    main()
