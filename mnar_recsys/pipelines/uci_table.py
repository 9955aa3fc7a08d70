"""`mnar-recsys uci-table`: one UCI table from the results of many `uci` runs.

Seeds of the full protocol are best run apart (`uci --runs 1 --seed S`, on as many cores or machines as
there are), which leaves one results.json per run. This merges them: every record is kept with the file
it came from, runs of one (data set, model, seed) may appear once only, and every file must share one
protocol (iterations, batch size, K, importance samples, offset), since a table mixing them would
compare unlike things. Agnostic models imputed from the drawn x_m (`--sampled-imputation draws`) get a
row of their own, and so do neural models that kept the best of several fits (`--n-init N`, N > 1).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mnar_recsys.data.uci import UCI_NAMES
from mnar_recsys.io import provenance, write_atomic, write_json
from mnar_recsys.pipelines.arguments import check_output_folder
from mnar_recsys.pipelines.uci import results_markdown, rmse_figure, row_order

#: the protocol settings every merged file must share
SHARED_PROTOCOL = ("iterations", "batch_size", "n_samples", "importance_samples", "offset")
DRAWN = " (drawn x_m)"  # the row suffix of models imputed from the drawn x_m


def results_files(paths: list[Path], out: Path | None = None) -> list[Path]:
    """The given results.json files, and every results.json below the given folders but `out`'s own, in a stable
    order. `out` may hold an earlier merge, which the new one replaces, but not a `uci` run's results."""
    own = None
    if out is not None and (out / "results.json").is_file():
        own = (out / "results.json").resolve()
        if not _is_merged_table(own):
            raise ValueError(f"--out {out} holds a `uci` run's results.json, which the table would overwrite; "
                             "choose another folder")
    files = []
    for path in paths:
        if path.is_dir():
            found = sorted(f for f in path.rglob("results.json") if f.resolve() != own)
            if not found:
                raise FileNotFoundError(f"{path}: no results.json in this folder or below it")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    return files


def _is_merged_table(path: Path) -> bool:
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(payload, dict) and "sources" in payload


def _row(record: dict[str, Any], protocol: dict[str, Any]) -> str:
    """The table row of a record: its model, marked when its sampled x_m were imputed from the draws and
    when it is the best of several fits (the baselines, which have no model config, are neither)."""
    model_config = (record.get("config") or {}).get("model") or {}
    # the MIWAE's factor reads 'sampled' too, but it has no missing model to draw x_m for: it imputes alike
    drawn = protocol.get("sampled_imputation", "decoder-mean") == "draws" \
        and model_config.get("missing_factor") == "sampled" and model_config.get("missing") != "mcar"
    n_init = protocol.get("n_init", 1) if model_config else 1
    return record["model"] + (DRAWN if drawn else "") + (f" (best of {n_init})" if n_init > 1 else "")


def merge(files: list[Path]) -> dict[str, Any]:
    """The merged results: the shared protocol, each source file's provenance and protocol, and every
    record with its row name and source. Raises ValueError naming the files that disagree."""
    if not files:
        raise ValueError("no results files to merge")
    protocol, first, sources, records, seen = None, None, [], [], {}
    for path in files:
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: not a results.json written by `mnar-recsys uci` (not JSON: {error})") from None
        if not (isinstance(payload, dict) and isinstance(payload.get("protocol"), dict)
                and isinstance(payload.get("records"), list)):
            raise ValueError(f"{path}: not a results.json written by `mnar-recsys uci` (expected an object with a "
                             "'protocol' object and a 'records' list)")
        if "sources" in payload:
            raise ValueError(f"{path}: a table merged by `mnar-recsys uci-table`, not a `uci` run's results; merge "
                             "the runs it lists")
        file_protocol, file_records = payload["protocol"], payload["records"]
        shared = {key: file_protocol.get(key) for key in SHARED_PROTOCOL}
        if protocol is None:
            protocol, first = shared, path
        for key in SHARED_PROTOCOL:
            if shared[key] != protocol[key]:
                raise ValueError(f"{path} has {key} = {shared[key]!r} but {first} has {protocol[key]!r}: "
                                 "merge runs of one protocol")
        sources.append({"path": str(path), "provenance": payload.get("provenance"), "protocol": file_protocol,
                        "complete": payload.get("complete")})
        for index, record in enumerate(file_records):
            _check_record(record, path, index)
            row = _row(record, file_protocol)
            key = (record["dataset"], row, record["seed"])
            if key in seen:
                raise ValueError(f"{record['dataset']}, {row}, seed {record['seed']} is in both {seen[key]} and "
                                 f"{path}: keep one of them")
            seen[key] = path
            records.append({**record, "model": row, "source": str(path)})
    if not records:
        raise ValueError(f"no records in {', '.join(map(str, files))}: nothing to tabulate")
    records.sort(key=_table_position)
    return {"provenance": provenance(), "protocol": protocol, "sources": sources, "records": records}


def _check_record(record: Any, path: Path, index: int) -> None:
    if not isinstance(record, dict):
        raise ValueError(f"{path}: record {index} is not a JSON object")
    missing = [key for key in ("dataset", "model", "seed", "rmse") if key not in record]
    if missing:
        raise ValueError(f"{path}: record {index} lacks {', '.join(missing)}")
    if record["dataset"] not in UCI_NAMES:
        raise ValueError(f"{path}: record {index} is on {record['dataset']!r}, not one of {', '.join(UCI_NAMES)}")
    expected = {"model": (str, "a string"), "seed": (int, "an integer"), "rmse": ((int, float), "a number"),
                "config": ((dict, type(None)), "an object")}
    for key, (kind, what) in expected.items():
        value = record.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"{path}: record {index} has {key} {value!r}, expected {what}")


def _table_position(record: dict[str, Any]) -> tuple:
    """Data sets in the paper's order (each variant after its data set), then rows in table order
    (`row_order`), then seeds."""
    return UCI_NAMES.index(record["dataset"]), *row_order(record["model"]), record["seed"]


def write_table(merged: dict[str, Any], out: Path) -> str:
    """Write results.json, results.md and rmse.png to `out`; return the markdown. results.json says
    "complete": false until the other two are written, as a `uci` run's does, and results.md names the
    sources whose own runs had stopped before the end."""
    records = merged["records"]
    text = results_markdown(records, merged["protocol"])
    stopped = [source["path"] for source in merged["sources"] if source.get("complete") is False]
    if stopped:
        text = (f"**Incomplete**: {', '.join(stopped)} stopped before every run was written; their rows hold "
                "the runs that were.\n\n" + text)
    write_json(out / "results.json", {**merged, "complete": False})
    write_atomic(out / "results.md", text)
    rmse_figure(records, out / "rmse.png")
    write_json(out / "results.json", {**merged, "complete": True})
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("uci-table", help="merge the results.json of many `uci` runs into one table")
    parser.add_argument("results", nargs="+", type=Path,
                        help="results.json files, or folders searched for them")
    parser.add_argument("--out", type=Path, default=Path("results/uci_table"),
                        help="output folder (default results/uci_table)")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    check_output_folder(args.out)
    merged = merge(results_files(args.results, args.out))
    print(write_table(merged, args.out))
    print(f"merged {len(merged['records'])} runs from {len(merged['sources'])} files into "
          f"{args.out / 'results.json'}, {args.out / 'results.md'} and {args.out / 'rmse.png'}")
    return 0
