"""The combinations of options that each parse but cannot run together, in one place, said
before any test as a usage error naming the options: ``load_settings`` reads the settings
(``options.read_settings``) and refuses what this module finds: the provider's, the
stack's (``stack_problem``: ``--sharedkv-stack`` and the options only one stack reads) and
the engine's (``engine_problem``: ``--sharedkv-engine sglang``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_sharedkv.config.engine import Engine, sglang_missing
from pytest_sharedkv.config.options import (
    NATIVE_SHORTHAND,
    OPTION_PREFIX,
    Settings,
    needs_l2,
    read_settings,
)
from pytest_sharedkv.config.provider import Provider
from pytest_sharedkv.config.stack_choice import (
    ATTENTION_ONLY_HINT,
    INPROCESS_ENGINE,
    INPROCESS_TIERS,
    Stack,
    is_hybrid,
)


def load_settings(config: pytest.Config) -> Settings:
    """Read every option (command line first, then ini) and validate it, or raise UsageError."""
    settings = read_settings(config)
    problem = combination_problem(settings)
    if problem is not None:
        raise pytest.UsageError(problem)
    return settings


def _requested_provider(settings: Settings) -> Provider:
    """The provider asked for, ``auto`` resolved as far as the settings say (external
    where endpoints are given)."""
    if settings.provider is Provider.AUTO and settings.endpoints:
        return Provider.EXTERNAL
    return settings.provider


def _provider_named_by(settings: Settings) -> str:
    """The options (or ini keys) that chose the provider, as an error names them."""
    given = [settings.source_of(f) for f in ("provider", "endpoints")
             if settings.sources.get(f, "default") != "default"]
    return ", ".join(given) or settings.source_of("provider")


def combination_problem(settings: Settings) -> str | None:
    """Options that each parse but do nothing together, or say two things, said before
    the run instead of being ignored without a word."""
    if settings.native_arm and settings.sources.get("perf_arms", "default") != "default" \
            and settings.perf_arms != NATIVE_SHORTHAND:
        return (f"{settings.source_of('native_arm')} is shorthand for "
                f"{settings.source_of('perf_arms')} {','.join(NATIVE_SHORTHAND)}, but "
                f"{settings.source_of('perf_arms')} gives {','.join(settings.perf_arms)}; "
                "give one of them, or both alike")
    provider = _requested_provider(settings)
    if settings.inject_delay and provider in (Provider.STUB, Provider.EXTERNAL):
        where = settings.source_of("inject_delay")
        return (f"{where}: the {provider} provider launches no process to delay (the "
                "delay goes into launched LMCache processes: provider vllm, transfer, or "
                "auto without endpoints); drop it or choose one of those")
    if settings.topology == "hosts" and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('topology')}: the hosts topology launches one LMCache "
                f"server per replica, and the external provider ({_provider_named_by(settings)})"
                " serves a deployment the suite never starts or stops; drop one of them")
    if "HOSTS" in settings.treatment_arms and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('perf_arms')}: the HOSTS arm launches one LMCache "
                f"server per replica, and the external provider ({_provider_named_by(settings)})"
                " serves a deployment the suite never starts or stops; drop one of them")
    hosts_only = [settings.source_of(f) for f in ("l2", "l2_fault_gap")
                  if settings.sources.get(f, "default") != "default"]
    if hosts_only and not needs_l2(settings):
        return (f"{', '.join(hosts_only)}: only the hosts topology uses an L2, and "
                f"{settings.source_of('topology')} is {settings.topology}; give "
                f"{OPTION_PREFIX}topology hosts or drop {' and '.join(hosts_only)}")
    if settings.fault_catalogue is not None and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('fault_catalogue')}: the fault catalogue relaunches the "
                f"pair with each fault, and the external provider "
                f"({_provider_named_by(settings)}) serves a deployment the suite never starts "
                "or stops; drop one of them")
    if settings.triage and provider is Provider.EXTERNAL:
        return (f"{settings.source_of('triage')}: the triage relaunches the pair under each "
                f"of its controls, and the external provider ({_provider_named_by(settings)}) "
                "serves a deployment the suite never starts or stops; drop one of them")
    engine = engine_problem(settings, provider)  # --sharedkv-engine sglang
    if engine is not None:
        return engine
    stack = stack_problem(settings, provider)  # --sharedkv-stack inprocess|native
    if stack is not None:
        return stack
    return None


def _config(model: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((model / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def stack_problem(settings: Settings, provider: Provider) -> str | None:
    """Why the stack asked for cannot run with the other settings, or None. PROVIDER: the
    one asked for (``auto`` resolved as far as the settings say)."""
    tiers = [settings.source_of(f) for f in INPROCESS_TIERS
             if settings.sources.get(f, "default") != "default"]
    if tiers and settings.stack is not Stack.INPROCESS:
        return (f"{', '.join(tiers)}: only the in-process stack has LMCache tiers in each "
                f"replica, and {settings.source_of('stack')} is {settings.stack}; give "
                f"{settings.source_of('stack')} inprocess or drop {' and '.join(tiers)}")
    if settings.sources.get("native_connector", "default") != "default" \
            and settings.stack is not Stack.NATIVE:
        given = settings.source_of("native_connector")
        return (f"{given}: only the native stack runs vLLM's own CPU offload, whose "
                f"connector it chooses, and {settings.source_of('stack')} is "
                f"{settings.stack}; give {settings.source_of('stack')} native or drop {given}")
    engine = [settings.source_of(f) for f in INPROCESS_ENGINE
              if getattr(settings, f) is False]
    if engine and settings.stack is not Stack.INPROCESS:
        return (f"{', '.join(engine)}: only the in-process stack's replicas are launched with "
                f"vLLM's prefix caching as this option sets it (its expected hits are "
                f"written for that stack alone), and {settings.source_of('stack')} is "
                f"{settings.stack}; give {settings.source_of('stack')} inprocess or drop "
                f"{' and '.join(engine)}")
    if settings.stack is Stack.MP:
        return None
    where = settings.source_of("stack")
    if provider is Provider.EXTERNAL:
        return (f"{where} {settings.stack}: the suite launches the stack it names, and the "
                "external provider serves a deployment it never starts; drop one of them")
    if settings.triage:
        return (f"{where} {settings.stack}: {settings.source_of('triage')}'s controls act on "
                "LMCache's MP server, which this stack does not run; drop one of them")
    if settings.topology != "shared":
        return (f"{where} {settings.stack}: {settings.source_of('topology')} "
                f"{settings.topology} runs one LMCache MP server per replica, which this stack "
                "does not run; drop one of them")
    if settings.fault_catalogue is not None:
        return (f"{where} {settings.stack}: {settings.source_of('fault_catalogue')}'s faults "
                "go into LMCache's MP server, which this stack does not run; drop one of them")
    if settings.sources.get("allocators", "default") != "default":
        return (f"{where} {settings.stack}: {settings.source_of('allocators')} chooses the MP "
                "server's L1 allocator, which this stack does not run; drop one of them")
    if settings.stack is Stack.INPROCESS and provider is not Provider.STUB:
        refused = release_problem(settings)
        if refused is not None:
            return refused
        if settings.model is None:
            return (f"{where} inprocess: LMCacheConnectorV1 has no hybrid-model support in "
                    "vLLM 0.26 and the default model (the copy model) is a hybrid; "
                    + ATTENTION_ONLY_HINT)
        config = _config(settings.model)
        if config is not None and is_hybrid(config):
            return (f"{where} inprocess: {settings.source_of('model')} {settings.model} is a "
                    "hybrid model, which LMCacheConnectorV1 cannot serve in vLLM 0.26; "
                    + ATTENTION_ONLY_HINT)
    return None


def release_problem(settings: Settings) -> str | None:
    """Why the in-process stack cannot run on the LMCache the run would drive it with (the
    installed one, and the release site the identity tier is given): a module vLLM's
    LMCacheConnectorV1 imports that the release moved (issue 50 item 3), or None."""
    import importlib.util

    from pytest_sharedkv.host.lmcache_api import stack_refusal

    sites: list[tuple[str, Path]] = []
    spec = importlib.util.find_spec("lmcache")  # top-level: found, not imported
    if spec is not None and spec.submodule_search_locations:
        sites.append((settings.source_of("stack") + " inprocess",
                      Path(next(iter(spec.submodule_search_locations)))))
    site = getattr(settings, "identity_release_site", None)
    if site is not None:
        sites.append((settings.source_of("identity_release_site"), Path(site) / "lmcache"))
    for where, lmcache in sites:
        refused = stack_refusal(Stack.INPROCESS, lmcache)
        if refused is not None:
            return f"{where}: {refused}"
    return None


def engine_problem(settings: Settings, provider: Provider) -> str | None:
    """Why ``--sharedkv-engine sglang`` cannot run with the other settings or here, or
    None. PROVIDER: the one asked for (``auto`` resolved as far as the settings say)."""
    if settings.engine is Engine.VLLM:
        return None
    where = f"{settings.source_of('engine')} {settings.engine}"
    if settings.stack is not Stack.MP:
        return (f"{where}: SGLang reaches LMCache through its MP server alone "
                f"(lmc_radix_cache.py's MP mode), and {settings.source_of('stack')} is "
                f"{settings.stack} (vLLM's own connectors); drop one of them")
    if settings.topology != "shared":
        return (f"{where}: {settings.source_of('topology')} {settings.topology} is not "
                "written for SGLang replicas yet (one MP server both share); drop one of them")
    if settings.triage or settings.fault_catalogue is not None:
        named = settings.source_of("triage" if settings.triage else "fault_catalogue")
        return (f"{where}: {named}'s cells are judged against vLLM's connector logs; "
                "drop one of them")
    if settings.kv_audit and settings.sources.get("kv_audit", "default") != "default":
        return (f"{where}: {settings.source_of('kv_audit')}: the KV audit's hook wraps "
                "vLLM's MP connector; SGLang's connector has no such hook, so the audit is "
                "n/a on SGLang; drop one of them")
    if settings.vllm_args and settings.sources.get("vllm_args", "default") != "default":
        return (f"{where}: {settings.source_of('vllm_args')} gives flags for `vllm serve`, "
                "which an SGLang pair does not run; drop one of them")
    if provider in (Provider.VLLM, Provider.AUTO):
        missing = sglang_missing()
        if missing is not None:
            return (f"{where}: {missing}; or give --sharedkv-provider stub (the test double "
                    "answers as SGLang does) or --sharedkv-endpoints")
        if settings.model is not None:
            config = _config(settings.model)
            if config is not None and is_hybrid(config):
                return (f"{where}: {settings.source_of('model')} {settings.model} is a hybrid "
                        "model, for which SGLang 0.5.17 builds no LMCache radix cache "
                        "(srt/mem_cache/registry.py picks its unified radix cache first), so "
                        "--enable-lmcache would share nothing; " + ATTENTION_ONLY_HINT)
    return None
