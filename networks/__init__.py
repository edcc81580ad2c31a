"""The encoders (our ResNets with a CIFAR or ImageNet stem, timm's models by name) and the heads SupContrast puts on
them."""
from .resnet_big import (
    MODELS,
    STEMS,
    EncoderClassifier,
    LinearClassifier,
    SupCEResNet,
    SupConResNet,
    build_encoder,
    is_model_name,
    parse_model_args,
    timm_problem,
    timm_sizes,
)

__all__ = ['MODELS', 'STEMS', 'EncoderClassifier', 'LinearClassifier', 'SupCEResNet', 'SupConResNet', 'build_encoder',
           'is_model_name', 'parse_model_args', 'timm_problem',
           'timm_sizes']
