"""``ds4lab ingest`` and ``ds4lab compare``: bring real profiles in, draw them beside ds4lab's."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .support import fail, result_folder


def register(main: click.Group) -> None:
    """Add the commands to the ``ds4lab`` group."""
    main.add_command(ingest_cmd)
    main.add_command(compare_cmd)


@click.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--lenient", is_flag=True, help="Keep the good rows; report every bad line instead of failing.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/ingested"), show_default=True,
              callback=result_folder)
@click.option("--sites", default=None, metavar="PRESET",
              help="Join Nsight Compute kernels to ds4lab's launch sites of this preset (bytes moved, "
                   "achieved GB/s); the preset the profiled run used.")
def ingest_cmd(files, lenient, out, sites) -> None:
    """Read ds4 MoE profile logs, Nsight Systems exports (stats CSV reports, SQLite), Nsight
    Compute CSV output (ncu --csv, details or raw page) and ds4lab result folders (format detected
    from the content) into CSV tables under OUT.

    nsys stats reports are told apart by their title line: each report ds4lab reads becomes its
    own table (nsys_kernels, nsys_nvtx, nsys_nvtx_kernels, nsys_cuda_api, nsys_mem_time,
    nsys_mem_size, nsys_gpu_trace, nsys_osrt, ...); any other report is skipped and named in a
    warning. A SQLite export gives kernels, graphs (one row per graph execution; a warning names
    --cuda-graph-trace=node when the graphs' kernels are missing) and nvtx (with domain names).
    ncu output gives ncu_kernels (one row per kernel: grid, block, duration, DRAM/SM/memory %,
    registers, the NVTX stack split into position, layer, cluster, op), ncu_metrics and ncu_sites
    (per launch site). Warnings also go to OUT/ingest_warnings.csv.

    Each row keeps the input it came from (its file column), so compare draws one bar per input.
    Once every input was read, the tables an earlier ingest wrote to OUT (ds4_moe.csv, nsys_*.csv,
    kernels.csv, graphs.csv, nvtx.csv, ncu_*.csv, ds4lab_*.csv, ingest_problems.csv,
    ingest_warnings.csv) are replaced: OUT holds this run's tables only. A ds4-format log that ds4lab wrote names its mode
    and routing in its "# ds4lab moe · mode=... · routing=..." first line.

    \b
    Exit status:
      0  every input read completely
      2  bad input: an unreadable or unrecognised file, a malformed line
         (without --lenient), a broken meta.json, a ds4lab folder without
         a table, the same file given twice, or an --out that cannot be a
         folder; the error names the file and line; OUT is left untouched
      3  --lenient and some lines were skipped: the good rows are written,
         each skipped line is listed on stderr and in OUT/ingest_problems.csv
    """
    from ..ingest import IngestError, ingest_all

    try:
        results = ingest_all(files, out, lenient, sites)
    except IngestError as e:
        fail(str(e))
    for r in results:
        tabs = ", ".join(f"{n} ({len(df)} rows)" for n, df in r.tables.items() if not df.empty)
        click.echo(f"{r.path}: {r.kind} → {tabs or 'no rows'}")
        for w in r.warnings:
            click.echo(f"ds4lab: warning: {w}", err=True)
        for p in r.problems:
            click.echo(f"  skipped {p['file']}:{p['line']}: {p['problem']}", err=True)
    click.echo(f"tables in {out}/")
    if any(r.problems for r in results):
        sys.exit(3)  # lenient: the good rows are written, but not everything was read


@click.command("compare")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=Path("results/compare"), show_default=True,
              callback=result_folder)
def compare_cmd(dirs, out) -> None:
    """Draw ds4lab results and ingested profiles from several folders side by side.

    Every DIR must hold a table compare can draw: a stage ladder (ladder.csv, ladder-NAME.csv),
    MoE stage rows or summaries (moe.csv, summary.csv, summary-NAME.csv, a ds4-format moe-ds4.log),
    kernel summaries (nsys_kernels.csv, kernels.csv) or their ingested copies (ds4_moe.csv,
    ds4lab_*.csv). An ingested table is drawn one bar per input file; a MoE table's bar is one
    profiling mode and routing (in-graph first, uniform routing first), named in its label with
    the preset the meta.json names. A run whose meta.json status is not "complete" is drawn with
    "(incomplete: STATUS)" in its legend label and a warning; modeled results say MODELED. The
    compare_* figures an earlier compare left in OUT are replaced.

    \b
    Exit status:
      0  figures written
      2  a DIR without a drawable table, an unreadable table or meta.json,
         or an --out that cannot be a folder (the error names them;
         nothing is written)
    """
    from ..report.compare import CompareError, compare

    try:
        paths = compare(dirs, out, warn=lambda m: click.echo(f"ds4lab: warning: {m}", err=True))
    except CompareError as e:
        fail(str(e))
    for p in paths:
        click.echo(f"wrote {p}")
