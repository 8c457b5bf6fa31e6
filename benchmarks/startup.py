"""What the plugin costs a downstream project that has no sharedkv tests.

Builds a throwaway project (a few plain tests, pytest's cache on, as a real project has),
then runs plain ``pytest tests`` in it (default verbosity, so a header would show) with the
plugin and with ``-p no:sharedkv``, interleaved (so machine noise hits both alike), and
prints the median added milliseconds. It does this twice: on this machine as it is, and
with a fake, slow ``nvidia-smi`` first on PATH (a shell script that sleeps, prints one GPU
line and records that it was called), so a host with a driver is covered on a machine
without one. Each mode also says whether the plugin ran nvidia-smi, wrote into the
project's ``.pytest_cache`` or printed a line. Where valgrind is installed it also counts
the instructions one start executes with and without the plugin (cachegrind, a fixed hash
seed): a count that a busy machine does not move, where wall and CPU time do.

    python benchmarks/startup.py [--rounds 21] [--python PATH] [--no-instructions]

Timing is this script's job, not a test's: a 2-core CI machine shared with other jobs
makes a timed test flaky. ``tests/test_startup.py`` checks the silence (no subprocess, no
files, no output), which does not depend on load.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_MS = 30.0
FAKE_SMI = """#!/bin/sh
echo called >> "{calls}"
sleep {sleep}
echo "0, NVIDIA H200, 143771, 140000, GPU-00000000-1111-2222-3333-444444444444"
"""
TESTS = "def test_one():\n    pass\n\n\ndef test_two():\n    assert 1 + 1 == 2\n"


def make_project(root: Path) -> Path:
    project = root / "downstream"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text('[project]\nname = "downstream"\nversion = "0"\n')
    tests = project / "tests"
    tests.mkdir()
    (tests / "test_plain.py").write_text(TESTS)
    return project


def make_fake_smi(root: Path, sleep_s: float) -> tuple[Path, Path]:
    bindir = root / "fake-bin"
    bindir.mkdir()
    calls = root / "nvidia-smi-calls"
    smi = bindir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(calls=calls, sleep=sleep_s))
    smi.chmod(0o755)
    return bindir, calls


def cache_files(project: Path) -> set[str]:
    cache = project / ".pytest_cache"
    return {str(p.relative_to(cache)) for p in cache.rglob("*")} if cache.exists() else set()


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(python: str, project: Path, env: dict[str, str], extra: list[str]
        ) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of pytest and its children, stdout) of one pytest run."""
    cpu = _cpu_s()
    started = time.perf_counter()
    out = subprocess.run([python, "-m", "pytest", "tests", *extra], cwd=project, env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"pytest {' '.join(extra)} exited {out.returncode}:\n{out.stdout}"
                         f"{out.stderr}")
    return wall, _cpu_s() - cpu, out.stdout


def instructions(python: str, project: Path, env: dict[str, str], extra: list[str]
                 ) -> int | None:
    """Instructions one pytest start executes (valgrind's cachegrind), or None without
    valgrind."""
    import re
    import shutil

    valgrind = shutil.which("valgrind", path=env.get("PATH"))
    if valgrind is None:
        return None
    out = subprocess.run([valgrind, "--tool=cachegrind", "--cache-sim=no",
                          "--cachegrind-out-file=/dev/null", python, "-m", "pytest", "tests",
                          *extra], cwd=project, env={**env, "PYTHONHASHSEED": "0"},
                         capture_output=True, text=True, timeout=600, check=False)
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    return int(found.group(1).replace(",", "")) if found else None


def measure(python: str, project: Path, env: dict[str, str], rounds: int
            ) -> dict[str, object]:
    run(python, project, env, ["-p", "no:sharedkv"])  # warm the page cache, fill pytest's
    before = cache_files(project)  # own cache: what the plugin adds is measured against it
    walls: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    printed: set[str] = set()
    for i in range(rounds):
        order = (True, False) if i % 2 == 0 else (False, True)
        for plugin in order:
            wall, cpu, stdout = run(python, project, env, [] if plugin else ["-p", "no:sharedkv"])
            walls[plugin].append(wall)
            cpus[plugin].append(cpu)
            if plugin:
                printed |= {line for line in stdout.splitlines() if line.startswith("sharedkv")}

    def added_ms(samples: dict[bool, list[float]]) -> float:
        """Median of the per-pair differences (each pair ran back to back)."""
        return statistics.median((w - o) * 1000 for w, o in zip(samples[True], samples[False],
                                                                strict=True))

    return {
        "median_with_ms": statistics.median(walls[True]) * 1000,
        "median_without_ms": statistics.median(walls[False]) * 1000,
        "median_added_ms": added_ms(walls),
        "median_added_cpu_ms": added_ms(cpus),
        "new_cache_files": sorted(cache_files(project) - before),
        "printed": sorted(printed),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="interleaved pairs (>= 15)")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter whose pytest and plugin to measure")
    parser.add_argument("--smi-sleep", type=float, default=0.5,
                        help="seconds the fake nvidia-smi sleeps")
    parser.add_argument("--no-instructions", dest="instructions", action="store_false",
                        help="skip the instruction count (valgrind)")
    args = parser.parse_args(argv)
    # PYTHONDONTWRITEBYTECODE would make every run compile the plugin from source: users
    # have .pyc caches (pip writes them; an editable install writes them on first import).
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("PYTEST_", "SHAREDKV_"))
                and k not in ("CUDA_VISIBLE_DEVICES", "PYTHONDONTWRITEBYTECODE")}
    with tempfile.TemporaryDirectory(prefix="sharedkv-startup-") as tmp:
        root = Path(tmp)
        bindir, calls = make_fake_smi(root, args.smi_sleep)
        modes = {
            "this machine": base_env,
            f"fake nvidia-smi ({args.smi_sleep:g} s)": {
                **base_env, "PATH": f"{bindir}{os.pathsep}{base_env.get('PATH', '')}"},
        }
        worst = 0.0
        print(f"plugin start-up cost in a downstream project with no sharedkv tests "
              f"({args.rounds} interleaved pairs, {args.python})")
        for index, (name, env) in enumerate(modes.items()):
            project = make_project(root / f"mode-{index}")
            calls.unlink(missing_ok=True)
            result = measure(args.python, project, env, args.rounds)
            smi_calls = len(calls.read_text().splitlines()) if calls.exists() else 0
            worst = max(worst, float(result["median_added_ms"]))  # type: ignore[arg-type]
            print(f"  {name}: median added {result['median_added_ms']:.1f} ms wall, "
                  f"{result['median_added_cpu_ms']:.1f} ms CPU "
                  f"(with {result['median_with_ms']:.0f} ms, without "
                  f"{result['median_without_ms']:.0f} ms); nvidia-smi calls: {smi_calls}; "
                  f"new .pytest_cache files: {result['new_cache_files'] or 'none'}; "
                  f"sharedkv lines printed: {result['printed'] or 'none'}")
            if args.instructions:
                counts = [instructions(args.python, project, env, extra)
                          for extra in ([], ["-p", "no:sharedkv"])]
                if None in counts:
                    print(f"  {name}: no instruction count (valgrind not found or failed)")
                else:
                    added = counts[0] - counts[1]  # type: ignore[operator]
                    print(f"  {name}: instructions added {added / 1e6:.1f} M "
                          f"({100 * added / counts[1]:.1f}% of a start without the plugin, "
                          f"{counts[1] / 1e6:.0f} M)")
        verdict = "within" if worst <= BUDGET_MS else "OVER"
        print(f"worst median added: {worst:.1f} ms ({verdict} the {BUDGET_MS:g} ms budget)")
    return 0 if worst <= BUDGET_MS else 1


if __name__ == "__main__":
    sys.exit(main())
