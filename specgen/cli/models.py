"""`specgen download` and `specgen models`: thin commands over models/registry.py and
models/download.py.

models/download.py (numpy through models/gguf.py), the progress bars and the report tables
are imported inside the commands, so that `specgen --help` and the other commands start fast."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from specgen.cli.options import JsonOpt, ModelsOpt
from specgen.errors import ConfigError, NetworkError
from specgen.models.demo import ensure_demo_model
from specgen.models.registry import ModelEntry, Registry, check_revision, load_registry
from specgen.models.resolve import checksum_failure, local_paths
from specgen.ui import output

DOWNLOAD_EPILOG = (
    "Examples:\n\n"
    "  specgen download qwen2.5-coder-7b            # a pair: target and draft\n\n"
    "  specgen download qwen2.5-coder-0.5b-q8 --dry-run\n\n"
    "  HF_TOKEN=hf_... specgen download llama3.1-8b  # gated repositories need a token"
)
MODELS_EPILOG = (
    "Examples:\n\n  specgen models\n\n  specgen models --json | jq '.models[]'\n\n"
    "  specgen models --local                    # GGUF files from Ollama, LM Studio, ..."
)


def download(
    name: Annotated[str, typer.Argument(help="A pair or model name (see `specgen models`).")],
    revision: Annotated[
        str | None,
        typer.Option("--revision", help="Branch, tag or commit (one model only)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Show what would be downloaded; fetch nothing. Offline, show what the "
            "registry knows (repository, file, approximate size) and say what was not checked.",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Delete the cached copy and download it again.")
    ] = False,
    models: ModelsOpt = None,
) -> None:
    """Download a pair or a model into the Hugging Face cache (resumable)."""
    check_revision(revision, "--revision")
    reg = load_registry(models)
    entries = reg.models_for(name)
    if revision and len(entries) > 1:
        raise ConfigError(f"--revision applies to one model; {name!r} is a pair: name a model")
    unreachable: NetworkError | None = None  # a dry run offline says what it knows first
    for entry in entries:
        if entry.embedded:
            _build_demo(entry, dry_run)
        elif dry_run:
            unreachable = _show_plan(entry, revision) or unreachable
        else:
            _download(entry, revision, force)
    if unreachable is not None:
        # start-up time: models/download.py loads numpy (and huggingface_hub when it asks)
        from specgen.models.download import dry_run_unchecked

        # the plan is printed: a dry run that did its job, so say what is missing and exit 0
        output.notice(dry_run_unchecked(unreachable))


def _build_demo(entry: ModelEntry, dry_run: bool) -> None:
    if dry_run:
        output.write_line(f"{entry.name}: embedded demo model, built locally (no download)")
        return
    path = ensure_demo_model(entry.name, status=output.status_line)
    output.write_line(f"{entry.name}\t{path}")


def _show_plan(entry: ModelEntry, revision: str | None) -> NetworkError | None:
    """One line per file of `entry`: size, cached or not; offline, what the registry knows
    (it needs no network; the Hub's answer does), and the error to report at the end."""
    # start-up time: models/download.py loads numpy (and huggingface_hub when it asks)
    from specgen.models.download import plan_download
    from specgen.ui.reports import human_bytes  # start-up time: the reports load rich tables

    try:
        plans = plan_download(entry, revision)
    except NetworkError as e:
        size = f"~{entry.size_gb:g} GB" if entry.size_gb else "size unknown"
        output.write_line(f"{entry.name}\t{entry.repo}/{entry.file}\t{size}\tnot checked")
        return e
    for plan in plans:
        what = "cached" if plan.cached else "to download"
        size = human_bytes(plan.size_bytes)
        output.write_line(f"{entry.name}\t{entry.repo}/{plan.filename}\t{size}\t{what}")
    return None


def _download(entry: ModelEntry, revision: str | None, force: bool) -> None:
    # start-up time: models/download.py loads numpy (and huggingface_hub when it asks)
    from specgen.models.download import download_model
    from specgen.ui.progress import download_bars  # start-up time: rich's progress bars

    with download_bars(output.err_console()) as hook:
        result = download_model(entry, revision=revision, force=force, progress=hook)
    output.write_line(f"{entry.name}\t{result.path}")


def models(
    models: ModelsOpt = None,
    json_out: JsonOpt = False,
    local: Annotated[
        bool,
        typer.Option(
            "--local",
            help="List the GGUF files already on disk (Hugging Face cache, llama.cpp's cache,"
            " LM Studio, Ollama), grouped by tokenizer: which can draft for which.",
        ),
    ] = False,
) -> None:
    """List the registry's pairs and models: downloaded or not, size on disk, path."""
    if local:
        _local(json_out)
        return
    reg = load_registry(models)
    rows = model_rows(reg)
    pairs = pair_rows(reg, rows)
    if json_out:
        output.write_json(
            {"pairs": pairs, "models": rows, "sources": [str(s) for s in reg.sources]}
        )
        return
    from specgen.ui import reports  # start-up time: the reports load rich's tables, numpy

    output.show(*reports.render_model_tables(pairs, rows))


def _local(json_out: bool) -> None:
    # start-up time: the header reader and the report tables load numpy and rich
    from specgen.models.local import find_local, group_by_tokenizer, search_roots
    from specgen.ui import reports

    roots = search_roots()
    groups = group_by_tokenizer(find_local(roots))
    if json_out:
        output.write_json(reports.local_groups_json(groups, roots))
        return
    output.show(*reports.render_local_tables(groups, roots))


def model_rows(reg: Registry) -> list[dict[str, Any]]:
    """One dict per model: name, where, quant, size_gb, status, bytes_on_disk, path.

    ``downloaded`` means loadable: a file that failed its SHA-256 check is on disk (``path``,
    ``bytes_on_disk``) with status "failed SHA-256" and ``problem`` saying how to recover.
    """
    return [_model_row(m) for m in reg.models.values()]


def _model_row(m: ModelEntry) -> dict[str, Any]:
    paths = local_paths(m)
    failure = checksum_failure(m, paths) if paths else None
    status = (
        ("built" if paths else "not built")
        if m.embedded
        else "failed SHA-256"
        if failure
        else ("downloaded" if paths else "not downloaded")
    )
    return {
        "name": m.name,
        "where": "embedded" if m.embedded else f"{m.repo}/{m.file}",
        "quant": m.quant,
        "size_gb": m.size_gb,
        "verified": m.verified,
        "embedded": m.embedded,
        "downloaded": bool(paths) and failure is None,
        "status": status,
        "problem": failure,
        "bytes_on_disk": sum(p.stat().st_size for p in paths) if paths else 0,
        "path": str(paths[0]) if paths else None,
    }


def pair_rows(reg: Registry, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per pair: name, target, draft, draft_max, chat, ready, note."""
    ready = {r["name"]: r["downloaded"] or r["embedded"] for r in rows}
    return [
        {
            "name": p.name,
            "target": p.target,
            "draft": p.draft,
            "draft_max": p.draft_max,
            "chat": p.chat,
            "ready": ready[p.target] and ready[p.draft],
            "note": p.note,
        }
        for p in reg.pairs.values()
    ]
