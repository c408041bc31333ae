"""``keel.toml``: where its ``[serve]`` table is read from, and the store it names.

``keel serve`` and ``keel ops`` load the whole table (``--config``, checked key by key in
:mod:`keel.cli.serve`); every other command that opens a store (``keel tasks …``,
``keel worker``, ``keel check``, ``keel backup``, ``keel db``) takes the same store from
it, so that they all read the store ``keel serve`` writes: ``store``, else
``data_dir``/keel.db. Precedence everywhere: ``--store``, then ``$KEEL_STORE``, then the
file, then ``keel-data/keel.db``.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from keel.errors import ConfigurationError

__all__ = ["CONFIG_ENV", "DEFAULT_CONFIG", "config_option", "configured_store", "read_table"]

DEFAULT_CONFIG = "keel.toml"
CONFIG_ENV = "KEEL_CONFIG"


def config_option(callback: Callable[..., Any], help_text: str) -> Callable[[Any], Any]:
    """``--config FILE`` (``$KEEL_CONFIG``), read before every other option by ``callback``
    (which loads the table into the command's defaults)."""
    return click.option(
        "--config",
        metavar="FILE",
        envvar=CONFIG_ENV,
        is_eager=True,
        expose_value=False,
        callback=callback,
        help=help_text,
    )


def read_table(value: str | None) -> tuple[Path, dict[str, Any]] | None:
    """The ``[serve]`` table of the TOML file ``value`` names, else of ``./keel.toml`` if
    there is one; None without a file. Keys are not checked here.

    Raises:
        click.BadParameter: a file named that is not there or cannot be read, or a table
            other than ``[serve]``.
    """
    explicit = value is not None
    path = Path(value) if value is not None else Path(DEFAULT_CONFIG)
    try:
        found = path.exists()
    except OSError as exc:  # a name too long for the system: it cannot exist
        raise click.BadParameter(
            f"cannot read {path}: {exc.strerror}", param_hint="--config"
        ) from exc
    if not found:
        if explicit:
            raise click.BadParameter(f"no such file: {path}", param_hint="--config")
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--config") from exc
    table = data.get("serve", {})
    unknown_tables = sorted(set(data) - {"serve"})
    if not isinstance(table, dict) or unknown_tables:
        raise click.BadParameter(
            f"{path}: expected only a [serve] table"
            + (f", found {', '.join(unknown_tables)}" if unknown_tables else ""),
            param_hint="--config",
        )
    return path, table


def configured_store() -> str | None:
    """The store ``$KEEL_CONFIG`` or ``./keel.toml`` gives ``keel serve``: its ``store``,
    else its ``data_dir``/keel.db (relative to the current directory, as ``keel serve``
    takes it); None without a file or either key.

    Raises:
        ConfigurationError: the file cannot be read, or the key is not a string.
    """
    try:
        found = read_table(os.environ.get(CONFIG_ENV))
    except click.BadParameter as exc:
        raise ConfigurationError(exc.message) from exc
    if found is None:
        return None
    path, table = found
    for key in ("store", "data_dir"):
        value = table.get(key)
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(f"{path}: [serve] {key} must be a string, not {value!r}")
    if table.get("store"):
        return str(table["store"])
    if table.get("data_dir"):
        return str(Path(table["data_dir"]) / "keel.db")
    return None
