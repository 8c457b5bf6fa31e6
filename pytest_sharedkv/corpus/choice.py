"""Which corpus a run sends, decided from the settings alone (at collection, without
loading a model): the copy model's committed corpus, the same generated for another chunk
size, or a text corpus with planted codewords for a user's own model."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from pytest_sharedkv.config.options import Settings, measured_limit
from pytest_sharedkv.config.provider import Provider
from pytest_sharedkv.corpus.cases import CaseSet
from pytest_sharedkv.corpus.copy_corpus import PLAN
from pytest_sharedkv.corpus.text_corpus import case_id
from pytest_sharedkv.models.copy_model import CopyModelRecipe

MANIFEST = "copy-corpus-c{chunk}.json"


def served_kind(settings: Settings) -> str:
    """copy: the copy model (default, or --sharedkv-model pointing at it or at its
    attention-only variant); text: any
    other checkpoint, or external endpoints serving an unknown model."""
    from pytest_sharedkv.models.copy_model import is_copy_model

    if settings.model is not None:  # its attention-only and memory variants: the same rule
        copy = is_copy_model(settings.model) or variant_recipe(settings.model) is not None
        return "copy" if copy else "text"
    if settings.endpoints and settings.provider in (Provider.AUTO, Provider.EXTERNAL):
        return "text"
    return "copy"


def variant_recipe(model: Path) -> CopyModelRecipe | None:
    """The copy recipe whose corpus a copy-model variant at MODEL serves (the
    attention-only or the memory copy model), else None."""
    from pytest_sharedkv.models import copy_attention_model, copy_memory_model

    return (copy_attention_model.corpus_recipe(model)
            or copy_memory_model.corpus_recipe(model))


def wanted(settings: Settings, size: str) -> bool:
    return settings.service_sizes is None or size in settings.service_sizes


def measured_ids(settings: Settings) -> list[str]:
    kind = served_kind(settings)
    limit = measured_limit()
    return [case_id(kind, size, i) for size, _, count, _ in PLAN if wanted(settings, size)
            for i in range(count if limit is None else min(count, limit))]



def copy_chunk(settings: Settings) -> int:
    from pytest_sharedkv.layouts.chunk_size import chunk_size_for_config, derive_chunk_size
    from pytest_sharedkv.models.copy_model import CopyModelRecipe, config_dict

    if settings.chunk_size:
        return settings.chunk_size
    if settings.model is not None:
        return derive_chunk_size(settings.model)
    return chunk_size_for_config(config_dict(CopyModelRecipe()))


def fixtures_dir() -> Path:
    """``pytest_sharedkv.fixtures`` as installed, or a not-installed checkout's fixtures/."""
    try:
        return Path(str(resources.files("pytest_sharedkv.fixtures")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / "fixtures"


def bundled_manifest(chunk: int) -> Path:
    return fixtures_dir() / "service" / MANIFEST.format(chunk=chunk)


def case_set(settings: Settings) -> CaseSet:
    from pytest_sharedkv.corpus import copy_corpus
    from pytest_sharedkv.corpus.cases import copy_case_set
    from pytest_sharedkv.models.copy_model import load_card

    if served_kind(settings) == "text":
        from pytest_sharedkv.corpus.text_corpus import build_text
        from pytest_sharedkv.layouts.chunk_size import derive_chunk_size
        from pytest_sharedkv.models.config_file import max_position_embeddings

        chunk = settings.chunk_size or derive_chunk_size(settings.model)
        context = max_position_embeddings(settings.model, 131_072 + 1024)
        return _limited(settings, build_text(settings.model, chunk, context,
                                             sizes=settings.service_sizes))
    recipe = ((variant_recipe(settings.model) or load_card(settings.model).recipe)
              if settings.model is not None else CopyModelRecipe())
    chunk = copy_chunk(settings)
    manifest = bundled_manifest(chunk)
    if manifest.exists() and recipe == CopyModelRecipe():
        corpus = copy_corpus.load(manifest, recipe)
        source = f"committed manifest {manifest.name} (payload SHA-256s checked)"
    else:
        corpus = copy_corpus.build(chunk, recipe)
        source = f"generated for chunk {chunk} (no committed manifest for it)"
    return _limited(settings, copy_case_set(corpus, source, keep=lambda role, size: role not in (
        "measured", "warmup") or wanted(settings, size)))


def _limited(settings: Settings, cases: CaseSet) -> CaseSet:
    """The measured cases the tests were parametrized with (the self-tests' small plan)."""
    if measured_limit() is not None:
        sent = set(measured_ids(settings))
        cases.cases = [c for c in cases.cases if c.role != "measured" or c.id in sent]
    return cases
