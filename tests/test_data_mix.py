"""Prompt sources mixed in configured proportions (the drafter data issue)."""
import pytest

from qdflash.config import DataConfig, load_config
from qdflash.data import gsm_prompts, mix_prompts, parse_mix


def test_parse_mix_normalises_and_rejects_bad_input():
    assert parse_mix("mix:sharegpt=3,gsm=1") == {"sharegpt": 0.75, "gsm": 0.25}
    with pytest.raises(ValueError, match="unknown source 'wiki'"):
        parse_mix("mix:wiki=1")
    with pytest.raises(ValueError, match="not a number"):
        parse_mix("mix:gsm=x")
    with pytest.raises(ValueError, match="positive weights"):
        parse_mix("mix:gsm=0")


def test_mix_keeps_proportions_in_every_prefix_and_is_deterministic():
    cfg = load_config(DataConfig, "smol", n_prompts=60, source="mix:sharegpt=0.5,chitchat=0.3,gsm=0.2")
    prompts, meta, names = mix_prompts(cfg)
    again, _, names2 = mix_prompts(cfg)
    assert prompts == again and names == names2
    w = meta["mix"]
    # while every pool still has prompts, each prefix holds each source within one prompt of its share
    n_gsm = sum(1 for n in names if n == "gsm")
    for n in range(1, n_gsm * 5):
        pre = names[:n]
        for k, share in w.items():
            assert abs(pre.count(k) - share * n) <= 1.0 + 1e-9, (n, k, pre.count(k), share * n)
    assert len(set(prompts)) == len(prompts)
    other = mix_prompts(load_config(DataConfig, "smol", n_prompts=60, seed=1,
                                    source="mix:sharegpt=0.5,chitchat=0.3,gsm=0.2"))[0]
    assert other[:30] != prompts[:30]


def test_gsm_prompts_are_seeded_problems():
    a, meta = gsm_prompts(5, seed=3)
    assert a == gsm_prompts(5, seed=3)[0] and a != gsm_prompts(5, seed=4)[0]
    assert len(a) == 5 and all("?" in p or "." in p for p in a) and meta["candidate_prompts"] == 5


@pytest.mark.parametrize("name", ["dump.json", "dump.json.gz"])
def test_a_prompt_dump_rebuilds_the_same_mix_under_either_name(tmp_path, monkeypatch, name):
    """dump_mix_prompts writes what its file name says (gzip for .gz, which load_prompts decompresses; a plain JSON
    under a .gz name failed on the GPU machine), and stage 00 rebuilds the same mix from it without the packages."""
    from qdflash.data import dump_mix_prompts, load_prompts
    cfg = load_config(DataConfig, "smol", n_prompts=40, source="mix:sharegpt=0.5,chitchat=0.3,gsm=0.2")
    dump_mix_prompts(cfg, tmp_path / name)
    assert (tmp_path / name).read_bytes()[:2] == (b"\x1f\x8b" if name.endswith(".gz") else b"{\n")
    monkeypatch.setenv("QDFLASH_PROMPTS_DUMP", str(tmp_path / name))
    prompts, meta = load_prompts(cfg)
    n = 2 * cfg.n_prompts                   # the dump keeps 2x each share: the prefix stage 00 selects from
    assert prompts[:n] == mix_prompts(cfg)[0][:n] and "dump_sha256" in meta
