"""`%dist export`'s options and the names of the files it writes."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass

from IPython.core.error import UsageError

FORMATS: tuple[str, ...] = ("torchrun", "mpirun", "sbatch", "azureml")
DEFAULT_SCRIPT = "distrun_export.py"
SCRIPT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\.py\Z")
AZURE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@/-]*\Z")


@dataclass(frozen=True)
class ExportOptions:
    format: str | None  # None: the launcher that fits the run (see `run_env.default_format`)
    file: str = DEFAULT_SCRIPT
    compute: str | None = None
    environment: str | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"%dist export: {message}; use %dist export [--format {'|'.join(FORMATS)}] [FILE].")


def parse_options(argv: list[str]) -> ExportOptions:
    p = _Parser(prog="%dist export", add_help=False, allow_abbrev=False)
    p.add_argument("--format")
    p.add_argument("--compute")
    p.add_argument("--environment")
    p.add_argument("file", nargs="?", default=DEFAULT_SCRIPT)
    ns = p.parse_args(argv)
    fmt = ns.format
    if fmt is not None:
        fmt = fmt.strip().lower()
        if fmt not in FORMATS:
            raise UsageError(f"%dist export: --format must be one of {', '.join(FORMATS)}, not {ns.format!r}.")
    for flag, value in (("--compute", ns.compute), ("--environment", ns.environment)):
        if value is not None and not AZURE_NAME.match(value):
            raise UsageError(f"%dist export: {flag} {value!r} is not an Azure ML name such as azureml:my-cluster.")
    return ExportOptions(fmt, ns.file, ns.compute, ns.environment)


def check_file(path: str) -> tuple[str, str]:
    """(directory, file name) of FILE; the name goes into shell lines and job files, so it is plain."""
    if "\n" in path or "\r" in path:
        raise UsageError("%dist export: FILE must not contain a line break.")
    directory, name = os.path.split(path)
    if not SCRIPT_NAME.match(name):
        raise UsageError(f"%dist export: FILE {path!r} must end in a .py file name of letters, digits and ._+- "
                         "(it is written into shell lines and job files).")
    if directory and not os.path.isdir(directory):
        raise UsageError(f"%dist export: the folder {directory!r} for FILE does not exist.")
    return directory, name


def launcher_name(script: str, fmt: str) -> str:
    """The launcher file written beside `script` (a file name ending in .py) for format `fmt`."""
    stem = script[:-3]
    return f"{stem}.{fmt}.yml" if fmt == "azureml" else f"{stem}.{fmt}.sh"
