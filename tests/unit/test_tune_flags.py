"""`gpuops tune --sweep flag=...` checked against the real releases' argument parsers (0.5.8's
add_argument calls, 0.5.16's annotated ServerArgs, 0.5.23's arg_groups/fields), as the host-side
reader (remote/sglang_flags.py) reads them from the cached wheels: names, aliases, kinds, choices
(literal, by constant name, from Literal[...]) and the speculative flags each release has."""

from __future__ import annotations

import json

import pytest

from gpuops.errors import GpuopsError
from gpuops.lab.sglang_cache import sglang_site
from gpuops.remote.sglang_flags import parser_flags, read_sources, release_version
from gpuops.tune.flags import ReleaseFlags, launch_words

VERSIONS = ("0.5.8", "0.5.16", "0.5.23")
_CACHE: dict[str, dict] = {}


def _answer(version: str, speculative: bool = False) -> dict:
    if version not in _CACHE:
        root = str(sglang_site(version) / "sglang")
        # through JSON, as the answer travels from the host
        _CACHE[version] = json.loads(json.dumps({"ok": True, "version": release_version(root),
                                                 "flags": parser_flags(read_sources(root))}))
    return dict(_CACHE[version], speculative=speculative)


def _release(version: str, speculative: bool = False) -> ReleaseFlags:
    return ReleaseFlags.from_answer("gpu0", _answer(version, speculative))


@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_names_its_version_and_its_core_flags(version: str) -> None:
    release = _release(version)
    assert release.version == version  # from the wheel's _version.py, not version.py's dev0 fallback
    assert release.find("speculative_num_steps").type == "int"
    assert release.find("--speculative-num-draft-tokens").kind == "value"
    # an alias is the same flag: --speculative-draft-model (0.5.8 add_argument, 0.5.16+ Arg(aliases=))
    assert release.find("--speculative-draft-model").dest == "speculative_draft_model_path"
    assert release.find("disable_overlap_schedule").kind == "switch"
    assert release.find("speculative_ngram_match_type").choices == ("BFS", "PROB")  # Literal / choices=[...]


def test_the_speculative_flags_each_release_has() -> None:
    def ngram(version: str) -> set[str]:
        return {s.dest for s in _release(version).flags.values() if s.dest.startswith("speculative_ngram")}

    assert ngram("0.5.8") == {"speculative_ngram_min_match_window_size", "speculative_ngram_max_match_window_size",
                              "speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth",
                              "speculative_ngram_match_type", "speculative_ngram_branch_length",
                              "speculative_ngram_capacity"}
    assert ngram("0.5.16") == ngram("0.5.23") == {
        "speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth", "speculative_ngram_match_type",
        "speculative_ngram_max_trie_depth", "speculative_ngram_capacity", "speculative_ngram_external_corpus_path",
        "speculative_ngram_external_sam_budget", "speculative_ngram_external_corpus_max_tokens"}
    # 0.5.16 renamed the window flags away: a sweep written for 0.5.8 is refused there, by name
    with pytest.raises(GpuopsError, match="SGLang 0.5.16 has no launch flag speculative_ngram_branch_length"):
        _release("0.5.16").check("speculative_ngram_branch_length", "18")
    assert _release("0.5.16").find("speculative_use_rejection_sampling").kind == "switch"
    assert "speculative_use_block_verification" in {s.dest for s in _release("0.5.23").flags.values()}


def test_speculative_algorithm_choices_are_the_release_s_own() -> None:
    # 0.5.8: choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]; 0.5.16+: any registered name
    assert _release("0.5.8").find("speculative_algorithm").choices == ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
    with pytest.raises(GpuopsError) as exc:
        _release("0.5.8").check("speculative_algorithm", "DFLASH")
    assert str(exc.value) == ("tune: gpu0: SGLang 0.5.8's --speculative-algorithm takes EAGLE, EAGLE3, NEXTN, "
                              "STANDALONE, NGRAM, not 'DFLASH'; nothing was changed")
    for version in ("0.5.16", "0.5.23"):
        assert _release(version).find("speculative_algorithm").choices is None
        _release(version).check("speculative_algorithm", "DFLASH")


def test_choices_by_constant_name_are_resolved() -> None:
    # choices=LOAD_FORMAT_CHOICES: a module-level list (0.5.8 server_args.py, 0.5.23 arg_groups/choices.py)
    for version in VERSIONS:
        choices = _release(version).find("speculative_draft_load_format").choices
        assert choices is not None and "safetensors" in choices and "dummy" in choices
    assert "fa3" in (_release("0.5.8").find("attention_backend").choices or ())


@pytest.mark.parametrize("name, value, words", [
    ("speculative_num_stepz", "3", "has no launch flag speculative_num_stepz (closest: speculative_num_steps"),
    ("--speculative-num-steps", "three", "--speculative-num-steps takes an int, not 'three'"),
    ("speculative_ngram_match_type", "DFS", "takes BFS, PROB, not 'DFS'"),
    ("disable_overlap_schedule", "maybe", "is a switch: give true or false"),
])
def test_refusals_are_one_line_naming_what_the_release_has(name: str, value: str, words: str) -> None:
    with pytest.raises(GpuopsError) as exc:
        _release("0.5.16").check(name, value)
    assert words in str(exc.value) and "\n" not in str(exc.value) and "nothing was changed" in str(exc.value)


def test_launch_words() -> None:
    release = _release("0.5.16")
    assert launch_words(release.check("speculative_num_steps", "3"), "3") == ["--speculative-num-steps", "3"]
    assert launch_words(release.check("--speculative-draft-model", "/m"), "/m") == ["--speculative-draft-model-path", "/m"]
    assert launch_words(release.check("disable_overlap_schedule", "true"), "true") == ["--disable-overlap-schedule"]
    assert launch_words(release.check("disable_overlap_schedule", "false"), "false") == []


def test_a_host_whose_flags_cannot_be_read_is_one_line() -> None:
    with pytest.raises(GpuopsError, match=r"^tune: gpu0: no SGLang found for python python3: .*$"):
        ReleaseFlags.from_answer("gpu0", {"ok": False, "error": "no SGLang found for python python3: x"})


def test_the_reader_runs_on_a_host_s_python38_as_shipped(tmp_path) -> None:
    """The helper as gpuops sends it (bundled, on stdin) under Python 3.8, for a python that has no
    server running: the inventory's python and PYTHONPATH find the release. A 3.8 parser cannot read
    0.5.16's newer syntax in some sources: those are named, never silently missing."""
    import subprocess

    from labtools import require_python

    from gpuops.shipping import python_command, python_stdin

    py38 = require_python("3.8")
    site = str(sglang_site("0.5.16"))
    payload = {"port": 1, "python": py38, "pythonpath": site}
    done = subprocess.run(["sh", "-c", python_command(py38)], input=python_stdin("sglang_flags", payload),
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert answer["ok"] and answer["version"] == "0.5.16" and answer["running"] is False
    assert answer["python"].startswith("3.8")
    assert answer["unread"] == [] and answer["flags"] == _answer("0.5.16")["flags"]  # 3.8 reads them all
    release = ReleaseFlags.from_answer("gpu0", answer)
    assert release.check("speculative_ngram_match_type", "PROB").flag == "--speculative-ngram-match-type"


def test_a_source_the_host_python_cannot_parse_is_named_in_the_refusal() -> None:
    unread: list[str] = []
    flags = parser_flags({"srt/server_args.py": 'p.add_argument("--model-path")\np.add_argument("--port", type=int)\n',
                          "srt/arg_groups/fields/spec.py": "match x:\n    case 1: pass\n" + "def f(:\n"}, unread)
    assert set(flags) == {"--model-path", "--port"} and unread == ["srt/arg_groups/fields/spec.py"]
    release = ReleaseFlags.from_answer("gpu0", {"ok": True, "version": "0.5.23", "flags": flags, "python": "3.8.18",
                                                "unread": ["arg_groups/fields/spec.py"]})
    with pytest.raises(GpuopsError) as exc:
        release.find("speculative_num_steps")
    assert ("python 3.8.18 there could not parse 1 of its argument sources, e.g. arg_groups/fields/spec.py: "
            "set gpuops_python to the server's python") in str(exc.value)
