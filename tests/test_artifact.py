"""The artifact as users meet it: bad input answered in one line, progress lines, results/ + compare, the README's
generated block, citation files and notebooks in nbstripout's clean form."""
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PY = sys.executable


def cli(*args, env=None, code=None):
    cmd = [PY, "-c", code, *args] if code else [PY, "-m", "qdflash.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, **(env or {})})


def write_json(p: Path, obj) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(obj))


def stage(root: Path, name: str, metrics: dict, preset="tiny", **cfg) -> Path:
    write_json(root / name / "metrics.json", metrics)
    write_json(root / name / "config.json", {"stage": name, "preset": preset, **cfg})
    return root / name


def safetensors_file(path: Path, n: int = 4) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4 * n))


# ----------------------------------------------------------------------------------------------- bad input
def assert_one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ")
    for n in needles:
        assert n in last, last


def test_unknown_stage_and_preset():
    assert_one_line_error(cli("run", "09_nope", "--preset", "tiny"), "unknown stage '09_nope'", "01_qad")
    assert_one_line_error(cli("run", "00_data", "--preset", "huge"), "unknown preset 'huge'", "tiny, smol, smol-gpu, smol-gpu-xl, full")
    assert_one_line_error(cli("run", "00_data", "--preset", "tiny", "--set", "n_prompt=3"), "unknown key",
                          "n_prompts")


def test_missing_upstream_stage_names_the_command(tmp_path):
    p = cli("run", "03_drafter_finetune", "--preset", "tiny", "--runs", str(tmp_path))
    assert_one_line_error(p, "needs 00_data", f"qdflash run 00_data --preset tiny --runs {tmp_path}")
    assert not (tmp_path / "03_drafter_finetune").exists()       # nothing written
    stage(tmp_path, "00_data", {}, preset="smol")
    p = cli("run", "01_qad", "--preset", "tiny", "--runs", str(tmp_path))
    assert_one_line_error(p, "preset 'smol', not 'tiny'")


def test_run_dir_of_another_config_is_kept(tmp_path):
    from qdflash.config import DataConfig, load_config, to_dict
    cfg = {"stage": "00_data", **to_dict(load_config(DataConfig, "tiny", n_prompts=7))}
    write_json(tmp_path / "00_data" / "config.json", cfg)
    (tmp_path / "00_data" / "generations.partial.jsonl").write_text('{"i": 0}\n')
    before = {f.name: f.read_bytes() for f in (tmp_path / "00_data").iterdir()}
    p = cli("run", "00_data", "--preset", "tiny", "--runs", str(tmp_path))
    assert_one_line_error(p, "another config", "n_prompts: 7 -> 24", "--runs")
    assert {f.name: f.read_bytes() for f in (tmp_path / "00_data").iterdir()} == before


def test_corrupt_checkpoint(tmp_path):
    from qdflash.pipeline import StageError, check_safetensors
    for s in ("00_data", "01_qad", "02_drafter_pretrain"):
        stage(tmp_path, s, {})
    ck = tmp_path / "01_qad" / "qad-w4a16-g32-twin" / "model.safetensors"
    safetensors_file(ck)
    check_safetensors(ck)                                   # a whole file passes
    ck.write_bytes(ck.read_bytes()[:-3])                    # a truncated one does not
    with pytest.raises(StageError, match="corrupt"):
        check_safetensors(ck)
    p = cli("run", "03_drafter_finetune", "--preset", "tiny", "--runs", str(tmp_path))
    assert_one_line_error(p, str(ck), "corrupt")
    assert ck.exists() and not (tmp_path / "03_drafter_finetune").exists()


def test_changed_data_file(tmp_path):
    import hashlib
    d = stage(tmp_path, "00_data", {})
    (d / "train.jsonl").write_text('{"input_ids": [1, 2]}\n')
    write_json(d / "manifest.json", {"files": {"train": {"sha256": hashlib.sha256(b'{"input_ids": [1, 2]}\n').hexdigest()}}})
    from qdflash.pipeline import check_upstream
    check_upstream("01_qad", "tiny", tmp_path)               # matches its manifest: passes
    (d / "train.jsonl").write_text('{"input_ids": [1, 3]}\n')
    p = cli("run", "01_qad", "--preset", "tiny", "--runs", str(tmp_path))
    assert_one_line_error(p, "train.jsonl does not match the sha256")


def test_missing_package(tmp_path):
    stage(tmp_path, "01_qad", {})
    code = ("import sys; sys.modules['seaborn'] = None; from qdflash.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    p = cli("figures", "--preset", "tiny", "--runs", str(tmp_path), "--fig-dir", str(tmp_path / "f"), code=code)
    assert_one_line_error(p, "missing Python package 'seaborn'", "make setup")


# ----------------------------------------------------------------------------------------------- progress
def test_text_progress_lines(monkeypatch, capsys):
    from qdflash import progress
    monkeypatch.setenv("QDFLASH_STAGE", "01_qad")
    monkeypatch.setenv("QDFLASH_PROGRESS_EVERY", "25")
    monkeypatch.setenv("QDFLASH_PROGRESS_MIN_SECONDS", "0")
    try:
        progress.install("text")
        from tqdm.auto import tqdm
        bar = tqdm(total=8, desc="QAD")
        for i in range(8):
            bar.set_postfix(kl=f"{0.5 - i / 100:.2f}")
            bar.update(1)
        bar.close()
        monkeypatch.setenv("QDFLASH_PROGRESS_MIN_SECONDS", "60")
        for _ in tqdm(range(5), desc="short"):              # a loop shorter than the minimum prints nothing
            pass
    finally:
        progress.install("auto")
    lines = capsys.readouterr().err.strip().splitlines()
    # the first update past the minimum time, then every 25%
    assert [ln.split("%")[0] for ln in lines] == ["[01_qad] QAD:  12", "[01_qad] QAD:  25", "[01_qad] QAD:  50",
                                                  "[01_qad] QAD:  75", "[01_qad] QAD: 100"], lines
    assert re.match(r"\[01_qad\] QAD:\s+50% 4/8 it, elapsed \S+, .* it/s, ETA \S+ \(kl=0\.47\)$", lines[2]), lines[2]
    assert "100% 8/8" in lines[-1]
    from tqdm.auto import tqdm as restored
    assert restored is not progress.TextTqdm


# ----------------------------------------------------------------------------------------------- compare
def test_compare_tolerances(tmp_path):
    from qdflash.compare import compare, tolerance
    assert tolerance("03_drafter_finetune:decoding.fp.two_stage.tau")[:2] == ("abs", 0.05)
    assert tolerance("01_qad:eval.qad.kl_to_teacher")[:2] == ("rel", 0.02)
    assert tolerance("04_drafter_quant:wall_time_s")[0] == "skip"
    for per_item in ("06_evaluation:speculation_check.mismatch_causes.3.plain_token",   # listed by index: the count
                     "01_qad:per_conversation.kl_sum.qad.7", "05_serving:offline.qad-w4a16.per_prompt.2.drafts"):
        assert tolerance(per_item)[0] == "skip", per_item
    assert tolerance("03_drafter_finetune:decoding.qad.two_stage.mismatched_outputs")[0] == "exact"   # fp32: lossless
    assert tolerance("06_evaluation:speculation_check.mismatched_outputs")[:2] == ("abs", 6)        # bf16 near-ties
    assert tolerance("06_evaluation:speculation_check.mismatched_outputs", "float32")[0] == "exact"
    old, new = tmp_path / "results", tmp_path / "runs"
    base = {"eval": {"qad": {"kl_to_teacher": 0.30, "ppl_assistant": 2.5}, "gptq": {"kl_to_teacher": 0.28}},
            "wall_time_s": 100.0, "timings": {"qad_train_s": 50.0}}
    stage(old, "01_qad", base, steps=60)
    stage(new, "01_qad", {"eval": {"qad": {"kl_to_teacher": 0.303, "ppl_assistant": 2.7},
                                   "gptq": {"kl_to_teacher": 0.28}}, "wall_time_s": 300.0,
                          "timings": {"qad_train_s": 10.0}, "extra": 1}, steps=80)
    dec = {"decoding": {"fp": {"two_stage": {"tau": 1.20, "per_position": [0.15, 0.04], "tokens_per_s": 8.0,
                                             "mismatched_outputs": 0}}}}
    stage(old, "03_drafter_finetune", dec)
    dec2 = json.loads(json.dumps(dec))
    dec2["decoding"]["fp"]["two_stage"].update(tau=1.26, tokens_per_s=3.0, mismatched_outputs=1)
    dec2["decoding"]["fp"]["two_stage"]["per_position"] = [0.19, 0.04]
    stage(new, "03_drafter_finetune", dec2)
    for dtype, mism in (("bfloat16", 5), ("float32", 0)):         # stage 06: near-ties in bf16, lossless in fp32
        stage(old / dtype, "06_evaluation", {"speculation_check": {"mismatched_outputs": mism}}, dtype=dtype)
        stage(new / dtype, "06_evaluation", {"speculation_check": {"mismatched_outputs": mism + 2}}, dtype=dtype)
    assert compare(new / "bfloat16", old / "bfloat16").moved.empty
    assert list(compare(new / "float32", old / "float32").moved.metric) == ["speculation_check.mismatched_outputs"]
    stage(new / "dtype", "06_evaluation", {"speculation_check": {"mismatched_outputs": 5}}, dtype="float32")
    assert compare(new / "dtype", old / "bfloat16").config_diffs == ["06_evaluation: dtype 'bfloat16' -> 'float32'"]
    c = compare(new, old)
    st = {(r.stage, r.metric): r.status for r in c.table.itertuples()}
    assert st[("01_qad", "eval.qad.kl_to_teacher")] == "ok"             # +1% < 2%
    assert st[("01_qad", "eval.qad.ppl_assistant")] == "MOVED"          # +8%
    assert st[("01_qad", "wall_time_s")] == "not compared"
    assert st[("01_qad", "timings.qad_train_s")] == "not compared"
    assert st[("01_qad", "extra")] == "new"
    assert st[("03_drafter_finetune", "decoding.fp.two_stage.tau")] == "MOVED"          # +0.06 > 0.05
    assert st[("03_drafter_finetune", "decoding.fp.two_stage.per_position.0")] == "ok"   # +0.04
    assert st[("03_drafter_finetune", "decoding.fp.two_stage.mismatched_outputs")] == "MOVED"
    assert st[("03_drafter_finetune", "decoding.fp.two_stage.tokens_per_s")] == "not compared"
    moved = c.moved.set_index("metric")
    assert moved.loc["decoding.fp.two_stage.tau", "delta"] == pytest.approx(0.06)
    assert c.config_diffs == ["01_qad: steps 60 -> 80"]
    md = c.markdown()
    assert "MOVED" in md and "ppl_assistant" in md and "kl_to_teacher" not in md
    p = cli("compare", "--preset", "tiny", "--runs", str(new), "--results", str(old))
    assert p.returncode == 1 and "3 moved" in p.stdout, p.stdout + p.stderr
    p = cli("compare", "--preset", "tiny", "--runs", str(old), "--results", str(old))
    assert p.returncode == 0 and "0 moved" in p.stdout


def test_results_collect_compare_and_figures_from_results(tiny_pipeline, tmp_path, monkeypatch):
    from qdflash import results
    from qdflash.compare import compare
    from qdflash.config import FiguresConfig, load_config
    from qdflash.figures import tables_markdown
    from qdflash.stages.s07_figures import run_figures
    runs = tiny_pipeline["runs"]
    out = tmp_path / "results" / "tiny"
    files = results.collect("tiny", runs, out)
    names = {f.name for f in out.rglob("*") if f.is_file()}
    assert names == {"metrics.json", "config.json", "run.json"} | ({"stage_times.txt"} if (runs / "stage_times.txt").exists() else set())
    assert {f.parent.name for f in files if f.name == "metrics.json"} == {p.parent.name for p in runs.glob("*/metrics.json")}
    assert (out / "03_drafter_finetune" / "metrics.json").read_text() == (runs / "03_drafter_finetune" / "metrics.json").read_text()
    # an unchanged rerun compares clean; one moved tau is found with its delta
    assert len(compare(runs, out).moved) == 0
    m = json.loads((out / "03_drafter_finetune" / "metrics.json").read_text())
    m["decoding"]["qad"]["two_stage"]["tau"] += 0.2
    (out / "03_drafter_finetune" / "metrics.json").write_text(json.dumps(m))
    moved = compare(runs, out).moved
    assert list(moved.metric) == ["decoding.qad.two_stage.tau"] and moved.delta.iloc[0] == pytest.approx(-0.2)
    # figures on a fresh clone: no runs/<preset>, the committed results are read
    monkeypatch.setattr(results, "results_dir", lambda preset: out)
    monkeypatch.setenv("QDFLASH_RUNS", str(tmp_path / "no-runs"))
    assert results.metrics_root("tiny") == out
    res = run_figures(load_config(FiguresConfig, "tiny", fig_dir=str(tmp_path / "fig")), tmp_path / "07", out,
                      cards=False)
    assert (tmp_path / "fig" / "fig-per-position.png").stat().st_size > 1000
    assert res.tables_md == tables_markdown(out) and "two_stage" in res.tables_md
    assert (tmp_path / "fig" / "tables.md").read_text() == res.tables_md


# ----------------------------------------------------------------------------------------------- README block
def test_readme_block_and_results_page_are_generated():
    """The README's headline block and docs/results-<preset>.md are exactly what `qdflash readme` generates from
    results/<preset> (and the saved benchmark outputs)."""
    from qdflash.results import read_block, readme_block, results_dir, results_doc, results_page
    preset, body = read_block()
    assert results_dir(preset).exists(), f"results/{preset} is missing: `make results PRESET={preset}`"
    fix = f"run `qdflash readme --preset {preset}`"
    assert body == readme_block(preset), f"README results block is stale: {fix}"
    doc = results_doc(preset)
    assert doc.exists() and doc.read_text() == results_page(preset), f"{doc.name} is stale: {fix}"
    assert f"](docs/{doc.name})" in body                                  # the headline links the full page


def test_readme_block_update_and_drift(tmp_path):
    from qdflash.results import read_block, results_doc, stale_results_files, update_readme
    root = tmp_path / "results"
    stage(root, "01_qad", {"eval": {k: {"kl_to_teacher": kl, "top1_agreement": 0.8, "ppl_assistant": 2.0,
                                        "file_mb": 1.0} for k, kl in (("teacher", 0.0), ("gptq", 0.28),
                                                                      ("qad", 0.2712345))},
                           "qad_vs_gptq_kl": {"ratio": 0.9687, "ratio_ci95": [0.95, 0.99], "n_conversations": 6}})
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nbefore\n\n<!-- results:begin preset=tiny -->\nold\n<!-- results:end -->\n\nafter\n")
    doc = results_doc("tiny", readme)
    assert doc == tmp_path / "docs" / "results-tiny.md" and not doc.exists()
    assert stale_results_files(None, readme, root) == [readme, doc]
    assert update_readme(None, readme, root) is True
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith("<!-- results:end -->\n\nafter\n")
    preset, body = read_block(readme)
    assert preset == "tiny" and "old" not in body and "](docs/results-tiny.md)" in body
    assert "| 0.969 | 0.950–0.990 (6 conversations) |" in body              # the headline: KL ratio, interval
    page = doc.read_text()
    assert page.startswith("# Results of the `tiny` preset\n") and "| QAD W4A16" in page and "0.2712" in page
    assert update_readme(None, readme, root) is False                  # regenerating is a no-op
    assert stale_results_files(None, readme, root) == []
    m = json.loads((root / "01_qad" / "metrics.json").read_text())
    m["eval"]["qad"]["kl_to_teacher"] = 0.25                           # only the page shows the KL itself
    (root / "01_qad" / "metrics.json").write_text(json.dumps(m))
    assert stale_results_files(None, readme, root) == [doc]
    assert update_readme(None, readme, root) is True and "0.25 " in doc.read_text()
    m["qad_vs_gptq_kl"]["ratio"] = 0.9                                 # the headline shows the ratio
    (root / "01_qad" / "metrics.json").write_text(json.dumps(m))
    assert readme in stale_results_files(None, readme, root)
    assert update_readme(None, readme, root) is True and "| 0.900 |" in read_block(readme)[1]


def test_readme_fits_two_screens_and_its_links_resolve():
    """The README stays short (the long material lives in docs/), and every relative link of the README, docs/ and
    benchmarks/README.md points at a file that exists (and at a heading that exists, for a #anchor)."""
    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= 150, f"README.md has {len(readme)} lines: move material to docs/"
    assert not [i for i, line in enumerate(readme, 1) if len(line) > 200], "README lines over 200 characters"

    def anchors(md: Path) -> set[str]:
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", md.read_text(), re.M)}
    bad = []
    for md in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"```.*?```", "", md.read_text(), flags=re.S)):
            path, _, anchor = target.partition("#")
            if re.match(r"\w+:", target):
                continue
            dest = (md.parent / path) if path else md
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
                bad.append(f"{md.relative_to(REPO)}: {target}")
    assert not bad, bad


# ----------------------------------------------------------------------------------------------- citation
CFF_SCHEMA = {  # the parts of the CFF 1.2.0 schema this file uses
    "type": "object",
    "required": ["cff-version", "message", "title", "authors"],
    "properties": {
        "cff-version": {"const": "1.2.0"}, "message": {"type": "string", "minLength": 1},
        "title": {"type": "string", "minLength": 1}, "version": {"type": "string"},
        "type": {"enum": ["software", "dataset"]}, "url": {"type": "string", "pattern": "^https?://"},
        "license": {"type": "string"}, "abstract": {"type": "string"},
        "keywords": {"type": "array", "items": {"type": "string"}},
        "authors": {"$ref": "#/$defs/persons"},
        "preferred-citation": {"type": "object", "required": ["type", "title", "authors"],
                               "properties": {"authors": {"$ref": "#/$defs/persons"}, "year": {"type": "integer"},
                                              "doi": {"type": "string", "pattern": r"^10\.\d{4,9}/[-._;()/:A-Za-z0-9]+$"},
                                              "type": {"enum": ["article", "software", "generic"]},
                                              "identifiers": {"type": "array", "items": {
                                                  "type": "object", "required": ["type", "value"],
                                                  "properties": {"type": {"enum": ["doi", "url", "swh", "other"]}}}}}},
    },
    "additionalProperties": False,
    "$defs": {"persons": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["family-names", "given-names"], "additionalProperties": False,
        "properties": {"family-names": {"type": "string"}, "given-names": {"type": "string"},
                       "orcid": {"type": "string"}, "affiliation": {"type": "string"}}}}},
}
AUTHORS = [("Kim", "Jaeyeon"), ("Lee", "Jewon"), ("Kim", "Bo-Kyeong")]


def test_citation_cff_and_bib():
    import jsonschema
    import yaml
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text())
    jsonschema.validate(cff, CFF_SCHEMA)
    assert [(a["family-names"], a["given-names"]) for a in cff["authors"]] == AUTHORS
    assert [(a["family-names"], a["given-names"]) for a in cff["preferred-citation"]["authors"]] == AUTHORS
    assert cff["version"] == re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.M)[1]
    bib = (REPO / "CITATION.bib").read_text()
    entries = {m[2]: m[3] for m in re.finditer(r"@(\w+)\{(\w+),(.*?)\n\}", bib, re.S)}
    want = "Kim, Jaeyeon and Lee, Jewon and Kim, Bo-Kyeong"
    assert re.search(r"author\s*=\s*\{" + want + r"\}", entries["kim2026quantize"])
    assert "2607.04244" in entries["kim2026quantize"] and "2026" in entries["kim2026quantize"]
    sw = entries["qdflash2026"]
    for key in ("author", "version", "url"):
        assert re.search(rf"\n\s*{key}\s*=\s*\{{.+\}}", sw), key
    assert re.search(r"version\s*=\s*\{" + re.escape(cff["version"]) + r"\}", sw)


# ----------------------------------------------------------------------------------------------- notebooks
NB = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_notebooks_are_in_nbstripout_form(tmp_path):
    """Every numbered notebook is written by hand (issue 36) and committed in nbstripout's clean form."""
    assert [p.stem[:2] for p in NB] == [f"{i:02d}" for i in range(8)]
    # the same filter git runs (Makefile): it must leave every committed notebook as it is
    extra = "metadata.papermill cell.metadata.papermill cell.metadata.execution"
    p = subprocess.run([PY, "-m", "nbstripout", "--dry-run", "--extra-keys", extra, *map(str, NB)],
                       capture_output=True, text=True, check=True)
    assert "would have stripped" not in p.stdout, p.stdout
    old = tmp_path / "old_form.ipynb"                   # the check itself can fail: the pre-fix id form
    old.write_text(NB[0].read_text().replace('"id": "0"', '"id": "00-0"'))
    p = subprocess.run([PY, "-m", "nbstripout", "--dry-run", "--extra-keys", extra, str(old)],
                       capture_output=True, text=True, check=True)
    assert "would have stripped" in p.stdout


def test_notebooks_walk_their_stage_in_narrated_steps():
    """Every notebook walks its stage: a narrative first, the parameters (with FORCE) first among the code cells, one
    stage call, prose before every step, steps short enough to read."""
    import nbformat
    for nb_path in NB:
        nb = nbformat.read(nb_path, as_version=4)
        md = [c.source for c in nb.cells if c.cell_type == "markdown"]
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        assert md[0].startswith("# ") and "**Look at:**" in md[0], nb_path.name
        assert "parameters" in nb.cells[1].metadata.get("tags", [])
        assert sum("run_stage(" in c for c in code) == 1, nb_path.name
        params = nb.cells[1].source
        assert all(re.search(rf"^{k} = ", params, re.M) for k in ("PRESET", "RUNS", "OVERRIDES", "FORCE")), params
        assert any("if FORCE:" in c for c in code), nb_path.name
        steps = nb.cells[2:]
        assert all(steps[i - 1].cell_type == "markdown" for i, c in enumerate(steps) if c.cell_type == "code"), \
            f"{nb_path.name}: a step without prose before it"
        assert len(code) >= 6 and all(len(c.splitlines()) <= 25 for c in code), nb_path.name


def _outputs(nb, marker: str) -> list[dict]:
    """The outputs of the one code cell whose source contains ``marker``."""
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    assert len(cells) == 1, (marker, len(cells))
    return cells[0].get("outputs", [])


def _text(outputs) -> str:
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stdout")


def test_executed_notebooks_show_plots_and_tables(tiny_pipeline):
    import nbformat
    want = {"01_qad": ("image/png", "text/html"), "02_drafter_pretrain": ("image/png",),
            "03_drafter_finetune": ("image/png", "text/html"), "04_drafter_quant": ("image/png", "text/html"),
            "07_figures": ("text/markdown", "image/png")}
    for stage_name, mimes in want.items():
        nb = nbformat.read(tiny_pipeline["executed"][stage_name], as_version=4)
        got = {k for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) for k in o.get("data", {})}
        for mime in mimes:
            assert mime in got, (stage_name, mime, got)
        errs = [o for c in nb.cells for o in c.get("outputs", []) if "IProgress not found" in str(o.get("text", ""))]
        assert not errs, stage_name


def test_stepped_notebooks_ran_their_steps(tiny_pipeline):
    """The steps of 02 and 03 ran in the executed tiny notebooks and showed what they are for; the step cells (all
    but the stage call) stay cheap, so the DAG's time budgets hold."""
    import nbformat
    nb = nbformat.read(tiny_pipeline["executed"]["02_drafter_pretrain"], as_version=4)
    assert "training conversations" in _text(_outputs(nb, "load_split(data_dir"))
    batch = _outputs(nb, "make_batch(")
    assert re.search(r"row 0: \d+ blocks of \d+, anchors at \[\d+", _text(batch))
    table = [o["data"]["text/plain"] for o in batch if "text/plain" in o.get("data", {})]
    assert table and all(k in table[0] for k in ("input", "label", "weight", "MASK")), table
    assert any("image/png" in o.get("data", {}) for o in _outputs(nb, "ax.imshow(m")), "no block mask drawn"
    before = re.search(r"untrained drafter: loss (\d+\.\d+) \(ln V = (\d+\.\d+)\)",
                       _text(_outputs(nb, "loss, info = drafter_loss(")))
    after = re.search(r"trained drafter: loss (\d+\.\d+) \(untrained (\d+\.\d+)\)",
                      _text(_outputs(nb, "load_drafter(res.drafters")))
    assert before and after and after[2] == before[1], (before, after)
    assert float(after[1]) < float(before[1])            # training fit the batch it saw
    assert any("image/png" in o.get("data", {}) for o in _outputs(nb, "training_curves("))

    nb = nbformat.read(tiny_pipeline["executed"]["03_drafter_finetune"], as_version=4)
    step = _text(_outputs(nb, "accept_drafts(block, post)"))
    m = re.search(r"drafted block: (.+)\naccepted length (\d+): (\d+) of (\d+) drafts", step)
    assert m and len(m[1].split(" | ")) == int(m[4]) + 1 and int(m[2]) == int(m[3]) + 1, step
    table = [o["data"]["text/plain"] for o in _outputs(nb, "status = [") if "text/plain" in o.get("data", {})]
    assert table and "draft" in table[0] and "target" in table[0], table
    assert ("accepted" if int(m[3]) else "rejected") in table[0] or int(m[3]) == int(m[4]), table
    dec = _text(_outputs(nb, "generate(target, prompt"))
    assert "first step agrees with the step above: True" in dec, dec
    assert "the grid's saved run of this prompt starts the same: True" in dec, dec
    for name in ("02_drafter_pretrain", "03_drafter_finetune"):
        nb = nbformat.read(tiny_pipeline["executed"][name], as_version=4)
        steps_s = sum(c.metadata.get("papermill", {}).get("duration") or 0 for c in nb.cells
                      if c.cell_type == "code" and "run_stage(" not in c.source)
        assert steps_s < 60, (name, steps_s)


def test_executed_notebooks_have_no_stderr_wall(tiny_pipeline):
    """An executed notebook reads like a paper section: library bars and harmless warnings go to the run directory's
    logs (runio.library_output_to_log), so each executed tiny notebook has at most a few stderr lines in all."""
    import nbformat
    for stage, path in tiny_pipeline["executed"].items():
        nb = nbformat.read(path, as_version=4)
        err = [line for c in nb.cells for o in c.get("outputs", [])
               if o.get("output_type") == "stream" and o.get("name") == "stderr" for line in o["text"].splitlines()
               if line.strip()]
        assert len(err) <= 5, (stage, len(err), err[:8])


def test_sha_groups_names_each_code_version_with_its_stages():
    """The README's run-vs-run heading says which code ran which stages (a mixed run must not read as one SHA)."""
    from qdflash.results import sha_groups
    assert sha_groups({"00_data": "d8efed7aaaa", "01_qad": "d8efed7aaaa"}) == "d8efed7"
    assert sha_groups({"00_data": "d8efed7aaaa", "04_drafter_quant": "d8efed7aaaa", "05_serving": "a8b0106bbbb",
                       "07_figures": "a8b0106bbbb-dirty"}) == "d8efed7 (00-04), a8b0106 (05-07)"
    assert sha_groups({"00_data": None, "01_qad": "a8b0106"}) == "? (00), a8b0106 (01)"
    assert sha_groups({"00_data": "aaaaaaa", "01_qad": "aaaaaaa", "02_drafter_pretrain": "bbbbbbb",
                       "03_drafter_finetune": "aaaaaaa"}) == "aaaaaaa (00-01/03), bbbbbbb (02)"


def test_qad_profile_reads_the_matmul_share_and_the_median_step(tmp_path):
    from qdflash.gpu_results import qad_profile
    p = tmp_path / "prof.txt"
    p.write_text("teacher forward 1.0 s | kl_loss 2.0 s | backward 3.0 s | AdamW 0.1 s | step 9.00 s\n"
                 "teacher forward 1.0 s | kl_loss 2.0 s | backward 3.0 s | AdamW 0.1 s | step 5.00 s\n"
                 "teacher forward 1.0 s | kl_loss 2.0 s | backward 3.0 s | AdamW 0.1 s | step 6.00 s\n"
                 "        Name    Self CPU %      Self CPU   CPU total %\n"
                 "  aten::mmx  1.00%  9.000s  1.00%\n"
                 "  aten::mm   40.00%  1500.000ms  40.00%\n"
                 "  aten::copy_  10.00%  250.000us  10.00%\n"
                 "Self CPU time total: 4.000s\n")
    q = qad_profile(p)
    assert (q["step_s"], q["mm_s"], q["profiled_s"]) == (6.0, 1.5, 4.0)
    assert q["rest_s"] == pytest.approx(2.5) and q["mm_share"] == pytest.approx(0.375)
    p.write_text("no profile here\n")
    with pytest.raises(ValueError, match="not a qad_step_profile output"):
        qad_profile(p)
