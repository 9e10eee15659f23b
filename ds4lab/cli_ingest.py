"""``ds4lab ingest`` and ``ds4lab compare``: bring real profiles in, draw them beside ds4lab's."""

from __future__ import annotations

import sys
from pathlib import Path

import click


def register(main: click.Group) -> None:
    """Add the commands to the ``ds4lab`` group."""
    main.add_command(ingest_cmd)
    main.add_command(compare_cmd)


@click.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--lenient", is_flag=True, help="Keep the good rows; report every bad line instead of failing.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/ingested"), show_default=True)
def ingest_cmd(files, lenient, out) -> None:
    """Read ds4 MoE profile logs, Nsight Systems exports (stats CSV, SQLite) and ds4lab result
    folders (format detected from the content) into CSV tables under OUT."""
    from .ingest import IngestError, ingest_all

    try:
        results = ingest_all(files, out, lenient)
    except IngestError as e:
        click.echo(f"ds4lab: error: {e}", err=True)
        sys.exit(1)
    for r in results:
        tabs = ", ".join(f"{n} ({len(df)} rows)" for n, df in r.tables.items())
        click.echo(f"{r.path}: {r.kind} → {tabs}")
        for p in r.problems:
            click.echo(f"  skipped {p['file']}:{p['line']}: {p['problem']}", err=True)
    click.echo(f"tables in {out}/")
    if any(r.problems for r in results):
        sys.exit(3)  # lenient: the good rows are written, but not everything was read


@click.command("compare")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/compare"), show_default=True)
def compare_cmd(dirs, out) -> None:
    """Draw ds4lab results and ingested profiles from several folders side by side."""
    from .compare import compare

    paths = compare(dirs, out)
    if not paths:
        click.echo("ds4lab: error: no ladder or MoE-profile table found in those folders", err=True)
        sys.exit(1)
    for p in paths:
        click.echo(f"wrote {p}")
