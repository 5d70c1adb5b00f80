"""Parameter shapes of published models, for the regime map (``regime_map.py``), with their compute.

- ResNet-18 and ResNet-50, ImageNet (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016,
  Table 1: basic blocks 2-2-2-2, bottlenecks 3-4-6-3; 1.8 and 3.8 billion FLOPs (multiply-adds) a 224x224 image).
- VGG-16, ImageNet (Simonyan and Zisserman, ICLR 2015, configuration D: 13 3x3 convolutions, three fully
  connected layers of 4096, 4096, 1000); 15.3 billion FLOPs (multiply-adds) an image, as He et al. 2016, sec. 4.1,
  give it.
- GPT-2 small (Radford et al. 2019: 12 layers, width 768, context 1024, vocabulary 50257, the output layer tied
  to the token embedding; 124.4 M parameters in its public checkpoint's layout). Forward multiply-adds per token
  ``N + n_layer n_ctx d_model`` with ``N`` the non-embedding parameters (Kaplan et al., "Scaling Laws for Neural
  Language Models", 2020, Table 1, which counts 2 FLOPs a multiply-add).

Training costs three forward passes (forward, and backward's two products), as Kaplan et al. count it.
"""

from __future__ import annotations

from pactrain_hvd.planner.payload import Tensor


def _conv_bn(name: str, cin: int, cout: int, k: int) -> list[Tensor]:
    return [Tensor(f"{name}.weight", (cout, cin, k, k)), Tensor(f"{name}.bn.weight", (cout,)),
            Tensor(f"{name}.bn.bias", (cout,))]


def resnet(blocks: tuple[int, ...], bottleneck: bool) -> list[Tensor]:
    tensors = _conv_bn("conv1", 3, 64, 7)
    inputs, expansion = 64, 4 if bottleneck else 1
    for stage, (width, count) in enumerate(zip((64, 128, 256, 512), blocks)):
        for block in range(count):
            name, out = f"layer{stage + 1}.{block}", width * expansion
            if bottleneck:
                tensors += (_conv_bn(f"{name}.conv1", inputs, width, 1) + _conv_bn(f"{name}.conv2", width, width, 3)
                            + _conv_bn(f"{name}.conv3", width, out, 1))
            else:
                tensors += _conv_bn(f"{name}.conv1", inputs, width, 3) + _conv_bn(f"{name}.conv2", width, width, 3)
            if block == 0 and (stage > 0 or inputs != out):
                tensors += _conv_bn(f"{name}.downsample", inputs, out, 1)
            inputs = out
    return tensors + [Tensor("fc.weight", (1000, inputs)), Tensor("fc.bias", (1000,))]


def vgg16() -> list[Tensor]:
    tensors, inputs = [], 3
    for i, width in enumerate((64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512)):
        tensors += [Tensor(f"features.{i}.weight", (width, inputs, 3, 3)), Tensor(f"features.{i}.bias", (width,))]
        inputs = width
    for i, (cin, cout) in enumerate(((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        tensors += [Tensor(f"classifier.{i}.weight", (cout, cin)), Tensor(f"classifier.{i}.bias", (cout,))]
    return tensors


def gpt2_small(layers: int = 12, width: int = 768, context: int = 1024, vocabulary: int = 50257) -> list[Tensor]:
    tensors = [Tensor("wte", (vocabulary, width)), Tensor("wpe", (context, width))]
    for i in range(layers):
        h = f"h.{i}"
        tensors += [Tensor(f"{h}.ln_1.weight", (width,)), Tensor(f"{h}.ln_1.bias", (width,)),
                    Tensor(f"{h}.attn.c_attn.weight", (width, 3 * width)), Tensor(f"{h}.attn.c_attn.bias", (3 * width,)),
                    Tensor(f"{h}.attn.c_proj.weight", (width, width)), Tensor(f"{h}.attn.c_proj.bias", (width,)),
                    Tensor(f"{h}.ln_2.weight", (width,)), Tensor(f"{h}.ln_2.bias", (width,)),
                    Tensor(f"{h}.mlp.c_fc.weight", (width, 4 * width)), Tensor(f"{h}.mlp.c_fc.bias", (4 * width,)),
                    Tensor(f"{h}.mlp.c_proj.weight", (4 * width, width)), Tensor(f"{h}.mlp.c_proj.bias", (width,))]
    return tensors + [Tensor("ln_f.weight", (width,)), Tensor("ln_f.bias", (width,))]


def gpt2_forward_macs_per_sample(layers: int = 12, width: int = 768, context: int = 1024) -> float:
    non_embedding = 12 * layers * width * width  # Kaplan et al. 2020: N = 12 n_layer d_model^2
    return (non_embedding + layers * context * width) * context


# name -> (tensors, forward multiply-adds per sample, per-worker batch, what a sample is)
MODELS = {
    "resnet18": (lambda: resnet((2, 2, 2, 2), False), 1.8e9, 128, "224x224 image"),
    "resnet50": (lambda: resnet((3, 4, 6, 3), True), 3.8e9, 64, "224x224 image"),
    "vgg16": (vgg16, 15.3e9, 64, "224x224 image"),
    "gpt2-small": (gpt2_small, gpt2_forward_macs_per_sample(), 8, "sequence of 1024 tokens"),
}
