"""The argument-parsing conventions shared by every ``structconv`` subcommand.

Every parser is an :class:`ArgumentParser`: its ``--help`` states each option's default and the
exit statuses (:data:`EXIT_STATUS`), an unknown option or subcommand is answered with the near
names (``did you mean --epochs?``; the commands' own checks of models, options and settings use
:func:`did_you_mean` for the same hint), and the number types (:func:`positive_int` and friends) say
which option wanted what (``--epochs must be a positive integer, got 0``).  Usage errors exit
with status 2, runtime failures with 1.

This module sits in the experiments layer so that the experiments' own command lines
(:mod:`structconv.experiments.cifar.cli`) and the top-level :mod:`structconv.cli` share it
without the experiments importing the entry point above them.  It imports only the standard
library (torch only inside :func:`device_name`): ``structconv check --backends numpy`` must run
without torch.
"""

from __future__ import annotations

import argparse
import difflib
import math
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeVar

__all__ = [
    "EXIT_RUNTIME",
    "EXIT_STATUS",
    "EXIT_USAGE",
    "ArgumentParser",
    "HelpFormatter",
    "device_name",
    "did_you_mean",
    "nonnegative_float",
    "nonnegative_int",
    "positive_float",
    "positive_int",
]

EXIT_USAGE = 2
EXIT_RUNTIME = 1
EXIT_STATUS = """exit status:
  0  success
  1  runtime failure: a failed check, a corrupt archive or checkpoint, a failed
     download, an unwritable cache
  2  usage error: an unknown or malformed option or value, an unknown model,
     model option or preset, a missing data directory, archive, run directory
     or checkpoint"""
_N = TypeVar("_N", int, float)
_ACTIVE = "_structconv_parser"  # namespace attribute naming the innermost parser that ran


# --- near names -----------------------------------------------------------------------------------
def did_you_mean(word: str, names: Iterable[str], cutoff: float = 0.6) -> str:
    """``"did you mean X?"`` naming up to three of ``names`` near ``word``, or ``""`` when none is.

    Parameters
    ----------
    word : str
        What the user typed.
    names : iterable of str
        The names it should have been one of.
    cutoff : float, default 0.6
        The least :class:`difflib.SequenceMatcher` ratio of a near name.

    Returns
    -------
    str
        The hint, to follow ``"; "`` in an error message, or ``""``.

    Examples
    --------
    >>> did_you_mean("heds", ["heads", "width", "depth"])
    'did you mean heads?'
    >>> did_you_mean("sa-quadratc", ["resnet18", "sa-quadratic", "sa-gaussian"])
    'did you mean sa-quadratic?'
    >>> did_you_mean("vgg", ["resnet18", "sa-quadratic"])
    ''
    """
    close = difflib.get_close_matches(word, list(names), n=3, cutoff=cutoff)
    return f"did you mean {_either(close)}?" if close else ""


# --- number types ---------------------------------------------------------------------------------
def _number(text: str, kind: Callable[[str], _N], minimum: float, strict: bool, expected: str) -> _N:
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < minimum or (strict and value == minimum):
        raise argparse.ArgumentTypeError(f"must be {expected}, got {text or repr(text)}")
    return value


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 1 (epochs, seeds, batch sizes, steps, subsets)."""
    return _number(text, int, 1, False, "a positive integer")


def nonnegative_int(text: str) -> int:
    """An ``argparse`` type: an integer >= 0 (random seeds)."""
    return _number(text, int, 0, False, "an integer >= 0")


def positive_float(text: str) -> float:
    """An ``argparse`` type: a finite number > 0 (learning rates, peak TFLOP/s)."""
    return _number(text, float, 0.0, True, "a positive number")


def nonnegative_float(text: str) -> float:
    """An ``argparse`` type: a finite number >= 0 (time limits in seconds)."""
    return _number(text, float, 0.0, False, "a number >= 0")


_DEVICES = "auto or a device torch knows (cpu, cuda, cuda:N, mps, xpu, ...)"
_NEAR_DEVICES = ("auto", "cpu", "cuda", "mps", "xpu")  # what a misspelling is compared with
_ALIAS = re.compile(r"(?:gpu|cuda|nvidia)[:_ ]?(\d*)")  # other names of cuda (and cuda:01), cuda:N


def _torch_parses(text: str) -> bool:
    """Whether ``torch.device(text)`` accepts ``text``; without torch, whether it is cpu, cuda, mps or xpu[:N]."""
    try:
        import torch
    except ImportError:  # the command that wanted the device reports the missing torch
        return re.fullmatch(r"(?:cpu|cuda|mps|xpu)(?::\d+)?", text) is not None
    try:
        with warnings.catch_warnings():  # torch warns for some types it still accepts (mkldnn)
            warnings.simplefilter("ignore")
            torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        return False
    return True


def device_name(text: str) -> str:
    """An ``argparse`` type: ``auto`` or any device ``torch.device`` parses (``cpu``, ``cuda:1``, ``mps``, ...).

    A spelling torch rejects gets the near one it would take (``gpu`` -> ``cuda``, ``GPU:1`` ->
    ``cuda:1``, ``CPU`` -> ``cpu``, ``XPU`` -> ``xpu``); ``meta`` is refused (it computes nothing).  Whether
    the device exists is the command's to check.
    Imports torch (only when the option is given): ``structconv check`` runs without it.
    """
    if text.partition(":")[0] == "meta":  # torch parses it, but a meta tensor holds no values to compute with
        raise argparse.ArgumentTypeError(f"must be {_DEVICES}, got {text!r}: the meta device holds shapes, no values")
    if text == "auto" or _torch_parses(text):
        return text
    lower = text.strip().lower()
    alias = _ALIAS.fullmatch(lower)
    if alias:
        hint = f"cuda:{int(alias[1])}" if alias[1] else "cuda"
    elif lower == "auto" or _torch_parses(lower):
        hint = lower
    else:
        close = difflib.get_close_matches(lower, _NEAR_DEVICES, n=1, cutoff=0.5)
        hint = close[0] if close else ""
    suffix = f"; did you mean {hint}?" if hint else ""
    raise argparse.ArgumentTypeError(f"must be {_DEVICES}, got {text!r}{suffix}")


# --- the parser -----------------------------------------------------------------------------------
class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help text that states every option's default.

    ``" (default: X)"`` is appended to an option's help unless the help already says
    ``(default``, or the default is ``None``, ``False``, empty or suppressed (options whose
    absence means "the preset's value" say so in their help).
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "(default" in text
            or default is None
            or default is False
            or default == argparse.SUPPRESS
            or (isinstance(default, (str, list, tuple)) and not default)
            or not (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE))
        ):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


def _either(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with structconv's conventions; subparsers are of this class too.

    * ``--help`` shows defaults (:class:`HelpFormatter`) and the exit statuses (:data:`EXIT_STATUS`);
    * an unknown option is answered with the near ones of the innermost (sub)command that ran,
      found by :func:`difflib.get_close_matches`: ``unrecognized arguments: --epoks 3; did you
      mean --epochs?``, rather than a list of every name;
    * an unknown subcommand or choice likewise: ``unknown command 'trian'; did you mean train?``;
    * a number type's complaint names the option: ``--epochs must be a positive integer, got 0``.

    Every such error exits with status 2, as ``argparse`` does.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        kwargs.setdefault("epilog", EXIT_STATUS)
        super().__init__(*args, **kwargs)
        self.set_defaults(**{_ACTIVE: self})  # the innermost parser's default wins in the namespace

    def parse_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        """Parse ``args``; unknown arguments are reported by the subcommand they were given to."""
        parsed, extras = self.parse_known_args(args, namespace)
        active = getattr(parsed, _ACTIVE, self)
        if extras:
            active.error(active.unrecognized(extras))
        if hasattr(parsed, _ACTIVE):
            delattr(parsed, _ACTIVE)
        return parsed

    def unrecognized(self, extras: Sequence[str]) -> str:
        """The message for ``extras`` this parser does not know, with the near option names."""
        options = {  # compared without their dashes, which every name shares
            s.lstrip("-"): s
            for action in self._actions
            for s in action.option_strings
            if s.startswith("--") and s not in ("--help", "--version")
        }
        unknown = [w.split("=", 1)[0] for w in extras if w.startswith("-") and not _is_number(w)]
        hints = []
        for word in unknown:
            close = [options[c] for c in difflib.get_close_matches(word.lstrip("-"), sorted(options), n=3, cutoff=0.6)]
            if close:
                hints.append(_either(close) + ("" if len(unknown) == 1 else f" (for {word})"))
        message = f"unrecognized arguments: {' '.join(extras)}"
        if hints:
            return f"{message}; did you mean {', '.join(hints)}?"
        return f"{message}; see '{self.prog} --help'"

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        names = [str(c) for c in action.choices]
        hint = did_you_mean(str(value), names, cutoff=0.5) or f"expected one of {', '.join(names)}"
        if isinstance(action, argparse._SubParsersAction):
            raise argparse.ArgumentError(None, f"unknown command {value!r}; {hint}")
        raise argparse.ArgumentError(None, f"{_name(action)}: unknown {action.dest} {value!r}; {hint}")

    def error(self, message: str) -> NoReturn:
        """Print the usage and ``message`` to stderr; exit with status 2."""
        match = re.fullmatch(r"argument ([^:]+): (must be .*)", message, flags=re.DOTALL)
        if match:  # a number type's complaint: "--epochs must be a positive integer, got 0"
            message = f"{match[1]} {match[2]}"
        super().error(message)


def _name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) or str(action.metavar or action.dest)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
