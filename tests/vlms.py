"""Tiny vision-language models built from their config classes (tiny text and vision towers, nothing downloaded),
with their own processors: a word-level tokenizer made with ``tokenizers``, the family's image processor built
with its defaults (sized for tiny images) and the family's processor class, which expands each image token to the
count its model expects. Images are made with numpy.

The image processors need Pillow (transformers' PIL backends; torchvision is not needed). Where Pillow is missing,
:func:`family_batch` builds the batch as the processor does: the same processor class with a stand-in image
processor (:class:`StandInImageProcessor`) that gives the same keys, shapes and dtypes, so the text (the image
tokens expanded to the right count) is still the processor's own. ``tests/test_zoo_vlm.py`` checks that the
two agree where Pillow is installed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

WORDS = ["describe", "the", "image", "a", "photo", "of", "cat", "dog", "is", "on", "mat", "red", "blue", "what"]
HAS_PILLOW = importlib.util.find_spec("PIL") is not None


def tiny_tokenizer(specials: list[str], attributes: dict[str, str] | None = None) -> Any:
    """A word-level fast tokenizer over :data:`WORDS` and the family's special tokens (made, not downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(["<pad>", "<unk>", "<eos>", *specials, *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>",
        extra_special_tokens=attributes or {},
    )


def images(count: int, size: int, seed: int = 0) -> list[Any]:
    """``count`` RGB images of ``size`` x ``size`` pixels made with numpy (PIL images where Pillow is installed)."""
    generator = np.random.default_rng(seed)
    arrays = [generator.integers(0, 255, (size, size, 3), dtype=np.uint8) for _ in range(count)]
    if HAS_PILLOW:
        from PIL import Image

        return [Image.fromarray(array) for array in arrays]
    return arrays


@dataclasses.dataclass
class Family:
    """One family: its model built from a config, its processor, its prompts (one image each) and image size."""

    name: str
    model: Callable[[Any], nn.Module]
    processor: Callable[[bool], Any]
    prompt: str
    image_size: int

    def batch(self, rows: int = 2, *, real: bool = HAS_PILLOW) -> dict[str, torch.Tensor]:
        """A training batch of ``rows`` texts with one image each, made by the family's processor (labels are the
        input ids, padding ignored)."""
        processor = self.processor(real)
        if not HAS_PILLOW:
            _image_utils_without_pillow()
        texts = [f"{self.prompt} a photo of a {word}" for word in ("cat", "dog", "mat", "red")[:rows]]
        if rows > 1:
            texts[0] += " on the mat"  # padding: the rows differ in length
        made = processor(text=texts, images=[[image] for image in images(rows, self.image_size)],
                         return_tensors="pt", padding=True)
        batch = {key: value for key, value in made.items() if isinstance(value, torch.Tensor)}
        labels = batch["input_ids"].clone()
        labels[batch["attention_mask"] == 0] = -100
        batch["labels"] = labels
        return batch

    def build(self) -> tuple[nn.Module, Any]:
        """The model (seeded, eval-free: dropout off in its config) and its processor."""
        processor = self.processor(HAS_PILLOW)
        torch.manual_seed(0)
        return self.model(processor.tokenizer), processor


def _image_utils_without_pillow() -> None:
    """transformers' ``get_image_size`` (LLaVA's processor counts image tokens with it) tests ``isinstance(image,
    PIL.Image.Image)`` first, naming a module it imported only where Pillow is installed: without Pillow nothing is a
    PIL image, which a stand-in module says."""
    import types

    from transformers import image_utils

    if not hasattr(image_utils, "PIL"):
        image_utils.PIL = types.SimpleNamespace(Image=types.SimpleNamespace(Image=type("NoPillowImage", (), {})))


class StandInImageProcessor:
    """What a family's image processor returns for images already at its size, made with numpy where Pillow (which
    transformers' image processors need) is missing: the same keys, shapes and dtypes; pixel values normalised."""

    def __init__(self, make: Callable[[list[np.ndarray]], dict[str, Any]], **attributes: Any) -> None:
        self.make = make
        self.__dict__.update(attributes)

    def fetch_images(self, images: Any) -> Any:
        return images

    def __call__(self, images: Any = None, **_: Any) -> Any:
        from transformers import BatchFeature

        flat = [np.asarray(image, dtype=np.float32) / 127.5 - 1 for group in images for image in group]
        return BatchFeature(self.make(flat), tensor_type="pt")


def processor_of(processor_class: type, image_processor: Any, tokenizer: Any, **kwargs: Any) -> Any:
    """``processor_class(image_processor=..., tokenizer=..., **kwargs)``. Its class check is set aside for a stand-in
    image processor and for an absent video processor (whose class transformers cannot name without torchvision);
    every other part is checked as the processor checks it."""
    check = processor_class.check_argument_for_proper_class

    def lenient(self: Any, name: str, argument: Any) -> Any:
        if argument is None or isinstance(argument, StandInImageProcessor):
            return type(argument)
        return check(self, name, argument)

    processor_class.check_argument_for_proper_class = lenient
    try:
        return processor_class(image_processor=image_processor, tokenizer=tokenizer, **kwargs)
    finally:
        processor_class.check_argument_for_proper_class = check


# Qwen2-VL and Qwen2.5-VL: flattened patches (patches, 3 x 2 x 14 x 14) and one grid row (t, h, w) per image.
QWEN_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
QWEN_SIZE = 56  # 4 x 4 patches of 14 pixels: 16 patches, 4 image tokens after the 2 x 2 merge


def _qwen_processor(version: str) -> Callable[[bool], Any]:
    def make(real: bool) -> Any:
        from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor

        processor_class = Qwen2VLProcessor if version == "2" else Qwen2_5_VLProcessor
        tokenizer = tiny_tokenizer(QWEN_SPECIALS)
        if real:
            from transformers import Qwen2VLImageProcessorPil

            return processor_of(processor_class, Qwen2VLImageProcessorPil(), tokenizer, video_processor=None)

        def patches(flat: list[np.ndarray]) -> dict[str, Any]:
            grid = QWEN_SIZE // 14
            values = [np.resize(image.transpose(2, 0, 1), (grid * grid, 3 * 2 * 14 * 14)) for image in flat]
            return {"pixel_values": np.concatenate(values), "image_grid_thw": np.array([[1, grid, grid]] * len(flat))}

        return processor_of(processor_class, StandInImageProcessor(patches, merge_size=2), tokenizer,
                            video_processor=None)

    return make


def _qwen_model(version: str) -> Callable[[Any], nn.Module]:
    def make(tokenizer: Any) -> nn.Module:
        from transformers import (
            Qwen2_5_VLConfig,
            Qwen2_5_VLForConditionalGeneration,
            Qwen2VLConfig,
            Qwen2VLForConditionalGeneration,
        )

        ids = {f"{name}_token_id": tokenizer.convert_tokens_to_ids(token) for name, token in
               [("vision_start", "<|vision_start|>"), ("vision_end", "<|vision_end|>"), ("image", "<|image_pad|>"),
                ("video", "<|video_pad|>")]}
        text = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                    rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                    pad_token_id=0, bos_token_id=2, eos_token_id=2)
        if version == "2":
            vision: dict[str, Any] = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2)
            return Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision, **ids))
        vision = dict(depth=2, hidden_size=32, out_hidden_size=32, intermediate_size=64, num_heads=2,
                      fullatt_block_indexes=[1], window_size=56)
        return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids))

    return make


def qwen2_vl() -> Family:
    return Family("qwen2_vl", _qwen_model("2"), _qwen_processor("2"),
                  "<|vision_start|><|image_pad|><|vision_end|> describe the image", QWEN_SIZE)


def qwen2_5_vl() -> Family:
    return Family("qwen2_5_vl", _qwen_model("2.5"), _qwen_processor("2.5"),
                  "<|vision_start|><|image_pad|><|vision_end|> describe the image", QWEN_SIZE)


# LLaVA: a CLIP tower on 28-pixel images (2 x 2 patches of 14 pixels: 4 image tokens, the CLS feature dropped).
LLAVA_SIZE = 28


def _tiny_llama(tokenizer: Any) -> dict[str, Any]:
    return dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                bos_token_id=2, eos_token_id=2)


def _tiny_vision(**more: Any) -> dict[str, Any]:
    return dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                image_size=LLAVA_SIZE, patch_size=14, **more)


def _llava_processor(real: bool) -> Any:
    from transformers import LlavaProcessor

    tokenizer = tiny_tokenizer(["<image>"], {"image_token": "<image>"})
    kwargs = dict(patch_size=14, vision_feature_select_strategy="default", num_additional_image_tokens=1)
    if real:
        from transformers import CLIPImageProcessorPil

        image_processor = CLIPImageProcessorPil(size={"shortest_edge": LLAVA_SIZE},
                                                crop_size={"height": LLAVA_SIZE, "width": LLAVA_SIZE})
        return processor_of(LlavaProcessor, image_processor, tokenizer, **kwargs)
    stand_in = StandInImageProcessor(lambda flat: {"pixel_values": np.stack([i.transpose(2, 0, 1) for i in flat])})
    return processor_of(LlavaProcessor, stand_in, tokenizer, **kwargs)


def _llava_model(tokenizer: Any) -> nn.Module:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    config = LlavaConfig(text_config=LlamaConfig(**_tiny_llama(tokenizer)),
                         vision_config=CLIPVisionConfig(**_tiny_vision()),
                         image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=4)
    return LlavaForConditionalGeneration(config)


def llava() -> Family:
    return Family("llava", _llava_model, _llava_processor, "<image> describe the image", LLAVA_SIZE)


# Idefics3 (SmolVLM's architecture): one 28-pixel tile per image, 2 x 2 patches shuffled into 1 image token.
IDEFICS3_SPECIALS = ["<fake_token_around_image>", "<image>", "<global-img>", "<end_of_utterance>"]


def _idefics3_processor(real: bool) -> Any:
    from transformers import Idefics3Processor

    tokenizer = tiny_tokenizer(IDEFICS3_SPECIALS)
    if real:
        # From its module, not ``transformers``: transformers 5.17's lazy import table files this PIL class under
        # torchvision (as its fast sibling), so the top-level name (and AutoImageProcessor's) is a placeholder that
        # raises without torchvision; the class itself needs none (5.24 files it right: the same class either way).
        from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

        image_processor = Idefics3ImageProcessorPil(do_image_splitting=False, size={"longest_edge": LLAVA_SIZE},
                                                    max_image_size={"longest_edge": LLAVA_SIZE})
        return processor_of(Idefics3Processor, image_processor, tokenizer, image_seq_len=1)

    def tiles(flat: list[np.ndarray]) -> dict[str, Any]:
        pixels = np.stack([image.transpose(2, 0, 1) for image in flat])[:, None]
        return {"pixel_values": pixels, "pixel_attention_mask": np.ones((len(flat), 1, LLAVA_SIZE, LLAVA_SIZE),
                                                                         dtype=np.int64),
                "rows": [[0]] * len(flat), "cols": [[0]] * len(flat)}

    return processor_of(Idefics3Processor, StandInImageProcessor(tiles), tokenizer, image_seq_len=1)


def _idefics3_model(tokenizer: Any) -> nn.Module:
    from transformers import Idefics3Config, Idefics3ForConditionalGeneration, Idefics3VisionConfig, LlamaConfig

    config = Idefics3Config(text_config=LlamaConfig(**_tiny_llama(tokenizer)),
                            vision_config=Idefics3VisionConfig(**_tiny_vision()), scale_factor=2,
                            image_token_id=tokenizer.convert_tokens_to_ids("<image>"), pad_token_id=0)
    return Idefics3ForConditionalGeneration(config)


def idefics3() -> Family:
    return Family("idefics3", _idefics3_model, _idefics3_processor, "<image> describe the image", LLAVA_SIZE)


# Gemma 3: a SigLIP tower on 28-pixel images, its 2 x 2 patches pooled into 4 soft tokens between boi and eoi.
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"}


def _gemma3_processor(real: bool) -> Any:
    from transformers import Gemma3Processor

    tokenizer = tiny_tokenizer(list(GEMMA3_TOKENS.values()), GEMMA3_TOKENS)
    if real:
        from transformers import Gemma3ImageProcessorPil

        image_processor = Gemma3ImageProcessorPil(size={"height": LLAVA_SIZE, "width": LLAVA_SIZE})
        return processor_of(Gemma3Processor, image_processor, tokenizer, image_seq_length=4)

    def crops(flat: list[np.ndarray]) -> dict[str, Any]:
        return {"pixel_values": np.stack([image.transpose(2, 0, 1) for image in flat]),
                "num_crops": np.zeros(len(flat), dtype=np.int64)}

    return processor_of(Gemma3Processor, StandInImageProcessor(crops), tokenizer, image_seq_length=4)


def _gemma3_model(tokenizer: Any) -> nn.Module:
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in
           [("boi_token_index", GEMMA3_TOKENS["boi_token"]), ("eoi_token_index", GEMMA3_TOKENS["eoi_token"]),
            ("image_token_index", GEMMA3_TOKENS["image_token"])]}
    text = Gemma3TextConfig(**{**_tiny_llama(tokenizer), "head_dim": 16, "sliding_window": 16})
    config = Gemma3Config(text_config=text, vision_config=SiglipVisionConfig(**_tiny_vision()),
                          mm_tokens_per_image=4, **ids)
    return Gemma3ForConditionalGeneration(config)


def gemma3() -> Family:
    return Family("gemma3", _gemma3_model, _gemma3_processor, "<start_of_image> describe the image", LLAVA_SIZE)


FAMILIES: dict[str, Callable[[], Family]] = {
    "qwen2_vl": qwen2_vl, "qwen2_5_vl": qwen2_5_vl, "llava": llava, "idefics3": idefics3, "gemma3": gemma3,
}
