"""The identity tier's inputs, checked before any test (issue 50 item 5): a tenant salt
LMCache would refuse, an adapter or model directory that is not there, a release site
without LMCache. Each parser raises ``OptionError`` (the option's usage error).

LMCache 0.5.6's rule for a salt (``v1/distributed/api.py`` ``ObjectKey`` and
``v1/multiprocess/custom_types.py`` ``IPCCacheServerKey``, ``__post_init__``): none of
``@`` (the L2 adapters' field separator), ``/`` and ``\\`` (the fs adapter puts the salt in
a file name) or NUL, and at most 128 characters.
"""

from __future__ import annotations

from pathlib import Path

from pytest_sharedkv.config.errors import OptionError


def _refuse(text: str) -> ValueError:
    """The option's usage error."""
    return OptionError(text)


SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
SALT_MAX_LEN = 128


def parse_salt(text: str) -> str:
    """A cache_salt LMCache 0.5.6 takes."""
    bad = [c for c in SALT_FORBIDDEN if c in text]
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise _refuse(f"{text!r} holds {shown}, which LMCache refuses in a cache_salt "
                          "(it keeps no '@', '/', '\\' or NUL: the L2 adapters split keys at "
                          "'@' and the fs adapter puts the salt in a file name)")
    if len(text) > SALT_MAX_LEN:
        raise _refuse(f"a cache_salt of {len(text)} characters; LMCache takes at most "
                          f"{SALT_MAX_LEN}")
    if not text:
        raise _refuse("needs a salt (an empty one is no tenant)")
    return text


def parse_adapter(text: str) -> Path:
    """A LoRA adapter directory (PEFT's adapter_config.json beside its weights)."""
    path = Path(text).expanduser()
    takes = "it takes a LoRA adapter directory holding adapter_config.json"
    if not path.exists():
        raise _refuse(f"{text} does not exist; {takes}")
    if not (path / "adapter_config.json").is_file():
        raise _refuse(f"{text} holds no adapter_config.json; {takes}")
    return path


def parse_other_model(text: str) -> Path:
    """Another checkpoint served under the same name (other weights or configuration)."""
    path = Path(text).expanduser()
    takes = ("it takes a model checkpoint directory holding config.json, served under the "
             "same name as the first")
    if not path.exists():
        raise _refuse(f"{text} does not exist; {takes}")
    if not (path / "config.json").is_file():
        raise _refuse(f"{text} holds no config.json; {takes}")
    return path


def parse_release_site(text: str) -> Path:
    """A directory another LMCache release was installed into (``pip install --target``)."""
    path = Path(text).expanduser()
    takes = ("it takes a site directory another LMCache release was installed into, e.g. "
             "`pip install --no-deps --target DIR lmcache==0.5.7rc2`")
    if not path.is_dir():
        raise _refuse(f"{text} is not a directory; {takes}")
    if not (path / "lmcache" / "__init__.py").is_file():
        raise _refuse(f"{text} holds no lmcache package; {takes}")
    return path
