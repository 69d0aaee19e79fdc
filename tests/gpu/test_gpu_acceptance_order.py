"""The GPU acceptance run's queue and wheels, on the CPU (no GPU needed): which parts run first (a failed part whose
code changed since, the new ones, the stale ones, then the rest), read from fake results and a fake git history; the
digest each run records; the carried wheels installed with ``--no-deps`` into a target; the part declarations and
the committed bar. The run itself is exercised at its smoke size by tests/test_benchmarks.py."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIT = shutil.which("git") is not None


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The modules of ``benchmarks/`` this file tests (the repository root on ``sys.path`` for the test only)."""
    monkeypatch.syspath_prepend(str(ROOT))
    names = ("gpu_queue", "gpu_acceptance", "gpu_acceptance_tables")
    return SimpleNamespace(**{name: importlib.import_module(f"benchmarks.{name}") for name in names})


def result(date: str, parts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A result of the run as the GPU writes it, with ``parts``' checks."""
    return {"benchmark": "gpu_acceptance", "size": "full", "date": date, "command": "python -m benchmarks.x",
            "device": {"type": "cuda", "gpu": "NVIDIA H200"}, "parts": parts, **extra}


def part(*marks: bool | None, **extra: Any) -> dict[str, Any]:
    return {"checks": [{"check": f"c{number}", "passed": mark} for number, mark in enumerate(marks)], **extra}


def write(folder: Path, name: str, payload: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(payload))


# --- the runs -------------------------------------------------------------------------------------------------


def test_each_part_s_newest_run_is_read_with_its_own_date(bench: Any, tmp_path: Path) -> None:
    old = result("2026-11-26T01:00:00+00:00", {"a": part(True), "b": part(True, False), "c": part(None)})
    kept = result("2026-11-28T02:00:00+00:00", {"a": part(False), "b": part(True)},
                  kept_from={"date": "2026-11-27T00:00:00+00:00", "parts": ["b"]})
    stopped = {"check": "x ran to the end", "passed": False, "error": "stopped at its limit of 30 s"}
    late = result("2026-11-29T00:00:00+00:00", {"a": {"not_started": True, **part(None)},
                                                "d": {"unavailable": "not here", **part(None)},
                                                "e": part(True, date="2026-11-28T23:00:00+00:00"),
                                                "f": {"checks": [{"check": "c", "passed": True}, stopped],
                                                      "cut": "stopped", "cut_by_deadline": True},
                                                "g": {"checks": [{"check": "c", "passed": False}, stopped],
                                                      "cut": "stopped", "cut_by_deadline": True},
                                                "h": {"checks": [{"check": "c", "passed": True}, stopped],
                                                      "cut": "stopped"}})
    cpu = {**result("2026-11-30T00:00:00+00:00", {"a": part(True)}), "device": {"type": "cpu"}}
    smoke = {**result("2026-11-30T00:00:00+00:00", {"a": part(True)}), "size": "smoke"}
    for name, payload in (("1.json", old), ("2.json", kept), ("3.json", late), ("4.json", cpu), ("5.json", smoke)):
        write(tmp_path / "results", name, payload)
    write(tmp_path / "shared" / "run", "old-copy.json", old)  # the same run kept in two places counts once
    (tmp_path / "results" / "other.json").write_text(json.dumps({"benchmark": "cuda_truth"}))

    runs = bench.gpu_queue.history([tmp_path / "results", tmp_path / "shared", tmp_path / "absent"])
    latest = bench.gpu_queue.newest(runs)

    assert sorted(runs) == ["a", "b", "c", "e", "f", "g", "h"] and len(runs["a"]) == 2  # not started, unavailable,
    # CPU, smoke: out
    # cut by the run's deadline: judged by what it printed; cut at its own limit: failed
    assert [latest[name].verdict for name in "fgh"] == ["not judged", "failed", "failed"]
    assert (latest["a"].verdict, latest["a"].source) == ("failed", "2.json")
    assert (latest["b"].verdict, latest["b"].date) == ("passed", "2026-11-27T00:00:00+00:00")  # the kept run's date
    assert latest["c"].verdict == "not judged" and latest["e"].date == "2026-11-28T23:00:00+00:00"
    assert (latest["a"].passed, latest["a"].failed, latest["a"].device) == (0, 1, "NVIDIA H200")


def test_the_queue_puts_failed_and_changed_parts_first_then_new_then_stale(bench: Any) -> None:
    run = bench.gpu_queue.PartRun
    latest = {"ok_same": run("ok_same", "2026-11-27T00:00:00", "passed", 3, 0, "H200", "r.json"),
              "ok_moved": run("ok_moved", "2026-11-27T00:00:00", "passed", 3, 0, "H200", "r.json"),
              "bad_same": run("bad_same", "2026-11-27T00:00:00", "failed", 2, 1, "H100", "r.json"),
              "bad_moved": run("bad_moved", "2026-11-27T00:00:00", "failed", 2, 1, "H100", "r.json"),
              "unknown": run("unknown", "2026-11-27T00:00:00", "passed", 1, 0, "H100", "r.json"),
              "unjudged": run("unjudged", "2026-11-27T00:00:00", "not judged", 0, 0, "H100", "r.json")}
    moved = {"ok_same": False, "ok_moved": True, "bad_same": False, "bad_moved": True, "unknown": None}
    asked = []

    def changed(name: str, found: Any) -> tuple[bool | None, str]:
        asked.append(name)
        assert found is latest[name]
        return moved[name], f"told {name}"

    order = ("ok_same", "bad_same", "new", "ok_moved", "unjudged", "unknown", "bad_moved")
    queued = bench.gpu_queue.queue(order, latest, changed)
    assert [(q.part, q.tier) for q in queued] == [
        ("bad_moved", 0), ("new", 1), ("unjudged", 1), ("ok_moved", 2), ("unknown", 2), ("bad_same", 3),
        ("ok_same", 4)]
    assert sorted(asked) == sorted(moved)  # a part never run or never judged needs no answer about its code
    assert queued[0].why.startswith("failed on H100") and queued[0].why.endswith("told bad_moved")
    assert queued[1].why == "never run on a GPU" and "r.json" in queued[2].why
    assert queued[0].as_json()["tier_name"] == "failed, changed since"


def test_a_digest_says_whether_a_part_s_code_changed_without_git(bench: Any, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("a = 1\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "b.py").write_text("b = 1\n")
    queue = bench.gpu_queue
    before = queue.code_digest(["pkg", "b.py"], tmp_path)
    (tmp_path / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\1")  # bytecode is no code
    assert queue.code_digest(["pkg", "b.py"], tmp_path) == before
    state = queue.CodeState(tmp_path, prepared={})
    assert state.git is False  # tmp_path is no repository
    ran = queue.PartRun("p", "2026-11-27T00:00:00+00:00", "passed", 1, 0, "H200", "r.json", digest=before)
    assert state.changed("p", ["pkg", "b.py"], ran)[0] is False
    (tmp_path / "pkg" / "a.py").write_text("a = 2\n")
    assert queue.CodeState(tmp_path, prepared={}).changed("p", ["pkg", "b.py"], ran)[0] is True
    (tmp_path / "pkg" / "c.py").write_text("")  # a new file under a folder a part checks changes its code too
    assert queue.code_digest(["pkg"], tmp_path) != queue.code_digest(["pkg/a.py"], tmp_path)
    old = queue.PartRun("p", "2026-11-27T00:00:00+00:00", "passed", 1, 0, "H200", "r.json")  # no digest, no git
    moved, why = queue.CodeState(tmp_path, prepared={}).changed("p", ["b.py"], old)
    assert moved is None and why.startswith("unknown")


def test_without_git_the_verdict_prepare_wrote_for_the_same_code_and_run_is_used(bench: Any, tmp_path: Path) -> None:
    (tmp_path / "b.py").write_text("b = 1\n")
    queue = bench.gpu_queue
    digest = queue.code_digest(["b.py"], tmp_path)
    run = queue.PartRun("p", "2026-11-27T00:00:00+00:00", "passed", 1, 0, "H200", "r.json")
    prepared = {"written": "2026-11-29", "parts": {"p": {"digest": digest, "run": run.date, "changed": False,
                                                         "why": "no commit since abc touches its paths"}}}
    moved, why = queue.CodeState(tmp_path, prepared=prepared).changed("p", ["b.py"], run)
    assert moved is False and "as --prepare found it" in why
    newer = queue.PartRun("p", "2026-11-28T00:00:00+00:00", "passed", 1, 0, "H200", "r.json")  # another run
    assert queue.CodeState(tmp_path, prepared=prepared).changed("p", ["b.py"], newer)[0] is None
    (tmp_path / "b.py").write_text("b = 2\n")  # other code than --prepare saw
    assert queue.CodeState(tmp_path, prepared=prepared).changed("p", ["b.py"], run)[0] is None


def commit(repo: Path, files: dict[str, str], date: str, message: str) -> None:
    for name, text in files.items():
        (repo / name).write_text(text)
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "commit", "-q", "-m", message], check=True, env=env)


@pytest.mark.skipif(not GIT, reason="needs git")
def test_an_old_run_is_compared_with_the_last_commit_before_it_through_git(bench: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit(repo, {"a.py": "a = 1\n", "b.py": "b = 1\n"}, "2026-11-20T00:00:00+00:00", "first")
    commit(repo, {"a.py": "a = 2\n"}, "2026-11-22T00:00:00+00:00", "a fix, before the run")
    commit(repo, {"b.py": "b = 2\n"}, "2026-11-24T00:00:00+00:00", "b changed after the run")
    queue = bench.gpu_queue
    run = queue.PartRun("p", "2026-11-23T00:00:00+00:00", "failed", 1, 1, "H200", "r.json")
    state = queue.CodeState(repo, prepared={})
    assert state.git is True
    before = state.commit_before(run.date)
    assert before == queue.git(repo, "rev-parse", "HEAD~1")
    assert state.changed("p", ["a.py"], run) == (False, f"no commit since {before[:7]} (the last commit before it) "
                                                        "touches its paths")
    moved, why = state.changed("p", ["b.py"], run)
    assert moved is True and why.startswith("1 commit(s) since") and queue.git(repo, "rev-parse", "--short",
                                                                               "HEAD") in why
    first = queue.git(repo, "rev-list", "--max-parents=0", "HEAD")
    recorded = queue.PartRun("p", "2026-11-25T00:00:00+00:00", "passed", 1, 0, "H200", "r.json", commit=first)
    assert state.changed("p", ["a.py"], recorded)[0] is True  # a recorded commit counts, not the run's date
    ancient = queue.PartRun("p", "2026-11-01T00:00:00+00:00", "passed", 1, 0, "H200", "r.json")
    assert state.changed("p", ["a.py"], ancient)[0] is None  # no commit before the run: unknown
    here = queue.head(repo)
    assert here["commit"] == queue.git(repo, "rev-parse", "HEAD") and here["changed_files"] == []
    (repo / "a.py").write_text("a = 3\n")
    assert queue.head(repo)["changed_files"] == ["a.py"]


@pytest.mark.skipif(not GIT, reason="needs git")
def test_prepare_writes_what_the_gpu_machine_reads_without_git(bench: Any, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    commit(repo, {"a.py": "a = 1\n"}, "2026-11-20T00:00:00+00:00", "first")
    write(repo / "benchmarks" / "results", "gpu_acceptance-cuda-x.json",
          result("2026-11-21T00:00:00+00:00", {"p": part(True), "q": part(False)}))
    commit(repo, {"a.py": "a = 2\n"}, "2026-11-22T00:00:00+00:00", "a changed")
    queue = bench.gpu_queue
    written = queue.write_checkout(["p", "q", "new"], {"p": ["a.py"], "q": ["absent.py"], "new": ["a.py"]}, repo)
    assert written["commit"] == queue.git(repo, "rev-parse", "HEAD")
    assert written["parts"]["p"]["changed"] is True and written["parts"]["q"]["changed"] is False
    assert "run" not in written["parts"]["new"]  # never run: nothing to compare
    shutil.rmtree(repo / ".git")  # as the GPU machine gets the tree
    assert queue.head(repo)["commit"] == written["commit"] and queue.head(repo)["commit_from"].startswith(".gpu")
    state = queue.CodeState(repo)
    assert state.git is False
    latest = queue.newest(queue.history([repo / "benchmarks" / "results"]))
    assert state.changed("p", ["a.py"], latest["p"])[0] is True
    assert state.changed("q", ["absent.py"], latest["q"])[0] is False


def test_the_run_records_what_the_next_run_s_queue_compares(bench: Any, tmp_path: Path) -> None:
    acceptance = bench.gpu_acceptance
    stamp = acceptance.stamp(acceptance.BY_NAME["fp8"], "abc1234")
    assert stamp["commit"] == "abc1234" and stamp["code_digest"] == bench.gpu_queue.code_digest(
        acceptance.BY_NAME["fp8"].checks, ROOT)
    write(tmp_path, "gpu_acceptance-cuda-x.json", result(stamp["date"], {"fp8": {**part(True), **stamp}}))
    latest = bench.gpu_queue.newest(bench.gpu_queue.history([tmp_path]))
    assert latest["fp8"].digest == stamp["code_digest"] and latest["fp8"].commit == "abc1234"
    queued = acceptance.plan_queue([tmp_path], state=bench.gpu_queue.CodeState(ROOT, prepared={}))
    assert {q.part: q.tier for q in queued}["fp8"] == 4  # passed on the code there is now: last
    assert [q.part for q in queued if q.tier == 1][:2] == [p.name for p in acceptance.PARTS if p.name != "fp8"][:2]
    listed = acceptance.plan_queue([tmp_path], ["fp8", "boundary"], state=bench.gpu_queue.CodeState(ROOT, prepared={}))
    assert [(q.part, q.tier) for q in listed] == [("fp8", 4), ("boundary", 1)]


# --- the wheels -----------------------------------------------------------------------------------------------


def make_wheel(folder: Path, dist: str, version: str, module: str) -> Path:
    """A pure-Python wheel of ``dist`` at ``version`` holding ``module`` (``VALUE = version``)."""
    info = f"{dist.replace('-', '_')}-{version}.dist-info"
    path = folder / f"{dist.replace('-', '_')}-{version}-py3-none-any.whl"
    files = {f"{module}/__init__.py": f"VALUE = {version!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


def test_the_carried_wheels_are_installed_with_no_deps_into_a_target_on_the_path(
    bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = bench.gpu_queue
    monkeypatch.setitem(queue.WHEELS, "memlab-fake-wheel", "1.2.3")
    monkeypatch.setitem(queue.WHEELS, "memlab-absent-wheel", "0.1")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    make_wheel(tmp_path / "wheels", "memlab-fake-wheel", "1.2.3", "memlab_fake_wheel")
    make_wheel(tmp_path / "wheels", "memlab-fake-wheel", "9.9.9", "memlab_fake_wheel")  # not the pinned release
    said = queue.install(["memlab-fake-wheel", "memlab-absent-wheel"], tmp_path / "wheels", tmp_path / "site")
    assert said[0].startswith("memlab-absent-wheel 0.1: not carried") and "none is installed" in said[0]
    assert said[1].startswith(f"installed with --no-deps into {tmp_path / 'site'}")
    assert "memlab_fake_wheel-1.2.3-py3-none-any.whl" in said[1] and "9.9.9" not in said[1]
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "site"), "/elsewhere"]
    assert importlib.import_module("memlab_fake_wheel").VALUE == "1.2.3"
    assert queue.installed("memlab-fake-wheel") == "1.2.3"
    assert queue.install(["memlab-fake-wheel"], tmp_path / "wheels", tmp_path / "site") == []  # there already
    sys.modules.pop("memlab_fake_wheel", None)


def test_bitsandbytes_wheel_keeps_the_cuda_major_the_gpu_image_s_torch_loads(bench: Any, tmp_path: Path) -> None:
    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    names = ["bitsandbytes/__init__.py", *(f"bitsandbytes/libbitsandbytes_{kind}.so" for kind in (
        "cpu", "cuda130", "cuda132", "cuda128", "rocm72", "xpu2025"))]
    record = "bitsandbytes-0.50.2.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as made:
        for name in names:
            made.writestr(name, "x")
        made.writestr(record, "".join(f"{name},sha256=x,1\n" for name in [*names, record]))
    removed = bench.gpu_queue.slim_bitsandbytes(wheel)
    assert sorted(removed) == sorted(names[4:])
    with zipfile.ZipFile(wheel) as slim:
        assert sorted(slim.namelist()) == sorted([*names[:4], record])
        assert slim.read(record).decode().splitlines() == [f"{name},sha256=x,1" for name in names[:4]] + [
            f"{record},sha256=x,1"]
    assert bench.gpu_queue.slim_bitsandbytes(wheel) == []  # slim already


# --- the declarations -----------------------------------------------------------------------------------------


def test_every_part_is_declared_once_with_paths_that_exist_and_wheels_that_are_pinned(bench: Any) -> None:
    acceptance = bench.gpu_acceptance
    names = [part.name for part in acceptance.PARTS]
    assert len(set(names)) == len(names) and acceptance.ORDER == tuple(names)
    runners = {"pytest", "hf_table"}
    for part in acceptance.PARTS:
        assert part.name in acceptance.SECTIONS or part.name in runners or part.provided_by, part.name
        assert 30 <= part.limit_s <= 300 and part.checks, part.name
        assert set(part.needs) <= set(bench.gpu_queue.WHEELS), part.name
        provided = part.provided_by and part.provided_by.split(":")[0].replace(".", "/") + ".py"
        missing = [path for path in part.checks if not (ROOT / path).exists() and path != provided]
        assert missing == [], (part.name, missing)  # a moved module is a path to declare again
    assert set(bench.gpu_queue.BASE) <= set(bench.gpu_queue.WHEELS)
    # issue 86's first parts, in its order: the failed ones, then the new ones
    assert names[:6] == ["boundary", "heldout", "cast_reserve", "fp8", "grpo_1024", "grpo_8b"]


def test_a_part_another_issue_provides_is_skipped_with_why_until_its_module_exists(
    bench: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    acceptance = bench.gpu_acceptance
    published = acceptance.BY_NAME["published"]
    module = published.provided_by.split(":")[0]
    if importlib.util.find_spec(module) is not None:
        assert acceptance.unavailable("published") is None
        assert callable(acceptance.section_function("published"))
        return
    why = acceptance.unavailable("published")
    assert why is not None and "issue 83" in why and "gpu_sections_published.py" in why
    import torch

    skipped = acceptance.run_section_here("published", "smoke", torch.device("cpu"))
    assert skipped["unavailable"] == why and [c["passed"] for c in skipped["checks"]] == [None]
    assert acceptance.unavailable("fp8") is None


def test_the_device_command_fits_the_tool_and_names_what_it_carries(bench: Any) -> None:
    command = bench.gpu_acceptance.DEVICE_COMMAND
    assert len(command) <= 2000 and "\n" not in command
    assert "python3 -m benchmarks.gpu_acceptance --full --out $OUT" in command and "tee $OUT/log" in command
    assert bench.gpu_queue.CARRIED.name == ".gpu" and "/.gpu/" in (ROOT / ".gitignore").read_text().splitlines()
    doc = bench.gpu_acceptance.__doc__
    assert 'carry=[".gpu"]' in doc and "timeout_s=600" in doc
    # no part starts after the deadline and none runs past it: with the wheels' install and the imports (about 30 s)
    # the command ends within 9 minutes, under the tool's 10 a command
    assert bench.gpu_acceptance.DEADLINE + 30 <= 9 * 60


@pytest.mark.skipif(not GIT, reason="needs git (the commits of runs that recorded none)")
def test_the_committed_bar_is_every_part_s_newest_committed_result(bench: Any) -> None:
    if bench.gpu_queue.git(ROOT, "rev-parse", "--is-shallow-repository") != "false":
        pytest.skip("a shallow clone: the commits before old runs are not all here")
    committed = json.loads((ROOT / "benchmarks" / "results" / "gpu_acceptance_bar.json").read_text())
    made = bench.gpu_acceptance.bar()
    assert committed == json.loads(json.dumps(made)), "write it again: python -m benchmarks.gpu_acceptance --bar"
    rows = {row["part"]: row for row in made["rows"]}
    assert set(rows) >= set(bench.gpu_acceptance.ORDER)
    for path in sorted((ROOT / "benchmarks" / "results").glob("gpu_acceptance-cuda-*.json")):
        for name, found in json.loads(path.read_text())["parts"].items():
            if not found.get("not_started") and not found.get("unavailable"):
                assert rows[name].get("date"), name  # every part ever run has its newest result in the bar
