"""``scope data p4g --download DIR``: fetch the corpus from its public repository.

The annotated files are published as .xlsx; they are converted to .csv (same rows and columns)
with openpyxl, an optional dependency (``pip install openpyxl``). Machines without internet get a
clear error saying how to provide the files by hand.
"""

from __future__ import annotations

import csv
import urllib.error
import urllib.request
from pathlib import Path

from scope_marl.envs.p4g.corpus import FILES, read_dialogues, read_participants

SOURCE = "https://gitlab.com/ucdavisnlp/persuasionforgood/-/raw/master/data"
REMOTE = {
    "full_dialog.csv": "FullData/full_dialog.csv",
    "full_info.csv": "FullData/full_info.csv",
    "300_dialog.csv": "AnnotatedData/300_dialog.xlsx",
    "300_info.csv": "AnnotatedData/300_info.xlsx",
}


class CorpusDownloadError(RuntimeError):
    pass


def download(target: str | Path, source: str = SOURCE, timeout_s: float = 30.0) -> Path:
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for name, remote in REMOTE.items():
        url = f"{source}/{remote}"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                payload = response.read()
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise CorpusDownloadError(
                f"could not download {url}: {err}. Without internet, copy {', '.join(FILES)} into {target} "
                "by hand (or point SCOPE_P4G_DIR at a folder that has them)."
            ) from None
        if remote.endswith(".xlsx"):
            _xlsx_to_csv(payload, target / name)
        else:
            (target / name).write_bytes(payload)
    return target


def _xlsx_to_csv(payload: bytes, out: Path) -> None:
    try:
        import openpyxl
    except ImportError:
        raise CorpusDownloadError("converting the annotated .xlsx files needs openpyxl: pip install openpyxl") from None
    import io

    sheet = openpyxl.load_workbook(io.BytesIO(payload), read_only=True).active
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        for row in sheet.iter_rows(values_only=True):
            writer.writerow(["" if v is None else v for v in row])


def check(corpus_dir: str | Path) -> dict[str, int]:
    """Counts that show a corpus folder is complete and readable."""
    corpus_dir = Path(corpus_dir)
    missing = [f for f in FILES if not (corpus_dir / f).exists()]
    if missing:
        raise FileNotFoundError(f"{corpus_dir} lacks {', '.join(missing)}; expected {', '.join(FILES)}")
    return {
        "dialogues": len(read_dialogues(corpus_dir)),
        "participants": sum(len(p) for p in read_participants(corpus_dir).values()),
        "annotated_dialogues": len(read_dialogues(corpus_dir, "300_dialog.csv")),
    }
