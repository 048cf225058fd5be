"""Model specs of config ``llm.models``: what each names, where its files are, and how it is loaded.

:func:`resolve_model` turns every spec into a :class:`ResolvedModel`: ``tiny`` (generated, :mod:`gpulab.llm.tiny`),
``random:<model id>`` (a shipped config.json, random weights), a modelscope id (``llm.local_paths``, the local cache,
else a download of the pinned revision) or a model directory; :func:`load_model` loads any of them the same way.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpulab.core.paths import PACKAGE_DIR

log = logging.getLogger(__name__)

TINY = "tiny"
RANDOM_PREFIX = "random:"
SHIPPED_CONFIGS = PACKAGE_DIR / "llm" / "configs"
CHAT_TEMPLATE = SHIPPED_CONFIGS / "qwen2.5_chat_template.jinja"
MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelSpecError(ValueError):
    """A model spec that names nothing this project can load."""


class ModelUnavailableError(RuntimeError):
    """A real model that is neither on disk nor downloadable from here; the message lists the ways out."""


@dataclass(frozen=True)
class ResolvedModel:
    """Where a spec's files are. ``path`` holds config.json (and the weights unless ``source`` is random)."""

    spec: str
    source: str  # real | random | tiny
    model_id: str
    path: str
    tokenizer_path: str
    revision: str | None
    how: str  # built | shipped config | local path | modelscope cache | modelscope download | directory

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> ResolvedModel:
        with open(path, encoding="utf-8") as fh:
            return cls(**json.load(fh))


def model_slug(spec: str) -> str:
    """File-name form of a spec: ``random:Qwen/Qwen2.5-7B-Instruct`` -> ``random_Qwen__Qwen2.5-7B-Instruct``."""
    slug = spec.strip().replace(RANDOM_PREFIX, "random_", 1) if spec.startswith(RANDOM_PREFIX) else spec.strip()
    slug = slug.replace("/", "__")
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", slug).strip("._") or "model"
    return slug


def is_directory_spec(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or (os.sep in spec and Path(spec).is_dir()
                                                         and not MODEL_ID.match(spec))


def spec_kind(spec: str) -> str:
    """``tiny``, ``random``, ``directory`` or ``modelscope``; a malformed spec raises :class:`ModelSpecError`."""
    if spec == TINY:
        return "tiny"
    if spec.startswith(RANDOM_PREFIX):
        model_id = spec[len(RANDOM_PREFIX):]
        if not MODEL_ID.match(model_id):
            raise ModelSpecError(
                f"model spec {spec!r}: expected random:<org>/<name>, e.g. random:Qwen/Qwen2.5-7B-Instruct")
        return "random"
    if is_directory_spec(spec):
        return "directory"
    if MODEL_ID.match(spec):
        return "modelscope"
    raise ModelSpecError(
        f"model spec {spec!r} is not one of: tiny, a modelscope id (<org>/<name>), random:<org>/<name>, "
        "or a directory path (absolute, ./ or ~)"
    )


def spec_model_id(spec: str) -> str:
    """The model id a spec refers to (``random:Qwen/X`` and ``Qwen/X`` both refer to ``Qwen/X``)."""
    return spec[len(RANDOM_PREFIX):] if spec.startswith(RANDOM_PREFIX) else spec


def models_by_slug(specs: list[str]) -> dict[str, str]:
    """``llm.models`` keyed by file name; a malformed spec or two specs with one file name fail here."""
    found: dict[str, str] = {}
    for spec in specs:
        spec_kind(spec)
        slug = model_slug(spec)
        if slug in found:
            raise ModelSpecError(f"llm.models: {spec!r} and {found[slug]!r} share the file name {slug!r}")
        found[slug] = spec
    return found


def needs_tiny(spec: str) -> bool:
    """The tiny model directory serves ``tiny`` itself and is the fallback tokenizer of random weights."""
    return spec_kind(spec) in ("tiny", "random")


def runs_on_cpu(spec: str, models: Sequence[str], tiny_device: str, local_gpu_run: bool) -> bool:
    """Whether ``spec``'s job measures the host CPU, beside the device jobs, in a local run on a GPU machine.

    Only the tiny model, with ``llm.tiny_device: cpu``, or ``auto`` when another model is configured: that one
    then runs every device path, and the tiny model's ~3 minutes of compiles, autotuning and cuDNN plans on the
    H100 (about a sixth of the run) bought nothing it does not. On a cluster each job has its own node, so
    nothing runs beside; on a machine without a GPU everything measures the CPU anyway.
    """
    if not local_gpu_run or spec_kind(spec) != "tiny" or tiny_device == "device":
        return False
    return tiny_device == "cpu" or any(spec_kind(m) != "tiny" for m in models)


def download_settings(spec: str, llm_config: Mapping[str, Any]) -> dict[str, Any]:
    """Only this spec's download settings (another model's revision must not refetch this one)."""
    model_id = spec_model_id(spec)
    return {
        "cache_dir": llm_config.get("cache_dir", ".cache/modelscope"),
        "local_paths": {k: v for k, v in (llm_config.get("local_paths") or {}).items() if k == model_id},
        "revisions": {k: v for k, v in (llm_config.get("revisions") or {}).items() if k == model_id},
    }


def shipped_config_dir(model_id: str) -> Path | None:
    path = SHIPPED_CONFIGS / model_slug(model_id)
    return path if (path / "config.json").is_file() else None


def shipped_models() -> list[str]:
    return sorted(p.name.replace("__", "/", 1) for p in SHIPPED_CONFIGS.iterdir() if (p / "config.json").is_file())


def _alternatives(model_id: str, cache_dir: Path) -> str:
    lines = [
        f"  - point llm.local_paths at a directory that holds it: {{{model_id!r}: /path/to/model}}",
        f"  - download it where modelscope.cn is reachable into {cache_dir} (the cache is reused when present)",
    ]
    if shipped_config_dir(model_id):
        lines.append(f"  - use random:{model_id}: its real architecture with random weights (speed and memory only)")
    lines.append("  - use tiny: the small Qwen2-architecture model the workflow builds itself")
    return "\n".join(lines)


def _directories(root: Path) -> set[Path]:
    """Every directory from ``root`` down (and ``root`` itself) that exists now."""
    if not root.is_dir():
        return set()
    found = {root}
    for parent, dirs, _files in os.walk(root):
        found.update(Path(parent) / d for d in dirs)
    return found


def _remove_new_empty_dirs(root: Path, before: set[Path]) -> list[Path]:
    """Remove directories created since ``before`` that are empty, deepest first; return them."""
    removed = []
    for path in sorted(_directories(root) - before, key=lambda p: len(p.parts), reverse=True):
        try:
            path.rmdir()
            removed.append(path)
        except OSError:  # not empty: a partial download modelscope can resume, kept and reported
            pass
    return removed


def modelscope_snapshot(model_id: str, revision: str | None, cache_dir: str | Path, *, download: bool = True
                        ) -> tuple[Path, str]:
    """The local snapshot of a modelscope repository: from the cache when present, else downloaded.

    modelscope has no offline switch: ``local_files_only=True`` is the only way to ask the cache alone,
    and it answers instantly. Without network a download fails after ~20 s of retries and leaves empty
    snapshot folders behind; those are removed and the error names the model, the cache and the
    alternatives.
    """
    from modelscope import snapshot_download  # only real models need modelscope

    cache = Path(cache_dir).expanduser().resolve()
    try:
        path = snapshot_download(model_id, revision=revision, cache_dir=str(cache), local_files_only=True)
        return Path(path), "modelscope cache"
    except Exception as exc:  # modelscope's "not cached" errors differ between versions
        log.info("%s (revision %s) is not in the modelscope cache %s: %s", model_id, revision or "default",
                 cache, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        if not download:
            raise ModelUnavailableError(
                f"{model_id} (revision {revision or 'default'}) is not in the modelscope cache {cache}; ways out:\n"
                + _alternatives(model_id, cache)) from exc
    # The download may create the cache itself and missing parents: only what it creates is cleaned up.
    root = cache
    while not root.exists() and not root.parent.exists():
        root = root.parent
    before = _directories(root)
    started = time.monotonic()
    try:
        path = snapshot_download(model_id, revision=revision, cache_dir=str(cache))
    except Exception as exc:
        removed = _remove_new_empty_dirs(root, before) if root.exists() else []
        leftover = sorted(_directories(root) - before - set(removed))
        kept = f"\npartial files kept for resuming: {leftover[-1]}" if leftover else ""
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelUnavailableError(
            f"could not download {model_id} (revision {revision or 'default'}) from modelscope into {cache} "
            f"after {time.monotonic() - started:.0f} s: {type(exc).__name__}: {first}{kept}\nways out:\n"
            + _alternatives(model_id, cache)) from exc
    return Path(path), "modelscope download"


def _require_config(path: Path, what: str) -> Path:
    if not (path / "config.json").is_file():
        raise ModelUnavailableError(f"{what}: {path} has no config.json (expected a transformers model directory)")
    return path


def resolve_model(spec: str, llm_config: Mapping[str, Any], *, tiny_dir: str | Path | None = None,
                  download: bool = True) -> ResolvedModel:
    """Where the files of ``spec`` are, fetching a real model if needed (see the module docstring).

    ``tiny_dir`` is the output of rule ``llm_tiny_build``: the tiny model itself, and the tokenizer of
    ``random:`` models whose real tokenizer is not on disk.
    """
    kind = spec_kind(spec)
    cache_dir = Path(llm_config.get("cache_dir", ".cache/modelscope")).expanduser().resolve()
    local_paths = dict(llm_config.get("local_paths") or {})
    revisions = dict(llm_config.get("revisions") or {})
    if kind == "tiny":
        if tiny_dir is None:
            raise ModelSpecError("model tiny needs the directory built by rule llm_tiny_build")
        path = _require_config(Path(tiny_dir), "tiny model")
        return ResolvedModel(spec, "tiny", TINY, str(path), str(path), None, "built")
    if kind == "random":
        model_id = spec[len(RANDOM_PREFIX):]
        config_dir = shipped_config_dir(model_id)
        if config_dir is None:
            raise ModelSpecError(f"{spec}: no config.json is shipped for {model_id} (shipped: "
                                 f"{', '.join(shipped_models()) or 'none'}); add one under {SHIPPED_CONFIGS}")
        tokenizer = _local_tokenizer(model_id, local_paths, revisions, cache_dir)
        if tokenizer is None:
            if tiny_dir is None:
                raise ModelSpecError(f"{spec}: no tokenizer of {model_id} on disk and no tiny model to borrow one from")
            tokenizer = Path(tiny_dir)
        return ResolvedModel(spec, "random", model_id, str(config_dir), str(tokenizer), None, "shipped config")
    if kind == "directory":
        path = _require_config(Path(spec).expanduser().resolve(), f"model directory {spec}")
        return ResolvedModel(spec, "real", path.name, str(path), str(path), None, "directory")
    revision = revisions.get(spec)
    if spec in local_paths:
        path = _require_config(Path(local_paths[spec]).expanduser().resolve(), f"llm.local_paths[{spec!r}]")
        return ResolvedModel(spec, "real", spec, str(path), str(path), revision, "local path")
    path, how = modelscope_snapshot(spec, revision, cache_dir, download=download)
    _require_config(path, f"modelscope snapshot of {spec}")
    return ResolvedModel(spec, "real", spec, str(path), str(path), revision, how)


def _local_tokenizer(model_id: str, local_paths: Mapping[str, str], revisions: Mapping[str, str],
                     cache_dir: Path) -> Path | None:
    """The real model's directory when it is already on disk (its tokenizer then serves random weights)."""
    if model_id in local_paths:
        path = Path(local_paths[model_id]).expanduser()
        return path if (path / "tokenizer_config.json").is_file() else None
    try:
        path, _ = modelscope_snapshot(model_id, revisions.get(model_id), cache_dir, download=False)
    except (ModelUnavailableError, ImportError):
        return None
    return path if (path / "tokenizer_config.json").is_file() else None


@dataclass
class LoadedModel:
    resolved: ResolvedModel
    model: Any  # transformers PreTrainedModel
    tokenizer: Any
    load_s: float
    weight_bytes: int
    dtype: str

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def _dtype_kwarg() -> str:
    """transformers renamed ``torch_dtype`` to ``dtype`` in 4.56; both machines run 5.x, older still load."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def import_transformers() -> None:
    """Import transformers' model classes: seconds of every LLM job on an H100 host (``python -X importtime``:
    ``transformers.models.auto.auto_factory``), none of it on the device, so a job does it before it claims the
    device (gpulab.core.device) and another job's measurements run meanwhile."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: F401


def load_model(resolved: ResolvedModel, device: str, dtype: str = "bf16", seed: int = 0) -> LoadedModel:
    """Tokenizer and weights of a resolved spec, on ``device``, timed like the study (load only).

    Random weights are created on the device directly in ``dtype`` (an fp32 init of a 7B model would
    need 28 GiB): the default device and dtype are set while the modules are built, so every parameter
    is allocated and initialised there.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from gpulab.core.device import synchronize
    from gpulab.core.dtypes import ITEMSIZE, torch_dtype

    tdtype = torch_dtype(dtype)
    # each preparation step logged, so a job's log shows its startup (import_transformers says what the import
    # above costs where it is the first)
    log.info("transformers imported; loading the tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_path)
    log.info("tokenizer loaded; starting the device")
    synchronize()
    log.info("device ready; loading the weights")
    start = time.perf_counter()
    if resolved.source == "random":
        config = AutoConfig.from_pretrained(resolved.path)
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **{_dtype_kwarg(): tdtype})
        generation = Path(resolved.path) / "generation_config.json"
        if generation.is_file():
            model.generation_config = GenerationConfig.from_pretrained(resolved.path)
    else:
        model = AutoModelForCausalLM.from_pretrained(resolved.path, device_map=device, **{_dtype_kwarg(): tdtype})
    model.eval()
    synchronize()
    load_s = time.perf_counter() - start
    wrong = sorted({str(p.dtype) for p in model.parameters() if p.dtype != tdtype})
    if wrong:
        raise RuntimeError(f"{resolved.spec}: parameters loaded as {wrong}, expected {tdtype}")
    weight_bytes = sum(p.numel() for p in model.parameters()) * ITEMSIZE[dtype]
    return LoadedModel(resolved, model, tokenizer, load_s, weight_bytes, dtype)
