"""Images for vision-language policies: read and check them, keep one copy of each, turn them into model inputs.

Design decisions:
- An image is read once, where a task (or an endpoint request) brings it, checked (a readable image, at most
  ``MAX_IMAGE_PIXELS`` pixels before it is decoded, RGB after), and kept as PNG in a content-addressed
  ``ImageStore`` (``<run>/images/ab/abcdef....png``). Everything downstream holds its *reference*: the
  hex sha256 of the PNG's bytes. The samples of a group share one file and one reference, experiences stay
  small in every storage (queue, SQLite, JSONL) and across processes, and the trainer reads the same bytes
  the rollout engine saw.
- The model folder's own image processor (``preprocessor_config.json``) resizes and patches an image;
  ``VisionProcessor`` adds what a chat needs around it: an image part of a message is rendered by the chat
  template as one image placeholder token, which is expanded to as many placeholders as the processor gives
  the image visual tokens (Qwen2-VL: ``t * h * w / merge_size**2``), so the prompt's token ids are exactly the
  ones the model consumes and the trainer sees.
- ``PromptImages`` is what a prompt brings to the engine: the references and the processed
  ``pixel_values`` / ``image_grid_thw``. ``RowMedia`` (``types.py``) is the same for a training batch's rows;
  ``VisionProcessor.row_media`` builds it from experiences' references (cached per reference).

Left out: video inputs, and architectures other than Qwen2-VL's ``image_grid_thw`` family (Qwen2-VL,
Qwen2.5-VL): their processors take other arguments.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from PIL import Image as PILImage

    from trivium.types import RowMedia

__all__ = [
    "MAX_IMAGE_BYTES",
    "MAX_IMAGE_PIXELS",
    "ImageError",
    "ImageStore",
    "PromptImages",
    "VisionProcessor",
    "data_url",
    "is_vision_config",
    "load_image",
]

MAX_IMAGE_PIXELS = 40_000_000  # width * height read from the header; a 1 GB bitmap is refused undecoded
MAX_IMAGE_BYTES = 32 * 1024 * 1024  # an encoded image (file, bytes or data URL) larger than this is refused


class ImageError(ValueError):
    """An image that cannot be used: the message names where it came from and what to do."""


def is_vision_config(config: Any) -> bool:
    """A transformers config of a vision-language model (it has a ``vision_config``)."""
    return getattr(config, "vision_config", None) is not None


def data_url(image: PILImage.Image | bytes) -> str:
    """A ``data:image/png;base64,...`` URL of a PIL image (saved as an optimised PNG) or of PNG bytes: how
    an image goes into a JSON row."""
    if not isinstance(image, bytes):
        out = io.BytesIO()
        image.save(out, format="PNG", optimize=True)
        image = out.getvalue()
    return "data:image/png;base64," + base64.b64encode(image).decode()


def load_image(value: Any, where: str, base_dir: str | Path | None = None) -> PILImage.Image:
    """An RGB ``PIL.Image`` from a path (relative to ``base_dir``), encoded bytes, a ``data:image/...;base64``
    URL, an ``[H, W]`` / ``[H, W, 3|4]`` uint8 array (numpy or nested lists) or a PIL image.

    Checked before anything large is decoded: at most ``MAX_IMAGE_BYTES`` encoded, ``MAX_IMAGE_PIXELS``
    pixels by the header; a truncated or non-image file, a wrong mode or an array of another shape raises
    ``ImageError`` naming ``where`` (e.g. "train.jsonl row 17, field 'image'")."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return _checked(value, where)
    if isinstance(value, (bytes, bytearray)):
        return _decode(bytes(value), where)
    if isinstance(value, str):
        if value.startswith("data:"):
            return _decode(_data_url_bytes(value, where), where)
        if value.startswith(("http://", "https://")):
            raise ImageError(
                f"{where}: {value[:80]!r} is a remote URL; images are read from files, bytes or data URLs "
                "(download it into the task set's folder and give its path)"
            )
        path = Path(value).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        try:
            size = path.stat().st_size
        except OSError as error:
            raise ImageError(
                f"{where}: cannot read the image file {str(path)!r} ({error.strerror})"
            ) from None
        if size > MAX_IMAGE_BYTES:
            raise ImageError(
                f"{where}: the image file {str(path)!r} has {size} bytes, over the {MAX_IMAGE_BYTES} allowed"
            )
        return _decode(path.read_bytes(), f"{where} ({path.name})")
    return _from_array(value, where)


def _data_url_bytes(url: str, where: str) -> bytes:
    head, _, payload = url.partition(",")
    if not head.startswith("data:image/") or not head.endswith(";base64"):
        raise ImageError(f"{where}: a data URL must look like data:image/png;base64,..., got {head[:40]!r}")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ImageError(f"{where}: the data URL holds more than {MAX_IMAGE_BYTES} bytes of image")
    try:
        return base64.b64decode(payload, validate=True)
    except ValueError:
        raise ImageError(f"{where}: the data URL's payload is not valid base64") from None


def _decode(data: bytes, where: str) -> PILImage.Image:
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise ImageError(f"{where}: the image has {len(data)} bytes, over the {MAX_IMAGE_BYTES} allowed")
    try:
        with Image.open(io.BytesIO(data)) as probe:  # reads the header only
            width, height = probe.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageError(
                    f"{where}: the image is {width}x{height} pixels, over the {MAX_IMAGE_PIXELS} allowed; "
                    "resize it before training on it"
                )
            probe.load()  # a truncated file fails here
            return _checked(probe.copy(), where)
    except ImageError:
        raise
    except Image.DecompressionBombError as error:  # PIL's own limit, past ours: the header is absurd
        raise ImageError(
            f"{where}: the image is too large ({error}); at most {MAX_IMAGE_PIXELS} pixels"
        ) from None
    except UnidentifiedImageError:
        raise ImageError(
            f"{where}: the data is not an image PIL can read (png, jpeg, gif, webp, bmp, ...)"
        ) from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ImageError(f"{where}: the image is damaged or truncated ({error})") from None


def _from_array(value: Any, where: str) -> PILImage.Image:
    import numpy as np
    from PIL import Image

    try:
        array = np.asarray(value)
    except Exception:
        array = None
    if (
        array is None
        or array.dtype == object
        or array.ndim not in (2, 3)
        or (array.ndim == 3 and array.shape[2] not in (3, 4))
    ):
        raise ImageError(
            f"{where}: an image is a path, encoded bytes, a data URL or an [H, W] / [H, W, 3|4] uint8 array; got "
            f"{type(value).__name__}" + ("" if array is None else f" of shape {array.shape}")
        )
    if array.shape[0] * array.shape[1] > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"{where}: the array image has {array.shape[0] * array.shape[1]} pixels, over {MAX_IMAGE_PIXELS}"
        )
    if array.dtype != np.uint8:
        if not np.issubdtype(array.dtype, np.number) or (
            array.size and (array.min() < 0 or array.max() > 255)
        ):
            raise ImageError(f"{where}: array images hold uint8 values 0-255, got {array.dtype}")
        array = array.astype(np.uint8)
    return _checked(Image.fromarray(array), where)


def _checked(image: PILImage.Image, where: str) -> PILImage.Image:
    from PIL import Image

    width, height = image.size
    if width < 1 or height < 1:
        raise ImageError(f"{where}: the image is empty ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ImageError(
            f"{where}: the image is {width}x{height} pixels, over the {MAX_IMAGE_PIXELS} allowed"
        )
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "P", "PA"):  # transparency over white, as viewers show it
        rgba = image.convert("RGBA")
        canvas = Image.new("RGB", rgba.size, (255, 255, 255))
        canvas.paste(rgba, mask=rgba.getchannel("A"))
        return canvas
    try:
        return image.convert("RGB")
    except (ValueError, OSError) as error:
        raise ImageError(
            f"{where}: an image of mode {image.mode!r} cannot be converted to RGB ({error})"
        ) from None


class ImageStore:
    """Content-addressed PNG files under ``root``: ``put`` an image, get its reference (hex sha256 of the PNG
    bytes); ``get`` it back. Writes are atomic (temporary file, then rename), so concurrent writers of one
    image are harmless."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, ref: str) -> Path:
        if len(ref) != 64 or any(c not in "0123456789abcdef" for c in ref):
            raise ImageError(f"{ref[:80]!r} is not an image reference (64 hex digits of a sha256)")
        return self.root / ref[:2] / f"{ref}.png"

    def put(self, image: PILImage.Image) -> str:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        data = buffer.getvalue()
        ref = hashlib.sha256(data).hexdigest()
        path = self.path(ref)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{ref}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return ref

    def get(self, ref: str) -> PILImage.Image:
        path = self.path(ref)
        if not path.exists():
            raise ImageError(
                f"image {ref[:12]}... is not in the image store {str(self.root)!r}: experiences refer to images "
                "kept in the run folder's images/; a run resumed or trained elsewhere needs that folder too"
            )
        return _decode(path.read_bytes(), f"image store {ref[:12]}...")

    def count(self) -> int:
        return sum(1 for _ in self.root.glob("??/*.png")) if self.root.exists() else 0


@dataclass(frozen=True, eq=False)
class PromptImages:
    """The images of one prompt as the model consumes them, in the order of their placeholders."""

    refs: tuple[str, ...]  # ImageStore references
    pixel_values: torch.Tensor  # [patches, patch_dim] float32
    image_grid_thw: torch.Tensor  # [images, 3] int64


class VisionProcessor:
    """A model folder's image processor, its image placeholder token and an ``ImageStore``.

    ``prompt_ids`` renders a chat whose messages hold image parts and expands each placeholder;
    ``prompt_images`` turns references into engine inputs; ``row_media`` turns a batch's rows' references
    into trainer inputs. Processed images are cached by reference (``cache_size`` of them)."""

    def __init__(self, image_processor: Any, config: Any, store: ImageStore, cache_size: int = 512):
        self.image_processor = image_processor
        self.store = store
        self.image_token_id = int(config.image_token_id)
        self.merge_size = int(getattr(config.vision_config, "spatial_merge_size", 1))
        self.cache_size = cache_size
        self._cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, path: str | Path, store: ImageStore) -> VisionProcessor:
        from transformers import AutoConfig, AutoImageProcessor

        config = AutoConfig.from_pretrained(str(path))
        if not is_vision_config(config):
            raise ImageError(f"the model at {str(path)!r} is not a vision-language model (no vision_config)")
        try:
            processor = AutoImageProcessor.from_pretrained(str(path), backend="pil")
        except (OSError, TypeError, ValueError):
            processor = AutoImageProcessor.from_pretrained(str(path))
        return cls(processor, config, store)

    # -------------------------------------------------------------------------------------------- images
    def put(self, images: Sequence[Any], where: str, base_dir: str | Path | None = None) -> tuple[str, ...]:
        """Check and store ``images`` (anything ``load_image`` reads); their references, in order."""
        return tuple(
            self.store.put(load_image(image, f"{where}[{i}]" if len(images) > 1 else where, base_dir))
            for i, image in enumerate(images)
        )

    def pixels(self, ref: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(pixel_values [patches, D], image_grid_thw [1, 3])`` of one stored image (cached)."""
        with self._lock:
            hit = self._cache.get(ref)
            if hit is not None:
                self._cache.move_to_end(ref)
                return hit
        out = self.image_processor(images=[self.store.get(ref)], return_tensors="pt")
        value = (out["pixel_values"].float(), out["image_grid_thw"].long())
        with self._lock:
            self._cache[ref] = value
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return value

    def visual_tokens(self, grid_thw: torch.Tensor) -> int:
        return int(grid_thw.prod()) // (self.merge_size**2)

    def prompt_images(self, refs: Sequence[str]) -> PromptImages:
        parts = [self.pixels(ref) for ref in refs]
        return PromptImages(
            refs=tuple(refs),
            pixel_values=torch.cat([p for p, _ in parts]) if parts else torch.zeros(0, 0),
            image_grid_thw=torch.cat([g for _, g in parts]) if parts else torch.zeros(0, 3, dtype=torch.long),
        )

    def expand(self, ids: Sequence[int], refs: Sequence[str]) -> list[int]:
        """``ids`` with its k-th image placeholder repeated as many times as image k has visual tokens."""
        places = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(places) != len(refs):
            raise ImageError(
                f"the rendered prompt has {len(places)} image placeholder(s) for {len(refs)} image(s): every image "
                "goes in a message as a part {'type': 'image'}, and the chat template renders each part once"
            )
        out: list[int] = []
        start = 0
        for place, ref in zip(places, refs):
            out.extend(ids[start:place])
            out.extend([self.image_token_id] * self.visual_tokens(self.pixels(ref)[1]))
            start = place + 1
        out.extend(ids[start:])
        return out

    def row_media(self, rows: Sequence[Sequence[str]]) -> RowMedia:
        """Trainer inputs for rows whose images are ``rows[r]`` (references, in placeholder order)."""
        from trivium.types import RowMedia

        parts = [self.pixels(ref) for refs in rows for ref in refs]
        return RowMedia(
            pixel_values=torch.cat([p for p, _ in parts]) if parts else torch.zeros(0, 0),
            image_grid_thw=torch.cat([g for _, g in parts]) if parts else torch.zeros(0, 3, dtype=torch.long),
            row_images=torch.tensor([len(refs) for refs in rows], dtype=torch.long),
            image_token_id=self.image_token_id,
        )


def max_image_tokens(image_processor: Any) -> int:
    """Visual tokens of the largest image ``image_processor`` makes (its ``max_pixels``): what sizing
    assumes of every image."""
    size = getattr(image_processor, "size", None) or {}
    pixels = size.get("longest_edge") or getattr(image_processor, "max_pixels", None) or 12544
    patch = int(getattr(image_processor, "patch_size", 14))
    merge = int(getattr(image_processor, "merge_size", 2))
    return max(1, int(pixels) // (patch * patch * merge * merge))


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop gradients to ``model``'s vision tower (Qwen2-VL's ``visual``, the merger included); returns how
    many parameters were frozen. A model without one is an error naming the fix."""
    inner = getattr(model, "model", model)
    tower = getattr(inner, "visual", None) or getattr(model, "visual", None)
    if tower is None:
        raise ImageError(
            f"model.freeze_vision: {type(model).__name__} has no vision tower; set model.freeze_vision: false "
            "for a text model"
        )
    frozen = 0
    for p in tower.parameters():
        if p.requires_grad:
            p.requires_grad_(False)
            frozen += p.numel()
    return frozen
