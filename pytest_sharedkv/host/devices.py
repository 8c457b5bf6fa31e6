"""GPU discovery that never initialises CUDA in this process.

Counting devices through torch would create a CUDA context before each xdist worker has
set ``CUDA_VISIBLE_DEVICES`` to its lease, so discovery asks ``nvidia-smi`` (a separate
process) instead, and falls back to ``/proc/driver/nvidia/gpus``.

Test seam: ``SHAREDKV_FAKE_GPUS`` names fake devices ("0,1", or "0:80,1:40" with free GiB,
or "0:140:9.0" with free GiB and compute capability)
so the lease and gating logic can be tested on machines without a GPU. Fake devices are
never reported as hardware results: tiers that need CUDA check torch after binding.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

FAKE_GPUS_ENV = "SHAREDKV_FAKE_GPUS"
NVIDIA_SMI_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Gpu:
    token: str  # what CUDA_VISIBLE_DEVICES takes: an index or a UUID
    name: str
    total_mib: int | None = None
    free_mib: int | None = None
    uuid: str | None = None
    fake: bool = False
    compute_cap: float | None = None  # e.g. 9.0 (H100/H200); fake devices: from the spec

    @property
    def lock_key(self) -> str:
        """What its lease locks: the UUID where known (one name for one device, whatever
        index a run sees it under), else the index; fake devices never lock real ones."""
        if self.fake:
            return f"fake-{self.token}"
        return self.uuid or f"index-{self.token}"

    @property
    def free_gib(self) -> float | None:
        return None if self.free_mib is None else self.free_mib / 1024


@dataclass(frozen=True)
class Discovery:
    gpus: tuple[Gpu, ...]
    source: str  # where the list came from, for skip reasons and the report header
    fake: bool = False
    note: str = ""

    @property
    def count(self) -> int:
        return len(self.gpus)

    def describe(self) -> str:
        if not self.gpus:
            return f"no CUDA device visible ({self.source}{'; ' + self.note if self.note else ''})"
        names = ", ".join(f"{g.token}: {g.name}" for g in self.gpus)
        return f"{self.count} CUDA device(s) via {self.source}: {names}"


class DiscoveryError(ValueError):
    """A device list that cannot be honoured (bad fake spec, unknown --sharedkv-gpus index)."""


FAKE_FORMAT = ("device indices, e.g. 0,1, or 0:80,1:40 with free GiB, or 0:140:9.0 with "
               "free GiB and compute capability")
_VISIBLE_TOKEN = re.compile(r"^(-?\d+|GPU-[0-9a-fA-F-]+|MIG-[0-9A-Za-z/-]+)$")


def _parse_fake(spec: str) -> tuple[Gpu, ...]:
    gpus: list[Gpu] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        token, _, rest = part.partition(":")
        free, _, cap = rest.partition(":")
        if not token.isdigit():
            raise DiscoveryError(f"{FAKE_GPUS_ENV}={spec!r}: {token!r} is not a device index; "
                                 f"it takes {FAKE_FORMAT}")
        if any(g.token == token for g in gpus):
            raise DiscoveryError(f"{FAKE_GPUS_ENV}={spec!r}: names device {token} twice; "
                                 f"it takes {FAKE_FORMAT}")
        free_mib: int | None = None
        if free:
            try:
                gib = float(free)
            except ValueError:
                gib = -1.0
            if not 0 <= gib < 1 << 20:
                raise DiscoveryError(
                    f"{FAKE_GPUS_ENV}={spec!r}: {free!r} is not a number of free GiB "
                    "(0 or more); it takes " + FAKE_FORMAT)
            free_mib = int(gib * 1024)
        capability: float | None = None
        if cap:
            try:
                capability = float(cap)
            except ValueError:
                capability = -1.0
            if not 1 <= capability < 100:
                raise DiscoveryError(
                    f"{FAKE_GPUS_ENV}={spec!r}: {cap!r} is not a compute capability (e.g. "
                    "9.0); it takes " + FAKE_FORMAT)
        gpus.append(Gpu(token=token, name=f"fake-gpu-{token}", free_mib=free_mib, fake=True,
                        compute_cap=capability))
    return tuple(gpus)


def visible_tokens(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES's device tokens (indices or UUIDs), in order; () when unset."""
    env = os.environ if environ is None else environ
    return tuple(t.strip() for t in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if t.strip())


def environment_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """What is wrong with the device variables (without running anything), or None.

    A malformed ``SHAREDKV_FAKE_GPUS`` or ``CUDA_VISIBLE_DEVICES`` is one usage error at
    the start of a run instead of one error per test (or a device named "garbage" leased).
    """
    env = os.environ if environ is None else environ
    fake = env.get(FAKE_GPUS_ENV)
    if fake is not None:
        try:
            _parse_fake(fake)
        except DiscoveryError as exc:
            return str(exc)
        return None  # the fake list replaces discovery; CUDA_VISIBLE_DEVICES is not read
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    tokens = visible_tokens(env)
    for token in tokens:
        if not _VISIBLE_TOKEN.match(token):
            return (f"CUDA_VISIBLE_DEVICES={visible!r}: {token!r} is not a device index or a "
                    "GPU-/MIG- UUID (CUDA would see no device from there on); it takes "
                    "indices like 0,1 or UUIDs; fix or unset it")
    if len(set(tokens)) != len(tokens):
        return (f"CUDA_VISIBLE_DEVICES={visible!r}: names a device twice (CUDA would stop "
                "there); it takes each index or UUID once")
    return None


def query_nvidia_smi(
    executable: str | None = None, *, tokens: tuple[str, ...] | None = None
) -> tuple[Gpu, ...] | None:
    """All devices nvidia-smi reports (or those named by ``tokens``); None when it cannot run."""
    exe = executable or shutil.which("nvidia-smi")
    if exe is None:
        return None
    cmd = [
        exe,
        "--query-gpu=index,name,memory.total,memory.free,uuid",
        "--format=csv,noheader,nounits",
    ]
    if tokens:
        cmd.append("--id=" + ",".join(tokens))
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    gpus: list[Gpu] = []
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5:
            continue
        index, name, total, free, uuid = cells[:5]
        gpus.append(
            Gpu(token=index, name=name, total_mib=_int_or_none(total),
                free_mib=_int_or_none(free), uuid=uuid)
        )
    return tuple(gpus)


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def _proc_gpus() -> tuple[Gpu, ...]:
    root = Path("/proc/driver/nvidia/gpus")
    try:
        entries = sorted(p.name for p in root.iterdir())
    except OSError:
        return ()
    return tuple(Gpu(token=str(i), name=f"NVIDIA GPU at {bus}") for i, bus in enumerate(entries))


def _match(gpu: Gpu, token: str) -> bool:
    return gpu.token == token or (gpu.uuid is not None and gpu.uuid.startswith(token))


def discover(
    selected: tuple[str, ...] | None = None,
    environ: Mapping[str, str] | None = None,
    named_by: str = "--sharedkv-gpus",
) -> Discovery:
    """The devices this run may lease, in the order CUDA_VISIBLE_DEVICES would list them.
    NAMED_BY is where SELECTED came from (the option or its ini key), for the error."""
    env = os.environ if environ is None else environ
    fake = env.get(FAKE_GPUS_ENV)
    if fake is not None:
        found = Discovery(_parse_fake(fake), source=FAKE_GPUS_ENV, fake=True)
    else:
        smi = query_nvidia_smi()
        if smi is not None:
            found = Discovery(smi, source="nvidia-smi")
        else:
            proc = _proc_gpus()
            found = Discovery(
                proc, source="/proc/driver/nvidia/gpus" if proc else "no nvidia-smi",
                note="" if proc else "no NVIDIA driver entries in /proc/driver/nvidia/gpus",
            )
        visible = env.get("CUDA_VISIBLE_DEVICES")
        if visible is not None and found.gpus:
            tokens = visible_tokens(env)
            kept: list[Gpu] = []
            note = found.note
            uuids_known = any(g.uuid for g in found.gpus)
            for token in tokens:
                match = [g for g in found.gpus if _match(g, token)]
                if match:
                    kept.append(match[0])
                elif token.startswith(("GPU-", "MIG-")) and not uuids_known:
                    kept.append(Gpu(token=token, name=f"device {token}"))  # cannot tell here
                else:
                    # CUDA stops at the first entry it cannot use ("-1" hides every device)
                    note = f"CUDA_VISIBLE_DEVICES entry {token!r} names no device here"
                    break
            found = replace(
                found, gpus=tuple(kept), note=note,
                source=f"{found.source}, CUDA_VISIBLE_DEVICES={visible}")
    if selected is not None:
        picked: list[Gpu] = []
        for token in selected:
            match = [g for g in found.gpus if _match(g, token)]
            if not match:
                raise DiscoveryError(
                    f"{named_by} names device {token!r}, which is not among the "
                    f"visible devices ({found.describe()}); it takes indices or UUIDs of "
                    "visible devices"
                )
            picked.append(match[0])
        found = replace(found, gpus=tuple(picked), source=f"{found.source}, {named_by}")
    return found


def free_gib(gpu: Gpu, discovery: Discovery) -> float | None:
    """Free memory now (a fresh nvidia-smi reading; fake devices report their spec)."""
    if discovery.fake or gpu.uuid is None:
        return gpu.free_gib
    fresh = query_nvidia_smi(tokens=(gpu.uuid,))
    if fresh:
        return fresh[0].free_gib
    return gpu.free_gib


def compute_capability(gpu: Gpu, executable: str | None = None) -> float | None:
    """GPU's compute capability from nvidia-smi (a query of its own: a driver too old for
    the field then costs nothing else), None where unknown; never CUDA in this process."""
    if gpu.fake or gpu.compute_cap is not None:
        return gpu.compute_cap
    exe = executable or shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=compute_cap", "--format=csv,noheader,nounits",
             f"--id={gpu.uuid or gpu.token}"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    try:
        return float(out.stdout.strip().splitlines()[0])
    except (ValueError, IndexError):
        return None
