"""How a `heterorl` command ends when it cannot go on: one line with one prefix, never a traceback for a mistake.

- A usage mistake (an unknown option, a value of the wrong type, a missing argument): `heterorl: error: ...
  (see heterorl CMD --help)`, exit 2.
- A config mistake (`ConfigError`): the same prefix, exit 2; a setup mistake (`heterorl.errors.SetupError`: a
  missing model or data file, unusable data, a failing reward function, a missing package, a port in use): exit 1.
- An interruption (Ctrl-C, or SIGTERM where the command has no handler of its own): `heterorl: interrupted: what
  was kept; how to continue`, exit 130. A simulated run stops softly at the first signal (it finishes the step it
  is on, evaluates and saves) and at once at the second.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from heterorl.config import ConfigError
from heterorl.console import ERROR_PREFIX, print_error
from heterorl.errors import SetupError

F = TypeVar("F", bound=Callable[..., Any])
# click's base of usage errors: typer vendors click (typer._click) in recent versions and uses click itself in
# older ones; both raise typer.BadParameter, whose ancestors name it
_USAGE_ERROR: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
INTERRUPTED_PREFIX = "heterorl: interrupted: "
INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C
SOFT_STOP_LINE = "heterorl: stopping after this step (evaluated and saved); Ctrl-C again stops at once"


class _FlagHelp:
    """typer prints a type after every option, `--help <bool>` included; flags take no value, so no type."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class Command(_FlagHelp, TyperCommand):
    pass


class Group(_FlagHelp, TyperGroup):
    """The `heterorl` group: click's usage errors become one prefixed line instead of a boxed panel."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except _USAGE_ERROR as exc:
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError":  # `heterorl` or `heterorl sync` alone: the help
                text = exc.format_message()  # type: ignore[attr-defined]
                if text.strip():  # rich help is printed while the error is made, and its text is empty
                    typer.echo(text)
                sys.exit(0)
            see = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            print_error(exc.format_message().rstrip(".") + see)  # type: ignore[attr-defined]
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        except typer.Abort:  # EOF on a prompt; Ctrl-C is handled by each command
            print_error("aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def interrupted(message: str) -> NoReturn:
    """End the command with `heterorl: interrupted: <message>` on stderr (what was kept, how to go on), exit 130."""
    typer.secho(INTERRUPTED_PREFIX + message, fg=typer.colors.YELLOW, err=True)
    raise typer.Exit(INTERRUPTED_EXIT)


def fail(message: str, code: int = 1) -> NoReturn:
    """End the command with `heterorl: error: <message>` on stderr and exit `code` (2: usage or config)."""
    print_error(message)
    raise typer.Exit(code)


def user_errors(fn: F) -> F:
    """A command whose config or setup mistakes end in one line (exit 2 for a config, 1 for the setup)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            fail(str(exc), 2)
        except SetupError as exc:
            fail(str(exc), 1)

    return wrapper  # type: ignore[return-value]


def command_line(*parts: str | Path | None, sets: Sequence[str] | None = None) -> str:
    """A shell-quoted `heterorl ...` command for a message (None parts are left out; `sets` as `--set K=V`)."""
    words = ["heterorl", *(str(p) for p in parts if p is not None)]
    for item in sets or ():
        words += ["--set", item]
    return shlex.join(words)


@contextmanager
def on_interrupt(what: Callable[[], str], soft: Callable[[], None] | None = None) -> Iterator[None]:
    """Ctrl-C (and SIGTERM, which is made to act like it) ends the command with one line: `what()` says what was
    kept and how to continue. A SIGTERM handler someone else installed is kept as it is.

    With `soft`, the first signal only calls it (a run then finishes the step it is on, evaluated and saved: no
    exception lands in the middle of its work, where a lock could be left held) and says so; a second one stops
    at once."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return
    asked = False

    def handler(signum: int, frame: FrameType | None) -> None:
        nonlocal asked
        if soft is None or asked:
            raise KeyboardInterrupt
        asked = True
        soft()
        typer.secho(SOFT_STOP_LINE, fg=typer.colors.YELLOW, err=True)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, handler)
    if previous[signal.SIGTERM] in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, handler)
    try:
        yield
    except KeyboardInterrupt:
        interrupted(what())
    finally:
        for sig, old in previous.items():
            if old is not None:
                signal.signal(sig, old)


__all__ = [
    "ERROR_PREFIX",
    "INTERRUPTED_EXIT",
    "INTERRUPTED_PREFIX",
    "Command",
    "Group",
    "command_line",
    "fail",
    "interrupted",
    "on_interrupt",
    "user_errors",
]
