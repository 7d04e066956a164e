"""Shell words the launcher scripts share."""

from __future__ import annotations

import shlex

from jupyter_dist.plan.spec import RunSpec


def script_args(spec: RunSpec) -> str:
    """The script's arguments as shell words (kept literal: the script expands $RANK itself)."""
    words = [shlex.quote(a) for a in spec.script_args] + ['"$@"']
    return " ".join(words)


def shell_default(var: str, value: object, export: bool = False) -> str:
    """`VAR="${VAR:-value}"`, the value shell-quoted (through a helper variable when it needs quotes)."""
    text = str(value)
    word = "export " if export else ""
    if shlex.quote(text) == text:
        return f'{word}{var}="${{{var}:-{text}}}"'
    return f'JD_{var}={shlex.quote(text)}\n{word}{var}="${{{var}:-$JD_{var}}}"'
