"""How redis-server reaches the offline GPU host (contrib/gpu-host/redis-site.sh): staged
here as Debian's .debs, unpacked there with a wrapper that runs it against the carried
libraries, found by the suite on PATH. Exercised with small .debs built here and a fake
apt-get (the script's shellcheck is test_gpu_host_kit's)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parents[1] / "contrib" / "gpu-host"
SCRIPT = KIT / "redis-site.sh"
PACKAGES = ("redis-server", "redis-tools", "liblzf1", "libjemalloc2")
FAKE_REDIS = ('#!/bin/sh\necho "Redis server v=7.0.15 malloc=jemalloc-5.3.0"\n'
              'echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"\necho "ARGV0=$0"\n')


def _deb(out: Path, package: str, files: dict[str, str], links: dict[str, str]) -> None:
    root = out.parent / f"build-{package}"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {package}\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@t>\n"
        "Description: test\n")
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    for name, target in links.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).symlink_to(target)
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root),
                    str(out / f"{package}_1_amd64.deb")], check=True, capture_output=True)


def _debs(tmp_path: Path, redis: str = FAKE_REDIS, skip: str = "") -> Path:
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not installed (Debian's dpkg)")
    out = tmp_path / "redis"
    out.mkdir()
    lib = "usr/lib/x86_64-linux-gnu"
    contents = {
        "redis-server": ({}, {"usr/bin/redis-server": "redis-check-rdb"}),
        "redis-tools": ({"usr/bin/redis-check-rdb": redis}, {}),
        "liblzf1": ({f"{lib}/liblzf.so.1": ""}, {}),
        "libjemalloc2": ({f"{lib}/libjemalloc.so.2": ""}, {}),
    }
    for package, (files, links) in contents.items():
        if package != skip:
            _deb(out, package, files, links)
    return out


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True,
                          check=False, env=env, timeout=60)


def test_install_runs_redis_against_the_carried_libraries(tmp_path: Path) -> None:
    dest = tmp_path / "site"
    out = _run("install", str(_debs(tmp_path)), str(dest))
    assert out.returncode == 0, out.stderr
    assert (dest / "usr" / "lib" / "x86_64-linux-gnu" / "liblzf.so.1").exists()
    run = subprocess.run([str(dest / "bin" / "redis-server"), "--port", "1"],
                         capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/old"})
    assert run.stdout.splitlines() == [
        "Redis server v=7.0.15 malloc=jemalloc-5.3.0",
        f"LD_LIBRARY_PATH={dest}/usr/lib/x86_64-linux-gnu:{dest}/lib/x86_64-linux-gnu:/old",
        f"ARGV0={dest}/usr/bin/redis-server"]  # the server's name: not redis-check-rdb
    assert out.stdout.splitlines()[0] == "Redis server v=7.0.15 malloc=jemalloc-5.3.0"


def test_a_package_missing_from_the_bundle_is_named(tmp_path: Path) -> None:
    dest = tmp_path / "site"
    out = _run("install", str(_debs(tmp_path, skip="liblzf1")), str(dest))
    assert out.returncode == 1
    assert out.stderr.strip() == (f"liblzf1: no .deb in {tmp_path / 'redis'} "
                                  "(redis-site.sh stage)")
    assert not dest.exists()


def test_a_binary_that_cannot_load_its_libraries_fails_the_install(tmp_path: Path) -> None:
    broken = ('#!/bin/sh\necho "redis-server: error while loading shared libraries: '
              'libssl.so.3: cannot open shared object file" >&2\nexit 127\n')
    out = _run("install", str(_debs(tmp_path, redis=broken)), str(tmp_path / "site"))
    assert out.returncode == 1
    assert "the unpacked redis-server does not run here:" in out.stderr
    assert "libssl.so.3: cannot open shared object file" in out.stderr


def _fake_apt(tmp_path: Path, makes: tuple[str, ...]) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "apt-get"
    touches = " ".join(f"{p}_1_amd64.deb" for p in makes)
    fake.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/apt-args\ntouch {touches}\n')
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_stage_downloads_the_server_and_the_libraries_the_image_lacks(tmp_path: Path) -> None:
    out = _run("stage", str(tmp_path / "stage"), env=_fake_apt(tmp_path, PACKAGES))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "apt-args").read_text().split() == ["download", *PACKAGES]
    assert sorted(p.name for p in (tmp_path / "stage" / "redis").iterdir()) == sorted(
        f"{p}_1_amd64.deb" for p in PACKAGES)


def test_stage_fails_naming_a_package_apt_did_not_fetch(tmp_path: Path) -> None:
    out = _run("stage", str(tmp_path / "stage"), env=_fake_apt(tmp_path, PACKAGES[:3]))
    assert out.returncode == 1
    assert out.stderr.strip() == f"libjemalloc2: no .deb staged in {tmp_path}/stage/redis"


@pytest.mark.parametrize("argv", [[], ["install"], ["stage"], ["frobnicate", "x"]])
def test_bad_usage_exits_2(argv: list[str]) -> None:
    out = _run(*argv)
    assert out.returncode == 2 and out.stderr.startswith("usage:")


def test_a_suite_run_finds_the_installed_redis_on_path(tmp_path: Path) -> None:
    site = tmp_path / "redis-site"
    (site / "bin").mkdir(parents=True)
    (site / "bin" / "redis-server").write_text("#!/bin/sh\n")
    (site / "bin" / "redis-server").chmod(0o755)
    fake = tmp_path / "python3"
    fake.write_text('#!/bin/sh\necho "PATH=$PATH"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin", "SHAREDKV_REDIS_SITE": str(site)}
    out = subprocess.run(["bash", str(KIT / "lmcache-site.sh"), "run", "0.5.6"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"PATH={site}/bin:{tmp_path}:/usr/bin:/bin"
    env["SHAREDKV_REDIS_SITE"] = str(tmp_path / "none")
    out = subprocess.run(["bash", str(KIT / "lmcache-site.sh"), "run", "0.5.6"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"PATH={tmp_path}:/usr/bin:/bin"
