"""Command-line pieces the benchmarks share."""

from __future__ import annotations

from collections.abc import Sequence


def pick_configs(text: str | None, known: Sequence[str]) -> list[str]:
    """The configurations a ``--configs`` list names, in ``known``'s order; all of them when it is absent.

    A misspelt name is an error rather than skipped, so a typo never yields a run that silently
    measured less than was asked for.
    """
    if not text:
        return list(known)
    asked = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in asked if c not in known]
    if unknown or not asked:
        named = ", ".join(unknown) or repr(text)
        raise ValueError(f"--configs: unknown {named} (expected some of: {', '.join(known)})")
    return [c for c in known if c in asked]
