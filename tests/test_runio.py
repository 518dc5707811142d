"""Run records (``runio``): what ``run.json`` says about the machine, and the git SHA every record carries."""
import torch

from qdflash.config import load_config


def test_run_json_names_the_cpu_and_its_bf16_isa(tmp_path):
    from qdflash.runio import cpu_info, start_run
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f avx512_bf16 amx_tile\n\n"
                    "processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu amx_bf16\n")
    info = cpu_info(fake)                   # first processor's model and flags; absent flags are False
    assert (info["model"], info["avx512_bf16"], info["amx_tile"], info["amx_bf16"]) == ("Some Xeon", True, True, False)
    assert "model" not in cpu_info(tmp_path / "missing")
    from qdflash.config import QADConfig
    import json
    n = torch.get_num_threads()
    torch.set_num_threads(1 if n != 1 else 2)           # a count the process did not start with
    try:
        d = start_run(tmp_path / "run", load_config(QADConfig, "tiny"), "01_qad")
        want = torch.get_num_threads()
    finally:
        torch.set_num_threads(n)
    run = json.loads((d / "run.json").read_text())
    assert run["cpu"]["cores"] >= 1 and run["torch_threads"] == want


def test_git_sha_survives_a_slow_status(monkeypatch):
    """A status check that times out (a fresh worktree re-hashing every file on a loaded CPU) still records HEAD's
    SHA, marked ``-status-unknown``; only a failing rev-parse gives ``unknown``."""
    import subprocess

    from qdflash import runio

    def fake(cmd, **kw):
        if cmd[1] == "status":
            raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))
        return subprocess.CompletedProcess(cmd, 0, stdout="abc123\n")
    monkeypatch.setattr(runio.subprocess, "run", fake)
    assert runio.git_sha() == "abc123-status-unknown"
    monkeypatch.setattr(runio.subprocess, "run", lambda cmd, **kw: (_ for _ in ()).throw(FileNotFoundError("git")))
    assert runio.git_sha() == "unknown"
