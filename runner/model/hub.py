"""Models named as users name them on the Hugging Face Hub, resolved to a local GGUF file
through huggingface_hub's own cache and download code (the optional extra `ggbatch[hf]`):

- `hf:OWNER/REPO/FILE.gguf`: that file of that repository (FILE may hold folders).
- `https://huggingface.co/OWNER/REPO/resolve/REV/FILE.gguf` (or `/blob/`, as the file's page is
  addressed; `hf.co` too): that file at that revision, as a link copied from the Hub reads.
- `OWNER/REPO:QUANT` or `hf:OWNER/REPO:QUANT`: the repository's GGUF file of that quantization,
  picked as llama.cpp's `-hf OWNER/REPO:QUANT` picks it; `hf:OWNER/REPO`: llama.cpp's default.
  A bare `OWNER/REPO:QUANT` that exists as a local path stays a path.

Picking, as llama.cpp's common/download.cpp `find_best_model` (the vendored 0.3.36 sources):
the tag followed by `.` or `-` searched case-insensitively in each file's path (`Q4_K_M` finds
`model-q4_k_m.gguf`); only `.gguf` files that are models (names without mmproj, imatrix, mtp-,
eagle3-, dflash-, dspark-); of a split model (`-00001-of-00003.gguf`) only the first part, and
then every part is fetched. Without a tag: Q4_K_M, then Q8_0, then the repository's only model.
Unlike llama.cpp, which takes the first match in listing order, several matches are an error
naming them: a batch job should not run a model it was not told to.

The list of files comes from the Hub, or, with HF_HUB_OFFLINE set or the Hub unreachable, from
what is cached (`scan_cache_dir`); the files themselves always through `hf_hub_download`, which
honours HF_HUB_OFFLINE and the cache location (HF_HUB_CACHE, HF_HOME) itself.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Optional, Sequence
from urllib.parse import unquote

from ..errors import ModelError

HF_PREFIX = "hf:"
# OWNER/REPO:QUANT; the repo id characters the Hub allows
QUANT_NAME = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+):(?P<quant>[\w.-]+)$")
NOT_MODELS = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")  # llama.cpp gguf_filename_is_model
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")  # llama.cpp find_best_model without a tag
SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})(?P<ext>\.gguf)$", re.IGNORECASE)
SHOWN = 8  # file names quoted in one error line


@dataclass(frozen=True)
class HubRef:
    name: str  # as the user wrote it, for errors
    repo_id: str
    filename: Optional[str] = None  # hf:OWNER/REPO/FILE
    quant: Optional[str] = None  # OWNER/REPO:QUANT; neither: llama.cpp's default tags
    revision: Optional[str] = None  # a link's branch, tag or commit; None: the Hub's default (main)


# a file's link on the Hub: its download (resolve) or its page (blob), a query string after it
HUB_URL = re.compile(r"^https?://(?:www\.)?(?:huggingface\.co|hf\.co)/(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)/"
                     r"(?:resolve|blob)/(?P<revision>[^/?#]+)/(?P<file>[^?#]+)(?:[?#].*)?$")


REPO_ALONE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # OWNER/REPO: a path unless hf: or :QUANT says not


def hub_hint(name: str) -> str:
    """What to say of a path not found that reads as a bare Hub repository (`Qwen/Qwen3-0.6B-GGUF`)."""
    if not REPO_ALONE.match(name) or name.lower().endswith(".gguf"):
        return ""
    return f" (a Hugging Face repository? write hf:{name}, or {name}:QUANT such as {name}:Q4_K_M)"


def is_hub_name(name: str) -> bool:
    """Whether `name` reads as a Hub model name (a bare OWNER/REPO:QUANT may still be a local path)."""
    return name.startswith(HF_PREFIX) or QUANT_NAME.match(name) is not None or HUB_URL.match(name) is not None


def parse_hub_name(name: str) -> Optional[HubRef]:
    """The Hub reference `name` spells, or None when it is not one (a path, `demo`)."""
    if not is_hub_name(name):
        return None
    link = HUB_URL.match(name)
    if link:
        return HubRef(name, link["repo"], filename=unquote(link["file"]), revision=unquote(link["revision"]))
    rest = name[len(HF_PREFIX):] if name.startswith(HF_PREFIX) else name
    found = QUANT_NAME.match(rest)
    if found:
        return HubRef(name, found["repo"], quant=found["quant"])
    parts = rest.split("/", 2)
    if len(parts) >= 2 and all(parts):
        return HubRef(name, "/".join(parts[:2]), filename=parts[2] if len(parts) == 3 else None)
    raise ModelError(f"{name}: expected hf:OWNER/REPO/FILE.gguf, OWNER/REPO:QUANT or hf:OWNER/REPO")


def resolve_hub_name(name: str) -> str:
    """The local GGUF path for a Hub model name, fetched or found in the cache; any other name
    (a path, `demo`, a local file that happens to look like OWNER/REPO:QUANT) unchanged."""
    if not name.startswith(HF_PREFIX) and os.path.exists(os.path.expanduser(name)):
        return name
    ref = parse_hub_name(name)
    if ref is None:
        return name
    hf = _import_hub(name)
    try:
        filename = ref.filename or pick_file(_repo_files(hf, ref), ref)
        paths = [hf.hf_hub_download(ref.repo_id, part, revision=ref.revision) for part in split_parts(filename)]
    except ModelError:
        raise
    except Exception as exc:  # the library's errors, each turned into one line below
        raise _one_line(hf, ref, exc) from None
    return str(paths[0])


def model_files(files: Sequence[str]) -> list[str]:
    """The files llama.cpp would load as a model: GGUF, not a projector or imatrix, first split part."""
    def is_model(path: str) -> bool:
        split = SPLIT.match(path)
        return (path.endswith(".gguf") and not any(k in os.path.basename(path) for k in NOT_MODELS)
                and (split is None or int(split["index"]) == 1))
    return [f for f in files if is_model(f)]


def pick_file(files: Sequence[str], ref: HubRef) -> str:
    """The one model file of `files` that `ref`'s quant tag names (see the module docstring)."""
    candidates = model_files(files)
    for tag in [ref.quant] if ref.quant else DEFAULT_QUANTS:
        # llama.cpp builds the regex from the tag as given; escaped here, the same for real tags
        found = [f for f in candidates if re.search(re.escape(tag) + "[.-]", f, re.IGNORECASE)]
        if len(found) == 1:
            return found[0]
        if found:
            raise ModelError(f"{ref.name}: {len(found)} files match {tag}: {_names(found)}; name one as "
                             f"hf:{ref.repo_id}/FILE")
    if ref.quant is None and len(candidates) == 1:
        return candidates[0]
    wanted = ref.quant or " or ".join(DEFAULT_QUANTS)
    return _no_match(ref, wanted, candidates)


def _no_match(ref: HubRef, wanted: str, candidates: list[str]) -> str:
    if not candidates:
        raise ModelError(f"{ref.name}: {ref.repo_id} has no GGUF model file")
    raise ModelError(f"{ref.name}: no GGUF file of {ref.repo_id} matches {wanted}; it has {_names(candidates)}")


def _names(files: Sequence[str]) -> str:
    more = f" and {len(files) - SHOWN} more" if len(files) > SHOWN else ""
    return ", ".join(files[:SHOWN]) + more


def split_parts(filename: str) -> list[str]:
    """Every part of a split GGUF (llama.cpp loads the others from beside the first), or the file."""
    split = SPLIT.match(filename)
    if split is None:
        return [filename]
    count = int(split["count"])
    return [f"{split['prefix']}-{i:05d}-of-{count:05d}{split['ext']}" for i in range(1, count + 1)]


def model_parts(path: str) -> list[str]:
    """Every file of the model at `path`, the one function for it: a split GGUF's parts, which
    llama.cpp loads from beside the first (NAME-00001-of-0000N.gguf), else the file alone. Its
    identity, its size and the files watched during a run are all of these."""
    folder, name = os.path.split(path)
    return [os.path.join(folder, part) for part in split_parts(name)]


def model_bytes(path: str) -> int:
    """The model's size on disk, every part of a split GGUF counted (OSError for a missing part)."""
    return sum(os.path.getsize(part) for part in model_parts(path))


def _import_hub(name: str) -> ModuleType:
    try:
        import huggingface_hub
        import huggingface_hub.constants  # submodules: the package's lazy top level may not load them
        import huggingface_hub.errors
    except ImportError:
        raise ModelError(f"{name}: a Hugging Face model name needs the huggingface_hub package: "
                         "pip install 'ggbatch[hf]'") from None
    return huggingface_hub


def _repo_files(hf: ModuleType, ref: HubRef) -> list[str]:
    """The repository's file paths: from the Hub, else (offline, or the Hub unreachable: the same
    fallback hf_hub_download makes) from the cache."""
    unreachable: Optional[Exception] = None
    if not hf.constants.HF_HUB_OFFLINE:
        try:
            return list(hf.list_repo_files(ref.repo_id))
        except (hf.errors.RepositoryNotFoundError, hf.errors.RevisionNotFoundError, hf.errors.HFValidationError):
            raise
        except Exception as exc:  # no network, a timeout, the Hub down: the cache may have the repo
            unreachable = exc
    files = cached_files(hf, ref.repo_id)
    if files:
        return files
    why = "HF_HUB_OFFLINE is set" if unreachable is None else f"the Hub cannot be reached ({_first_line(unreachable)})"
    raise ModelError(f"{ref.name}: {ref.repo_id} is not in the Hugging Face cache ({hf.constants.HF_HUB_CACHE}) "
                     f"and {why}")


def cached_files(hf: ModuleType, repo_id: str) -> list[str]:
    """Paths of the files cached for the repository's main revision (or its only one)."""
    if not os.path.isdir(hf.constants.HF_HUB_CACHE):
        return []
    for repo in hf.scan_cache_dir().repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            revisions = [r for r in repo.revisions if "main" in r.refs] or list(repo.revisions)
            if not revisions:
                return []
            revision = max(revisions, key=lambda r: r.last_modified)
            return sorted(f.file_path.relative_to(revision.snapshot_path).as_posix() for f in revision.files)
    return []


def _one_line(hf: ModuleType, ref: HubRef, exc: Exception) -> ModelError:
    errors = hf.errors
    where = f"{ref.name}:"
    if isinstance(exc, errors.LocalEntryNotFoundError):
        why = "HF_HUB_OFFLINE is set" if hf.constants.HF_HUB_OFFLINE else "the Hub cannot be reached"
        return ModelError(f"{where} not in the Hugging Face cache ({hf.constants.HF_HUB_CACHE}) and {why}")
    if isinstance(exc, errors.GatedRepoError):
        return ModelError(f"{where} {ref.repo_id} is gated: accept its terms on the Hub and log in (hf auth login)")
    if isinstance(exc, errors.RepositoryNotFoundError):
        return ModelError(f"{where} no repository {ref.repo_id} on the Hub (or it is private: log in)")
    if isinstance(exc, errors.EntryNotFoundError):
        return ModelError(f"{where} {ref.repo_id} has no such file ({_first_line(exc)})")
    if isinstance(exc, errors.HFValidationError):
        return ModelError(f"{where} not a valid Hugging Face repository or file name ({_first_line(exc)})")
    return ModelError(f"{where} cannot get the model from the Hugging Face Hub: {type(exc).__name__}: "
                      f"{_first_line(exc)}")


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."
