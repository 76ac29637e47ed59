"""Upload validation for model versions: safe zip extraction, the file allow-list, safetensors headers
read without loading a tensor, the architecture check, parameter count, dtype and file hashes.

Pure (no Django): the catalog services stage an upload in a scratch folder and call `check_filenames`,
`extract_zip` and `validate_model_dir`; every refusal is an `UploadRejected` with a reason code and a
message that tells the customer what to do. What counts as a runnable model lives in runners.modelload.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import re
import stat
import struct
import uuid
import zipfile
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import StrEnum
from math import prod
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from api.bounded import InputRejected, json_loads_bounded

log = logging.getLogger(__name__)

# Validation never touches the network; set before transformers is (lazily) imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


class RejectCode(StrEnum):
    """Why an upload was refused. Values are stable: the platform stores and displays them."""

    EMPTY = "empty"
    PICKLE_FORMAT = "pickle_format"
    UNEXPECTED_FILE = "unexpected_file"
    UNSAFE_PATH = "unsafe_path"
    TOO_LARGE = "too_large"
    TOO_MANY_FILES = "too_many_files"
    ZIP_TRAVERSAL = "zip_traversal"
    ZIP_LINK = "zip_link"
    ZIP_BOMB = "zip_bomb"
    BAD_ZIP = "bad_zip"
    BAD_SAFETENSORS = "bad_safetensors"
    WEIGHTS_LAYOUT = "weights_layout"
    INVALID_JSON = "invalid_json"
    MISSING_CONFIG = "missing_config"
    MISSING_MODEL_TYPE = "missing_model_type"
    UNKNOWN_ARCHITECTURE = "unknown_architecture"
    CUSTOM_CODE = "custom_code"
    INVALID_CONFIG = "invalid_config"
    NAME_TOO_LONG = "name_too_long"
    DUPLICATE_FILE = "duplicate_file"
    MODEL_TOO_LARGE = "model_too_large"
    FORBIDDEN = "forbidden"


class UploadRejected(Exception):
    """An upload Dyno refuses. `code` is a RejectCode value; `message` says what was wrong and what to do."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = str(code)
        self.message = message


@dataclass(frozen=True)
class UploadLimits:
    """Size and count limits; the platform passes its settings, the defaults suit a single box."""

    max_file_bytes: int = 20 * 2**30  # one safetensors shard; hub shards are 2-10 GiB
    max_total_bytes: int = 200 * 2**30  # a 70B model in bf16 is ~140 GiB
    max_files: int = 256
    # Safetensors barely compress (about 1.1x), JSON/text at most ~20x; a bomb is 1000x and more.
    max_zip_ratio: float = 200.0
    max_zip_entries: int = 1024
    # An architecture card is built with random weights on a runner: at most this many parameters.
    max_card_parameters: int = 2_000_000_000
    # The config's module tree is built on the meta device in a child process under these limits.
    build_seconds: int = 20
    build_memory_bytes: int = 2 * 2**30


@dataclass(frozen=True)
class KeptFile:
    path: str  # relative to the model folder, posix separators
    size: int
    sha256: str


@dataclass(frozen=True)
class ModelInfo:
    kind: Literal["weights", "card"]
    family: str  # config.json model_type, e.g. "llama"
    architecture: str  # transformers class, e.g. "LlamaForCausalLM"
    parameter_count: int
    dtype: str  # torch name: "bfloat16", "float32", ...
    files: list[KeptFile]
    config: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- what may be uploaded -----------------------------------------------------------------------

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_WEIGHTS_NAME = "model.safetensors"
WEIGHTS_SUFFIX = ".safetensors"

ALLOWED_NAMES = frozenset(
    {
        CONFIG_NAME,
        INDEX_NAME,
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "tokenizer.model",  # sentencepiece protobuf, not a pickle
        "spiece.model",
        "chat_template.jinja",
        "chat_template.json",
        "README.md",
        "LICENSE",
        "LICENSE.txt",
        "LICENSE.md",
        "NOTICE",
        "USE_POLICY.md",
        ".gitattributes",
    }
)

# Formats whose loaders unpickle: opening one runs whatever code its author put in it. NumPy files
# are in the list because np.load(allow_pickle=True) unpickles object arrays.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".dill", ".npy", ".npz"})

# Operating-system droppings inside zips made on macOS; skipped rather than refused, because the
# customer never chose to upload them.
_OS_JUNK_DIRS = frozenset({"__MACOSX"})
_OS_JUNK_FILES = frozenset({".DS_Store", "Thumbs.db"})

_CONFIG_MAX_BYTES = 4 * 2**20
_JSON_MAX_BYTES = 64 * 2**20  # tokenizer.json of a 250k vocabulary is ~30 MiB
_SAFETENSORS_HEADER_MAX = 100_000_000  # the safetensors library's own limit
_MAX_DIMS = 64  # real tensors have at most 8; a longer shape is an attack on prod()
_RATIO_FLOOR_BYTES = 2**20  # smaller entries cannot do harm whatever their ratio
_CHUNK = 2**20
# What Linux file systems take: 255 bytes per name; a relative path far below PATH_MAX.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
_SHOWN_CHARS = 80

_CONVERT_HINT = (
    "Convert it in a trusted environment: load the model with transformers and save it with "
    "`model.save_pretrained(folder, safe_serialization=True)` (or "
    "`safetensors.torch.save_file(state_dict, 'model.safetensors')`), then upload config.json "
    "and the .safetensors files."
)


def _allowed_summary() -> str:
    names = ", ".join(sorted(ALLOWED_NAMES - {CONFIG_NAME, INDEX_NAME}))
    return (
        f"Allowed: {CONFIG_NAME}, *.safetensors weights (with {INDEX_NAME} when sharded), "
        f"and optionally {names}."
    )


# -- names --------------------------------------------------------------------------------------

_DRIVE = re.compile(r"^[A-Za-z]:")


def _shown(name: str) -> str:
    """A name as messages quote it: repr, and cut short (a hostile name can be megabytes)."""
    return repr(name if len(name) <= _SHOWN_CHARS else name[:_SHOWN_CHARS] + "...")


def safe_relative_path(name: str, *, code: str = RejectCode.UNSAFE_PATH) -> PurePosixPath:
    """An uploaded or archived name as a relative path that cannot leave its folder.

    Backslashes count as separators (zips made on Windows use them); absolute names, drive letters,
    `..` components and control characters are refused with `code`; names the file system cannot
    hold (over MAX_NAME_BYTES per part or MAX_PATH_BYTES in all, or not UTF-8) with `name_too_long`
    or `code`, before anything is written.
    """
    if not name or any(ord(ch) < 0x20 for ch in name):
        raise UploadRejected(code, f"file name {_shown(name)} is empty or holds control characters; rename the file")
    try:
        encoded_length = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise UploadRejected(code, f"file name {_shown(name)} is not valid Unicode text; rename the file") from None
    if encoded_length > MAX_PATH_BYTES:
        raise UploadRejected(RejectCode.NAME_TOO_LONG, f"file name {_shown(name)} is {encoded_length:,} bytes long "
                                                       f"(UTF-8); at most {MAX_PATH_BYTES:,} are accepted: rename it")
    normalized = name.replace("\\", "/")
    if normalized.startswith("/") or _DRIVE.match(normalized):
        raise UploadRejected(code, f"{_shown(name)} is an absolute path; archive the model folder with relative names")
    parts = [part for part in normalized.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UploadRejected(code, f"{_shown(name)} points outside the upload ('..'); archive the model folder with plain relative names")
    if not parts:
        raise UploadRejected(code, f"{_shown(name)} names no file")
    for part in parts:
        if len(part.encode("utf-8")) > MAX_NAME_BYTES:
            raise UploadRejected(RejectCode.NAME_TOO_LONG,
                                 f"{_shown(part)} is {len(part.encode('utf-8')):,} bytes long (UTF-8); a file or "
                                 f"folder name is at most {MAX_NAME_BYTES} bytes: rename it")
    return PurePosixPath(*parts)


def name_collision(paths: Iterable[PurePosixPath]) -> str | None:
    """Why these names cannot all be written into one folder (one given twice, or one that is both
    a file and a folder of other files), or None."""
    files: set[str] = set()
    folders: set[str] = set()
    for path in paths:
        key = path.as_posix()
        if key in files:
            return f"{_shown(key)} is given twice"
        if key in folders:
            return f"{_shown(key)} is both a file and a folder of other files"
        for parent in list(path.parents)[:-1]:
            if parent.as_posix() in files:
                return f"{_shown(parent.as_posix())} is both a file and a folder of other files"
            folders.add(parent.as_posix())
        files.add(key)
    return None


def _pickle_rejection(name: str) -> UploadRejected:
    suffix = PurePosixPath(name).suffix.lower()
    return UploadRejected(
        RejectCode.PICKLE_FORMAT,
        f"{name}: {suffix} files are Python pickles (or can carry them), and loading a pickle executes "
        f"whatever code it contains, so Dyno does not accept them. {_CONVERT_HINT}",
    )


def _is_pickle(name: str) -> bool:
    return PurePosixPath(name).suffix.lower() in PICKLE_SUFFIXES


def check_filenames(names: Iterable[str]) -> None:
    """Fast refusal before anything is written: unsafe paths and pickle formats.

    Takes the names as the browser sent them (a single .zip passes here and is checked entry by
    entry in `extract_zip`). Refuses names the file system cannot hold and names given twice.
    """
    paths = []
    for name in names:
        path = safe_relative_path(name)
        if _is_pickle(path.name):
            raise _pickle_rejection(path.as_posix())
        paths.append(path)
    if not paths:
        raise UploadRejected(RejectCode.EMPTY, "the upload holds no files; add config.json (and .safetensors weights)")
    collision = name_collision(paths)
    if collision:
        raise UploadRejected(RejectCode.DUPLICATE_FILE, f"{collision} in this upload; keep one file per name "
                                                        "and upload again")


# -- zip extraction -----------------------------------------------------------------------------


def _is_os_junk(path: PurePosixPath) -> bool:
    return bool(_OS_JUNK_DIRS.intersection(path.parts)) or path.name in _OS_JUNK_FILES or path.name.startswith("._")


def _bomb(name: str, detail: str) -> UploadRejected:
    return UploadRejected(
        RejectCode.ZIP_BOMB,
        f"{name}: {detail}. That is what a compression bomb looks like, so the archive was not "
        "extracted; zip the model folder again with a standard tool (or upload the files directly).",
    )


def extract_zip(zip_path: Path, dest: Path, *, limits: UploadLimits) -> None:
    """Extract an uploaded zip into the empty folder `dest`, refusing anything unsafe.

    Every entry is vetted from the central directory before a byte is written (names, links, sizes,
    compression ratio, entry count); while streaming, the bytes actually produced are counted
    against the declared size and the limits, so an archive that lies about sizes is caught.
    `__MACOSX/`, `.DS_Store` and `._*` entries are skipped. If everything sits in one top-level
    folder, that folder is unwrapped. On refusal `dest` may hold partial files: discard it.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ValueError(f"extract_zip needs an empty destination, {dest} is not")
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as exc:
        log.info("upload zip refused: %s", exc)
        raise UploadRejected(RejectCode.BAD_ZIP, "the .zip is not a readable zip archive; re-create it with a standard tool") from exc
    with archive:
        plan = _plan_extraction(archive, Path(zip_path).stat().st_size, limits)
        written_total = 0
        for info, rel in plan:
            written_total += _extract_entry(archive, info, rel, dest, limits, limits.max_total_bytes - written_total)
    unwrap_single_folder(dest)


def _plan_extraction(
    archive: zipfile.ZipFile, archive_bytes: int, limits: UploadLimits
) -> list[tuple[zipfile.ZipInfo, PurePosixPath]]:
    infos = archive.infolist()
    if len(infos) > limits.max_zip_entries:
        raise UploadRejected(
            RejectCode.TOO_MANY_FILES,
            f"the archive has {len(infos)} entries, more than the {limits.max_zip_entries} allowed; "
            "a model folder needs config.json, its weights and a few tokenizer files",
        )
    plan: list[tuple[zipfile.ZipInfo, PurePosixPath]] = []
    seen: set[str] = set()
    declared_total = 0
    for info in infos:
        rel = safe_relative_path(info.filename, code=RejectCode.ZIP_TRAVERSAL)
        if _is_os_junk(rel):
            continue
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise UploadRejected(
                RejectCode.ZIP_LINK,
                f"{info.filename} is a symbolic link; links are not extracted. Zip the files themselves "
                "(e.g. `zip -r` without `--symlinks`).",
            )
        if stat.S_IFMT(mode) and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise UploadRejected(RejectCode.ZIP_LINK, f"{info.filename} is a special file (device, pipe or socket); zip regular files only")
        if info.is_dir():
            continue
        if info.flag_bits & 0x1:
            raise UploadRejected(RejectCode.BAD_ZIP, f"{info.filename} is encrypted; upload an archive without a password")
        key = rel.as_posix()
        if key in seen:
            raise UploadRejected(RejectCode.BAD_ZIP, f"{_shown(key)} appears twice in the archive; keep one copy")
        seen.add(key)
        if _is_pickle(rel.name):
            raise _pickle_rejection(key)
        if info.file_size > limits.max_file_bytes:
            raise _too_large_file(key, info.file_size, limits)
        declared_total += info.file_size
        if declared_total > limits.max_total_bytes:
            raise _too_large_total(declared_total, limits)
        if info.file_size > _RATIO_FLOOR_BYTES and info.file_size > limits.max_zip_ratio * max(info.compress_size, 1):
            ratio = info.file_size / max(info.compress_size, 1)
            raise _bomb(key, f"declares {info.file_size:,} bytes from {info.compress_size:,} compressed ({ratio:,.0f}x, limit {limits.max_zip_ratio:g}x)")
        plan.append((info, rel))
    if not plan:
        raise UploadRejected(RejectCode.EMPTY, "the archive holds no files; zip the model folder with its config.json")
    collision = name_collision(rel for _, rel in plan)
    if collision:
        raise UploadRejected(RejectCode.BAD_ZIP, f"{collision} in the archive; keep one entry per name")
    if len(plan) > limits.max_files:
        raise UploadRejected(
            RejectCode.TOO_MANY_FILES,
            f"the archive holds {len(plan)} files, more than the {limits.max_files} allowed",
        )
    if declared_total > _RATIO_FLOOR_BYTES and declared_total > limits.max_zip_ratio * max(archive_bytes, 1):
        raise _bomb("the archive", f"declares {declared_total:,} bytes from a {archive_bytes:,}-byte file")
    return plan


def _extract_entry(
    archive: zipfile.ZipFile,
    info: zipfile.ZipInfo,
    rel: PurePosixPath,
    dest: Path,
    limits: UploadLimits,
    budget: int,
) -> int:
    """Stream one entry to disk, counting what decompression really produces; returns bytes written."""
    target = dest.joinpath(*rel.parts)
    # zipfile stops reading at the declared size (and then fails the CRC); raising the declared
    # size on a copy lets the real output be counted, so a size lie shows up as what it is.
    cap = min(limits.max_file_bytes, budget)
    probe = copy.copy(info)
    probe.file_size = max(cap, info.file_size) + 1
    written = 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(probe) as source, open(target, "xb") as sink:
            while chunk := source.read(_CHUNK):
                written += len(chunk)
                if written > info.file_size:
                    raise _bomb(rel.as_posix(), f"expands beyond the {info.file_size:,} bytes it declares")
                if written > cap:
                    raise _too_large_total(limits.max_total_bytes - budget + written, limits)
                if written > _RATIO_FLOOR_BYTES and written > limits.max_zip_ratio * max(info.compress_size, 1):
                    raise _bomb(rel.as_posix(), f"expands more than {limits.max_zip_ratio:g}x")
                sink.write(chunk)
    except UploadRejected:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as exc:
        log.info("zip entry %r refused: %s", rel.as_posix(), exc)
        raise UploadRejected(RejectCode.BAD_ZIP, f"{_shown(rel.as_posix())} cannot be extracted (damaged, or a "
                                                 "compression method zip tools rarely use); re-create the archive "
                                                 "with a standard tool") from exc
    except OSError as exc:
        log.info("zip entry %r not written: %s", rel.as_posix(), exc)
        raise UploadRejected(RejectCode.BAD_ZIP, f"{_shown(rel.as_posix())} cannot be written beside the other "
                                                 "entries of the archive; re-create it from the model folder") from exc
    if written != info.file_size:
        raise UploadRejected(
            RejectCode.BAD_ZIP,
            f"{rel.as_posix()} holds {written:,} bytes but declares {info.file_size:,}; the archive is damaged, re-create it",
        )
    return written


def unwrap_single_folder(root: Path) -> None:
    """While `root` holds nothing but one folder, move that folder's contents up into `root`.

    A zipped model folder (`my-model/config.json`) and a browser folder upload both arrive wrapped.
    """
    root = Path(root)
    for _ in range(8):
        entries = list(root.iterdir())
        if len(entries) != 1 or not entries[0].is_dir() or entries[0].is_symlink():
            return
        # Renamed first, so that a child with the folder's own name (`m/m/...`) cannot collide.
        holder = entries[0].rename(root / f".unwrap-{uuid.uuid4().hex}")
        for child in list(holder.iterdir()):
            child.rename(root / child.name)
        holder.rmdir()


def _too_large_file(name: str, size: int, limits: UploadLimits) -> UploadRejected:
    return UploadRejected(
        RejectCode.TOO_LARGE,
        f"{name} is {size:,} bytes, over the {limits.max_file_bytes:,}-byte limit per file; save the "
        "weights in smaller shards (`save_pretrained(folder, max_shard_size=\"5GB\")`)",
    )


def _too_large_total(total: int, limits: UploadLimits) -> UploadRejected:
    return UploadRejected(
        RejectCode.TOO_LARGE,
        f"the upload holds at least {total:,} bytes, over the {limits.max_total_bytes:,}-byte limit; "
        "upload an architecture card (config.json only) or ask for a larger quota",
    )


# -- safetensors --------------------------------------------------------------------------------

# Bits per element of every safetensors dtype, and the torch name it is reported under.
_SAFETENSORS_DTYPES: dict[str, tuple[int, str]] = {
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "F4": (4, "float4_e2m1fn_x2"),
    "F6_E2M3": (6, "float6_e2m3"),
    "F6_E3M2": (6, "float6_e3m2"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "C64": (64, "complex64"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
    "F64": (64, "float64"),
}


@dataclass(frozen=True)
class TensorEntry:
    dtype: str  # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


def _bad_safetensors(name: str, detail: str) -> UploadRejected:
    return UploadRejected(
        RejectCode.BAD_SAFETENSORS,
        f"{name} is not a valid safetensors file: {detail}. Re-save it with "
        "`safetensors.torch.save_file` or `save_pretrained`, and upload it again in full.",
    )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(keys) != len(set(keys)):
        duplicate = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"duplicate key {duplicate!r}")
    return dict(pairs)


def read_safetensors_header(path: Path, *, name: str | None = None) -> dict[str, TensorEntry]:
    """Parse and check a safetensors header without reading any tensor data.

    Layout: 8-byte little-endian header length N, N bytes of JSON, then the data buffer. Checks that
    N is sane and inside the file, every entry has a known dtype, a shape and offsets whose span is
    exactly shape x dtype size, and that the spans tile the buffer from 0 to its end with no gap,
    overlap or missing tail (a truncated upload fails here).
    """
    label = name or Path(path).name
    size = Path(path).stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise _bad_safetensors(label, f"the file is {size} bytes, too short for the 8-byte header length (truncated?)")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len < 2 or header_len > _SAFETENSORS_HEADER_MAX:
            raise _bad_safetensors(label, f"the header length field says {header_len:,} bytes (sane: 2 to {_SAFETENSORS_HEADER_MAX:,})")
        if 8 + header_len > size:
            raise _bad_safetensors(label, f"the header length field says {header_len:,} bytes but only {size - 8:,} follow (truncated?)")
        raw = handle.read(header_len)
    try:
        header = json_loads_bounded(raw, max_bytes=_SAFETENSORS_HEADER_MAX, what="the header",
                                    object_pairs_hook=_no_duplicate_keys)
    except InputRejected as exc:
        raise _bad_safetensors(label, exc.message.rstrip(".")) from None
    if not isinstance(header, dict):
        raise _bad_safetensors(label, "the header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _bad_safetensors(label, "__metadata__ must map strings to strings")
    buffer_len = size - 8 - header_len
    tensors = {tensor: _tensor_entry(label, tensor, spec, buffer_len) for tensor, spec in header.items()}
    expected = 0
    for tensor, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != expected:
            what = "overlaps the previous tensor" if entry.begin < expected else "leaves a gap before it"
            raise _bad_safetensors(label, f"tensor {_shown(tensor)} starts at byte {entry.begin:,} and {what}")
        expected = entry.end
    if expected > buffer_len:
        raise _bad_safetensors(label, f"the tensors need {expected:,} data bytes but the file holds {buffer_len:,} (truncated?)")
    if expected < buffer_len:
        raise _bad_safetensors(label, f"{buffer_len - expected:,} bytes after the last tensor belong to no tensor")
    return tensors


def _is_count(value: Any) -> bool:
    """A JSON integer that can count bytes or elements (not a bool, not negative)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _tensor_entry(label: str, tensor: str, spec: Any, buffer_len: int) -> TensorEntry:
    """One header entry, every field type-checked before it is used: dtype one of the known codes,
    shape a list of at most _MAX_DIMS counts, data_offsets two counts in order inside the buffer."""
    name = _shown(tensor)
    if not isinstance(spec, dict):
        raise _bad_safetensors(label, f"entry {name} is not an object")
    dtype, shape, offsets = spec.get("dtype"), spec.get("shape"), spec.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in _SAFETENSORS_DTYPES:
        raise _bad_safetensors(label, f"tensor {name} has unknown dtype {_shown(repr(dtype))}; it must be one of "
                                      f"{', '.join(_SAFETENSORS_DTYPES)}")
    if not isinstance(shape, list) or len(shape) > _MAX_DIMS or not all(_is_count(d) for d in shape):
        raise _bad_safetensors(label, f"tensor {name} has shape {_shown(repr(shape))}; it must be a list of at "
                                      f"most {_MAX_DIMS} non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise _bad_safetensors(label, f"tensor {name} has data_offsets {_shown(repr(offsets))}; they must be two "
                                      "non-negative integers [begin, end]")
    begin, end = offsets
    if begin > end or end > buffer_len:
        raise _bad_safetensors(label, f"tensor {name} has data_offsets [{begin:,}, {end:,}], outside the "
                                      f"{buffer_len:,}-byte data buffer or in the wrong order (truncated?)")
    bits = prod(shape) * _SAFETENSORS_DTYPES[dtype][0]
    if bits % 8 or bits // 8 != end - begin:
        size = f"{bits // 8:,} bytes" if bits < 8 * 2**64 else "more bytes than any file holds"
        raise _bad_safetensors(label, f"tensor {name} is {dtype} of shape {_shown(repr(shape))} ({size}) but its "
                                      f"offsets span {end - begin:,} bytes")
    return TensorEntry(dtype, tuple(shape), begin, end)


# -- the model folder ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Staged:
    rel: str
    path: Path
    size: int


def _list_files(root: Path) -> list[_Staged]:
    files: list[_Staged] = []
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            path = Path(directory, name)
            rel = path.relative_to(root).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                raise UploadRejected(RejectCode.UNEXPECTED_FILE, f"{rel} is a link; upload the file itself")
            if name in dirnames:
                continue
            if not stat.S_ISREG(info.st_mode):
                raise UploadRejected(RejectCode.UNEXPECTED_FILE, f"{rel} is not a regular file")
            files.append(_Staged(rel, path, info.st_size))
    return sorted(files, key=lambda f: f.rel)


def _check_inventory(files: list[_Staged], limits: UploadLimits) -> None:
    if not files:
        raise UploadRejected(RejectCode.EMPTY, "the upload holds no files; add config.json (and .safetensors weights)")
    if len(files) > limits.max_files:
        raise UploadRejected(RejectCode.TOO_MANY_FILES, f"the upload holds {len(files)} files, more than the {limits.max_files} allowed")
    for staged in files:
        if _is_pickle(staged.rel):
            raise _pickle_rejection(staged.rel)
    total = 0
    for staged in files:
        if "/" in staged.rel:
            raise UploadRejected(
                RejectCode.UNEXPECTED_FILE,
                f"{staged.rel} is in a sub-folder; a model folder is flat (config.json next to the weights). "
                f"Upload the folder's files only. {_allowed_summary()}",
            )
        if staged.rel not in ALLOWED_NAMES and not staged.rel.endswith(WEIGHTS_SUFFIX):
            raise UploadRejected(RejectCode.UNEXPECTED_FILE, f"{staged.rel} is not part of a model folder Dyno accepts. {_allowed_summary()}")
        if staged.size > limits.max_file_bytes:
            raise _too_large_file(staged.rel, staged.size, limits)
        total += staged.size
        if total > limits.max_total_bytes:
            raise _too_large_total(total, limits)


def _read_json(staged: _Staged, max_bytes: int) -> Any:
    if staged.size > max_bytes:
        raise UploadRejected(RejectCode.TOO_LARGE, f"{staged.rel} is {staged.size:,} bytes; a {staged.rel} over {max_bytes:,} bytes is not plausible")
    try:
        return json_loads_bounded(staged.path.read_bytes(), max_bytes=max_bytes, what=staged.rel,
                                  object_pairs_hook=_no_duplicate_keys)
    except InputRejected as exc:
        raise UploadRejected(RejectCode.INVALID_JSON, exc.message.rstrip(".")) from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _weights(files: dict[str, _Staged], json_docs: dict[str, Any]) -> dict[str, dict[str, TensorEntry]]:
    """Headers of every weight file, after checking the layout transformers expects."""
    shards = sorted(name for name in files if name.endswith(WEIGHTS_SUFFIX))
    headers = {name: read_safetensors_header(files[name].path, name=name) for name in shards}
    if INDEX_NAME in json_docs:
        _check_index(json_docs[INDEX_NAME], headers)
    elif len(shards) > 1:
        raise UploadRejected(
            RejectCode.WEIGHTS_LAYOUT,
            f"{len(shards)} weight files but no {INDEX_NAME}; sharded weights need the index that "
            "`save_pretrained` writes next to them",
        )
    elif shards and shards[0] != SINGLE_WEIGHTS_NAME:
        raise UploadRejected(
            RejectCode.WEIGHTS_LAYOUT,
            f"a single weight file must be named {SINGLE_WEIGHTS_NAME} (transformers looks for that name); rename {shards[0]}",
        )
    for name, tensors in headers.items():
        if not tensors:
            raise _bad_safetensors(name, "it holds no tensors")
    return headers


def _check_index(index: Any, headers: dict[str, dict[str, TensorEntry]]) -> None:
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise UploadRejected(RejectCode.WEIGHTS_LAYOUT, f"{INDEX_NAME} has no `weight_map` of tensor name -> file name; re-save the model")
    for tensor, shard in weight_map.items():
        if shard not in headers:
            raise UploadRejected(RejectCode.WEIGHTS_LAYOUT, f"{INDEX_NAME} puts {tensor!r} in {shard}, which is not in the upload; add the missing shard")
        if tensor not in headers[shard]:
            raise UploadRejected(RejectCode.WEIGHTS_LAYOUT, f"{INDEX_NAME} puts {tensor!r} in {shard}, but that file has no such tensor")
    referenced = set(weight_map.values())
    for shard, tensors in headers.items():
        if shard not in referenced:
            raise UploadRejected(RejectCode.WEIGHTS_LAYOUT, f"{shard} is not listed in {INDEX_NAME}; remove it or re-save the model")
        for tensor in tensors:
            if weight_map.get(tensor) != shard:
                raise UploadRejected(RejectCode.WEIGHTS_LAYOUT, f"tensor {tensor!r} of {shard} is not mapped to it in {INDEX_NAME}")


def _model_facts(config_dict: dict[str, Any], limits: UploadLimits) -> tuple[Any, str, int]:
    """The transformers config, class name and parameter count estimated on the meta device (no
    memory), or an UploadRejected saying why the model is not runnable. The module tree is built
    in a forked child under CPU, memory and time limits: it runs the architecture's own code with
    sizes the uploader chose, whatever their key names."""
    from catalog.bounded import BoundedFailure, run_bounded
    from runners.modelload import UnsupportedModel, build_on_meta, config_from_dict, count_parameters, resolve_model_class

    try:
        config = config_from_dict(config_dict)
        architecture = resolve_model_class(config).__name__
    except UnsupportedModel as exc:
        raise UploadRejected(exc.code, exc.message) from exc
    try:
        estimate = int(run_bounded(lambda: count_parameters(build_on_meta(config)), wall_seconds=limits.build_seconds,
                                   cpu_seconds=limits.build_seconds, memory_bytes=limits.build_memory_bytes))
    except BoundedFailure as failure:
        if failure.kind in ("time", "memory"):
            spent = f"more than {limits.build_seconds} s" if failure.kind == "time" else f"more than {limits.build_memory_bytes:,} bytes"
            raise UploadRejected(
                RejectCode.MODEL_TOO_LARGE,
                f"building {architecture}'s module tree from this config.json took {spent} before a single "
                "weight was made; its sizes or counts describe a model far larger than any Dyno runs. "
                "Check the config's sizes and counts against what `save_pretrained` writes",
            ) from failure
        # Its text can name library internals and server paths: logged, not shown.
        log.info("building %s on the meta device failed: %s", architecture, failure.detail)
        raise UploadRejected(
            RejectCode.INVALID_CONFIG,
            f"transformers cannot build {architecture} from the values in this config.json "
            f"({failure.detail}); compare them with the config `save_pretrained` writes for {architecture} "
            "(sizes that must divide each other, counts that must agree), or check locally that "
            "`AutoModel.from_config` accepts it",
        ) from failure
    return config, architecture, estimate


def validate_model_dir(root: Path, *, limits: UploadLimits) -> ModelInfo:
    """Validate a staged model folder (files or an extracted zip) and describe it.

    Refuses (UploadRejected) links, sub-folders, pickles, files outside the allow-list, anything over
    the limits, broken JSON, malformed or truncated safetensors, an inconsistent weight layout, and
    configs transformers cannot run without custom code. Hashes every file it keeps.
    """
    root = Path(root)
    staged = _list_files(root)
    _check_inventory(staged, limits)
    files = {f.rel: f for f in staged}
    if CONFIG_NAME not in files:
        raise UploadRejected(
            RejectCode.MISSING_CONFIG,
            f"no {CONFIG_NAME} in the upload; every model needs the config that `save_pretrained` writes "
            "(upload it alone for an architecture card)",
        )
    json_docs = {
        name: _read_json(f, _CONFIG_MAX_BYTES if name == CONFIG_NAME else _JSON_MAX_BYTES)
        for name, f in files.items()
        if name.endswith(".json")
    }
    config_dict = json_docs[CONFIG_NAME]
    if not isinstance(config_dict, dict):
        raise UploadRejected(RejectCode.INVALID_JSON, f"{CONFIG_NAME} must hold a JSON object")
    tokenizer_config = json_docs.get("tokenizer_config.json")
    if isinstance(tokenizer_config, dict) and "auto_map" in tokenizer_config:
        raise UploadRejected(
            RejectCode.CUSTOM_CODE,
            "tokenizer_config.json has an `auto_map`: the tokenizer needs its own Python code, which "
            "Dyno never runs. Use a standard tokenizer or leave the tokenizer files out.",
        )
    config, architecture, estimated_parameters = _model_facts(config_dict, limits)
    headers = _weights(files, json_docs)

    if headers:
        elements: dict[str, int] = {}
        for tensors in headers.values():
            for entry in tensors.values():
                elements[entry.dtype] = elements.get(entry.dtype, 0) + entry.numel
        kind: Literal["weights", "card"] = "weights"
        parameter_count = sum(elements.values())
        dtype = _SAFETENSORS_DTYPES[max(elements, key=elements.__getitem__)][1]
    else:
        if INDEX_NAME in files:
            raise UploadRejected(RejectCode.WEIGHTS_LAYOUT, f"{INDEX_NAME} is present but no .safetensors shard is; upload the shards")
        from runners.modelload import config_dtype

        kind = "card"
        parameter_count = estimated_parameters
        if parameter_count > limits.max_card_parameters:
            raise UploadRejected(
                RejectCode.MODEL_TOO_LARGE,
                f"this architecture card describes {parameter_count:,} parameters; a card is built with random "
                f"weights on a runner, and at most {limits.max_card_parameters:,} parameters are built that way. "
                "Upload the weights (safetensors) with the config, or a smaller config",
            )
        dtype = str(config_dtype(config)).removeprefix("torch.")

    kept = [KeptFile(f.rel, f.size, _sha256(f.path)) for f in staged]
    return ModelInfo(
        kind=kind,
        family=str(config.model_type),
        architecture=architecture,
        parameter_count=parameter_count,
        dtype=dtype,
        files=kept,
        config=config_dict,
    )
