"""``keel auth``: the bearer tokens of a token file, for ``keel serve --auth tokens:FILE``.

``add-token NAME`` prints a new token once (only its SHA-256 is kept), ``list`` shows
the names, ``revoke NAME`` removes one; a server using the file sees the change on its
next request. The file and its format: :mod:`keel.mcp.tokens`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from keel.cli.common import FilePath

__all__ = ["DEFAULT_TOKENS", "auth"]

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_TOKENS = "keel-data/tokens.json"


def _tokens_option(fn: F) -> F:
    return click.option(
        "--tokens",
        "path",
        default=DEFAULT_TOKENS,
        show_default=True,
        envvar="KEEL_TOKENS",
        metavar="FILE",
        type=FilePath(dir_okay=False, path_type=Path),
        help="The token file (serve it with keel serve --auth tokens:FILE).",
    )(fn)


@click.group(short_help="Bearer tokens for keel serve --auth tokens:FILE.")
def auth() -> None:
    """Bearer tokens for `keel serve --auth tokens:FILE`: each a name (the principal
    owning the tasks it creates) and a secret, of which the file keeps only the hash."""


@auth.command("add-token", short_help="Make a token NAME; print it (once).")
@click.argument("name")
@_tokens_option
def add_token(name: str, path: Path) -> None:
    """Make a new token named NAME, keep its SHA-256 in the token file (created, mode
    0600, if missing) and print the token on stdout. It is shown this once only."""
    from keel.mcp.tokens import TokenFile

    token = TokenFile(path).add(name)
    click.echo(token)
    click.echo(
        f"keel auth: token {name!r} added to {path}; it is shown only this once "
        "(send it as Authorization: Bearer TOKEN)",
        err=True,
    )


@auth.command("list", short_help="The names of the tokens.")
@_tokens_option
def list_tokens(path: Path) -> None:
    """The token file's tokens: name and when each was made (never the token)."""
    from keel.mcp.tokens import TokenFile

    tokens = TokenFile(path).read()
    if not tokens:
        click.echo(f"keel auth: no tokens in {path}", err=True)
    for name in sorted(tokens):
        click.echo(f"{name}\t{tokens[name]['created']}")


@auth.command(short_help="Remove the token NAME.")
@click.argument("name")
@_tokens_option
def revoke(name: str, path: Path) -> None:
    """Remove the token named NAME: a server using the file refuses it (HTTP 401) from
    its next request on, without a restart."""
    from keel.mcp.tokens import TokenFile

    TokenFile(path).revoke(name)
    click.echo(f"keel auth: token {name!r} revoked in {path}", err=True)
