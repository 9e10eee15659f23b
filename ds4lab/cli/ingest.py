"""``ds4lab ingest`` and ``ds4lab compare``: bring real profiles in, draw them beside ds4lab's."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..jobs.compare import CompareConfig
from ..jobs.ingest import IngestConfig
from .support import default, invoke, result_folder


def register(main: click.Group) -> None:
    """Add the commands to the ``ds4lab`` group."""
    main.add_command(ingest_cmd)
    main.add_command(compare_cmd)


@click.command("ingest")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--lenient", is_flag=True, help="Keep the good rows; report every bad line instead of failing.")
@click.option("--out", type=click.Path(path_type=Path), default=None, callback=result_folder,
              help="Result folder. Default: results/ingested (an earlier ingest of other inputs there is kept "
                   "beside it as results/ingested.replaced-<time>).")
@click.option("--sites", default=default(IngestConfig, "sites"), metavar="PRESET",
              help="Join Nsight Compute kernels to ds4lab's launch sites of this preset (bytes moved, "
                   "achieved GB/s); the preset the profiled run used.")
def ingest_cmd(files, lenient, out, sites) -> None:
    """Read ds4 MoE profile logs, Nsight Systems exports (stats CSV reports, SQLite), Nsight Compute CSV output (ncu
    --csv, details or raw page) and ds4lab result folders (format detected from the content) into CSV tables under
    OUT.

    nsys stats reports are told apart by their title line, or, in the per-report files `nsys stats --format csv -o
    PREFIX` writes, by the file name nsys gave them and their columns: each report ds4lab reads becomes its own table
    (nsys_kernels, nsys_nvtx, nsys_nvtx_kernels, nsys_cuda_api, nsys_mem_time, nsys_mem_size, nsys_gpu_trace,
    nsys_osrt, ...); any other report is skipped and named in a warning. nsys stats' text format is refused ("rerun
    with --format csv"). A SQLite export gives kernels, graphs (one row per graph execution; a warning names
    --cuda-graph-trace=node when the graphs' kernels are missing) and nvtx (with domain names). ncu output gives
    ncu_kernels (one row per kernel: grid, block, duration, DRAM/SM/memory % of peak from the Speed Of Light section,
    registers, device, process, the NVTX stack split into position, layer, cluster, op), ncu_metrics (every metric with
    its section and unit), ncu_rules (the rules' findings and estimated speedups) and ncu_sites (per launch site). Raw
    .nsys-rep/.qdrep/.ncu-rep files are refused with the command that exports them. Warnings also go to
    OUT/ingest_warnings.csv.

    Each row keeps the input it came from (its file column), so compare draws one bar per input. OUT is a ds4lab result
    folder (meta.json: the inputs, their SHA-256 and rows): locked, written aside and swapped in once every input was
    read, so it holds this run's tables only and an earlier ingest's stay until then; a job's folder (a ladder's, ...),
    an input, or a folder ds4lab did not write is refused. Large inputs are streamed (ds4 logs, nsys stats CSV: memory
    does not grow with the file) with a progress bar. A ds4-format log that ds4lab wrote names its mode and routing in
    its "# ds4lab moe · mode=... · routing=..." first line.

    \b
    Exit status:
      0  every input read completely
      2  bad input: an unreadable or unrecognised file, a malformed line
         (without --lenient), a cut-off file, a broken meta.json, a ds4lab
         folder without a table, the same input given twice (by path or by
         content), or an --out that cannot be this folder; the error names
         the file and line; OUT is left untouched
      1  writing the tables failed after the inputs were read (a full disk):
         the error names the file; the tables whole so far are kept
      3  --lenient and some lines were skipped: the good rows are written,
         each skipped line is listed on stderr and in OUT/ingest_problems.csv"""
    from ..report.results import final_path

    res = invoke("ingest", IngestConfig(files=tuple(files), out=out, lenient=lenient, sites=sites))
    for r in res.value:
        tabs = ", ".join(f"{n} ({rows} rows)" for n, rows in r.counts().items() if rows)
        click.echo(f"{r.path}: {r.kind} → {tabs or 'no rows'}")
        for w in r.warnings:
            click.echo(f"ds4lab: warning: {w}", err=True)
        for p in r.problems:
            click.echo(f"  skipped {p['file']}:{p['line']}: {p['problem']}", err=True)
    click.echo(f"tables in {final_path(res.out)}/")
    if any(r.problems for r in res.value):
        sys.exit(3)  # lenient: the good rows are written, but not everything was read


@click.command("compare")
@click.argument("dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), default=None, callback=result_folder,
              help="Result folder. Default: results/compare (an earlier comparison of other folders there is "
                   "kept beside it as results/compare.replaced-<time>).")
def compare_cmd(dirs, out) -> None:
    """Draw ds4lab results and ingested profiles from several folders side by side.

    Every DIR must hold a table compare can draw: a stage ladder (ladder.csv, ladder-NAME.csv), a context ladder
    (context.csv, context-NAME.csv: one panel per stage, the contexts every source holds, what a source lacks named in
    the figure), MoE stage rows or summaries (moe.csv, summary.csv, summary-NAME.csv, a ds4-format moe-ds4.log), kernel
    summaries (nsys_kernels.csv, kernels.csv) or their ingested copies (ds4_moe.csv, ds4lab_*.csv). An ingested table
    is drawn one bar per input file, a table of several devices or processes one bar per device and process (an nsys
    stats kernel summary, which nsys itself adds up over devices, is said to be that sum); a MoE table's bar is one
    profiling mode and routing (in-graph first, uniform routing first), named in its label with the preset, and with
    the calls that fell back to eager. Legends name every setting that differs between the sources of one figure
    (preset, backend, long-context token, start position, stages, calibration); a run whose meta.json status is not
    "complete" is drawn with "(incomplete: STATUS)" in its legend label and a warning; titles say MODELED where any
    source is modeled. The same folder twice (by path or content) is refused. OUT is a ds4lab result folder: locked,
    written aside and swapped in with this run's figures only; a job's folder, a source, or a folder ds4lab did not
    write is refused.

    \b
    Exit status:
      0  figures written
      2  a DIR without a drawable table, an unreadable table or meta.json,
         or an --out that cannot be a folder (the error names them;
         nothing is written)"""
    from ..report.results import final_path

    res = invoke("compare", CompareConfig(dirs=tuple(dirs), out=out))
    for p in res.files:
        click.echo(f"wrote {final_path(p)}")
